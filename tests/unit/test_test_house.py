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


def unprepared_pooler_connections(path: Path) -> list[int]:
    """Lines of ``connect(...)`` calls in ``path`` whose first argument names a pooler's DSN
    (``pooled``, ``bouncer.dsn(...)``) without ``prepare_threshold``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name != "connect":
            continue
        first = ast.unparse(node.args[0])
        if first != "pooled" and not first.startswith("bouncer.dsn("):
            continue
        if not any(k.arg == "prepare_threshold" for k in node.keywords):
            lines.append(node.lineno)
    return lines


def test_every_connection_through_a_pooler_prepares_nothing() -> None:
    """psycopg prepares a statement on the server after its fifth run; PgBouncer 1.18 in
    transaction mode may run the next one on another backend, where it does not exist
    (``prepared statement "_pg3_0" does not exist``: a test of the pooler failed so, now and
    then, when its own connection enqueued 60 rows). Every test connection to a pooler passes
    ``prepare_threshold=None``, as the product's pooled connections do (store/connect.py)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in TESTS.rglob("*.py")
        for line in unprepared_pooler_connections(path)
    ]
    assert offenders == []


def test_the_pooler_check_sees_a_connection_without_the_setting(tmp_path: Path) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text(
        "async def test_x(pooled):\n"
        "    async with await AsyncConnection.connect(\n        pooled, autocommit=True\n    ):\n"
        "        pass\n"
        "    psycopg.connect(pooled, prepare_threshold=None)\n"
    )
    assert unprepared_pooler_connections(module) == [2]
