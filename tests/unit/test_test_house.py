"""The test house's layout (issue 32, item 5): what two test modules share lives in the
``tests.support`` package (fixtures in a ``conftest.py``), never in a test module another one
imports, nor in a helper module lying beside the tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, nested ones (in a function) included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_no_test_module_or_benchmark_imports_a_test_module() -> None:
    files = [*TESTS.rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.split(".")[-1].startswith("test_") or module == "conftest"
    ]
    assert offenders == []


def test_every_helper_module_is_in_the_support_package() -> None:
    stray = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("*.py")
        if p.name != "conftest.py"
        and not p.name.startswith("test_")
        and TESTS / "support" not in p.parents
    ]
    assert stray == []


def test_the_check_sees_a_nested_import(tmp_path: Path) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text("def test_x() -> None:\n    from test_other import helper\n")
    assert imported_modules(module) == [(2, "test_other")]
