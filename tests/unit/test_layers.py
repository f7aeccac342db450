"""What the import contracts (``lint-imports``, pyproject.toml) cannot say: no module takes a
private helper of another, and a value both sides of a layer boundary keep stays one value."""

from __future__ import annotations

import ast
from pathlib import Path

from inturn.worker.spec import config
from inturn.worker.store import registry

WORKER = Path(__file__).resolve().parents[2] / "worker"


def test_no_module_imports_a_private_name_of_another() -> None:
    found = []
    for path in sorted(WORKER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inturn."):
                found += [
                    f"{path.relative_to(WORKER)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    assert found == []


def test_the_store_keeps_the_api_default_stuck_threshold() -> None:
    # The store imports nothing of the Destination API above it, so it names the default itself.
    assert registry.DEFAULT_STUCK_AFTER_SECONDS == config.DEFAULT_STUCK_AFTER_SECONDS == 900


def test_only_the_store_executes_statements() -> None:
    # The import contract "Only the store runs SQL" keeps store.queries in the store; this
    # catches a statement run directly on a connection or cursor, or composed with psycopg.sql.
    found = []
    for path in sorted(WORKER.rglob("*.py")):
        where = path.relative_to(WORKER)
        if where.parts[0] == "store" or where.name == "testing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany", "cursor", "copy")
            ):
                found.append(f"{where}:{node.lineno}: .{node.func.attr}()")
            if isinstance(node, ast.ImportFrom) and node.module == "psycopg":
                found += [f"{where}: psycopg.sql" for a in node.names if a.name == "sql"]
            if isinstance(node, ast.ImportFrom) and node.module == "psycopg.sql":
                found.append(f"{where}: psycopg.sql")
            if isinstance(node, ast.ImportFrom) and node.module == "inturn.worker.store.queries":
                found.append(f"{where}: store.queries")  # a new package the contract misses
    assert found == []


def test_no_pipeline_is_synced_by_hand() -> None:
    # psycopg's AsyncPipeline.sync() waits for answers after one flush, with part of a large
    # batch still in the client (a sealed batch of 2.4 MB hung), and the block's end sends a
    # Sync of its own after it (one round trip more). The end of `async with conn.pipeline()`
    # sends everything first, syncs and reads every result: the store's pipelines end so.
    found = []
    for root in (WORKER, WORKER.parent / "operator"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "sync"
                ):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: .sync()")
    assert found == []


def test_loggers_are_named_after_their_folder() -> None:
    # inturn.<folder>[.<what>]: a log line says which layer wrote it (drain, ingest, store...);
    # the console's modules log as inturn.console, its command as inturn.cli.console.
    found = []
    for path in sorted(WORKER.rglob("*.py")):
        where = path.relative_to(WORKER)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("inturn")
            ):
                parts = str(node.args[0].value).split(".")
                if len(where.parts) < 2 or parts[:2] != ["inturn", where.parts[0]]:
                    found.append(f"{where}: {node.args[0].value}")
    assert found == []
