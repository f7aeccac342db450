"""The test suite never finds or touches what belongs to the person running it (their
``./.inturn``, their database, their settings): tests/conftest.py's rules, held."""

from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import pytest

from inturn.worker.store.dsn import LOCAL_DISCOVERY_ENV, DsnMissing, local_discovery, resolve_dsn

ROOT = Path(__file__).resolve().parents[2]


def test_the_session_runs_from_a_temporary_folder_of_its_own(
    away_from_the_user: Path, pytestconfig: pytest.Config
) -> None:
    here = Path.cwd().resolve()
    assert here == away_from_the_user.resolve()
    assert here.name.startswith("inturn-tests-cwd-")
    assert not here.is_relative_to(ROOT)
    assert here != Path(pytestconfig.invocation_params.dir).resolve()
    assert not (here / ".inturn").exists()


def test_discovery_is_off_and_no_user_setting_passes() -> None:
    assert os.environ[LOCAL_DISCOVERY_ENV] == "off"
    assert local_discovery() is False
    assert "INTURN_DSN" not in os.environ


def fake_local(folder: Path) -> None:
    """A ``./.inturn`` as a running ``inturn local`` leaves it (postmaster.pid naming a live
    process: this one)."""
    pg = folder / ".inturn" / "pg"
    pg.mkdir(parents=True)
    (pg / "postmaster.pid").write_text(f"{os.getpid()}\n{pg}\n0\n54329\n{pg}\n")


def test_a_running_inturn_local_beside_a_test_is_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_local(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DsnMissing) as info:
        resolve_dsn(None)
    assert str(info.value) == "no database: pass --dsn or set INTURN_DSN"
    # the same folder, as the user's own shell sees it: found
    monkeypatch.setenv(LOCAL_DISCOVERY_ENV, "on")
    assert "port=54329" in resolve_dsn(None)
    for off in ("off", "0", "no", "FALSE"):
        monkeypatch.setenv(LOCAL_DISCOVERY_ENV, off)
        assert local_discovery() is False, off


def test_the_ingest_command_without_a_database_says_so_beside_a_running_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test that once hung for good (it found the tutorial's Postgres and served on port
    1): with a ``./.inturn`` right there, it still meets "no database"."""
    from click.testing import CliRunner

    from inturn.worker.cli.ingest import ingest_command

    fake_local(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(ingest_command, ["--listen", "adt=1"], env={"INTURN_DSN": ""})
    assert result.exit_code == 2
    assert "no database: pass --dsn or set INTURN_DSN" in result.output


#: The functions that run a command to its end, and so need a timeout.
RUNNERS = {"run", "call", "check_call", "check_output"}


def _bounded(parents: dict[ast.AST, ast.AST], node: ast.AST) -> bool:
    """Whether ``node`` sits inside ``asyncio.wait_for(...)`` or ``async with
    asyncio.timeout(...)`` within its function."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "asyncio.wait_for":
            return True
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(
            ast.unparse(i.context_expr).startswith("asyncio.timeout") for i in node.items
        ):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


def unbounded_commands(source: str) -> list[str]:
    """The calls of ``source`` that may wait for ever on a command: ``subprocess.run`` (and
    friends) without ``timeout=``, and a bare ``.wait()`` or ``.communicate()`` (a process's, or
    an event's) outside ``asyncio.wait_for`` and ``asyncio.timeout``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, keywords = node.func.attr, {k.arg for k in node.keywords}
        if "timeout" in keywords:
            continue
        runs = ast.unparse(node.func.value) == "subprocess" and name in RUNNERS
        waits = name in ("wait", "communicate") and not node.args
        if runs or (waits and not _bounded(parents, node)):
            found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_every_command_a_test_runs_has_a_timeout() -> None:
    unbounded = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (found := unbounded_commands(path.read_text()))
    }
    assert unbounded == {}


def test_the_timeout_check_sees_what_it_must() -> None:
    source = (
        "async def f(proc, ev):\n"
        "    subprocess.run(['x'])\n"
        "    subprocess.run(['x'], timeout=5)\n"
        "    await proc.wait()\n"
        "    await asyncio.wait_for(proc.communicate(), 5)\n"
        "    async with asyncio.timeout(5):\n"
        "        await ev.wait()\n"
        "    proc.wait(30)\n"
    )
    assert unbounded_commands(source) == ["2: subprocess.run(['x'])", "4: proc.wait()"]


@pytest.mark.slow  # a pytest run that hangs on purpose: left out by make test-fast
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_test_that_hangs_is_interrupted_not_waited_for(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, sigint: str
) -> None:
    """The per-test bound of tests/conftest.py, in a pytest run of its own: a test that sleeps
    past it is interrupted and the run fails, saying which test it was. Also when the run was
    started with SIGINT ignored, as a shell starts a background job (``make test &``): the
    loop's second pass slept its 600 s out so."""
    monkeypatch.setenv("INTURN_TEST_TIMEOUT_SECONDS", "2")
    pytester.makeconftest(
        f"import sys\nsys.path.append({str(ROOT)!r})\npytest_plugins = ['tests.support.watchdog']\n"
    )
    pytester.makepyfile(
        test_hang="import time\n\ndef test_forever():\n    time.sleep(300)\n",
    )
    # the bound is for a hang, not a measure: a niced run on a loaded machine starved this
    # subprocess past 120 s (a new user's make test at load 20), whose own work is a second
    before = signal.getsignal(signal.SIGINT)
    if sigint == "ignored":  # inherited by the subprocess, as a background job's is
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=900)
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert result.duration < 300  # interrupted, not slept out (the bound is 2 s)
    result.stdout.fnmatch_lines(["*test_forever: still running after 2 s: interrupting the run*"])


def test_every_inturn_variable_the_tests_read_is_a_test_knob() -> None:
    """tests/conftest.py removes the user's ``INTURN_*`` settings before any test runs; a knob
    of the test suite's own (``INTURN_TEST_*``, ``INTURN_SAMPLES``, ...) must be named in its
    ``TEST_KNOBS``, or it would be removed too, silently."""
    import re

    from tests.conftest import TEST_KNOBS

    read = re.compile(r"""(?:environ\.get|getenv|environ\[)\(?\s*["'](INTURN_[A-Z0-9_]+)""")
    names = {
        name for path in (ROOT / "tests").rglob("*.py") for name in read.findall(path.read_text())
    }
    assert "INTURN_TEST_DSN" in names  # the scan sees them
    assert sorted(n for n in names if not n.startswith(TEST_KNOBS)) == []
