"""The store raises the error tree's classes (:mod:`inturn.worker.errors`), never a bare
``ValueError``: a caller tells "can never be right" (``Invalid``) from "not in this state"
(``Conflict``) by class, and a front end answers each the same way whoever called."""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "worker" / "store"


def test_the_store_raises_no_bare_value_error() -> None:
    found = []
    for path in sorted(STORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                called = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(called, ast.Name) and called.id == "ValueError":
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []
