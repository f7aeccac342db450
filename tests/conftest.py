"""Shared fixtures: a real Postgres for every test session.

``INTURN_TEST_DSN`` names a server to use (CI sets it to the system Postgres); otherwise an
embedded server is started with ``pgserver``. Either way each test session gets its own fresh
database, migrated with the real migrations, and drops it at the end.

Tests never find or touch what belongs to the person running them: the tests run from a
temporary working folder (never the clone, where a tutorial's ``inturn local`` may keep
``./.inturn``), with ``./.inturn`` discovery off (``INTURN_LOCAL_DISCOVERY=off``) and without the
user's ``INTURN_*`` settings (``INTURN_DSN`` above all); only the test suite's own knobs
(:data:`TEST_KNOBS`) pass through. Every command a test runs has a timeout (a subprocess its
``timeout``, ``tests/unit/test_isolation.py`` checks them all), and every test as a whole has a
bound (:mod:`tests.support.watchdog`, for the commands run in-process, such as click's
``CliRunner``): past it the run is interrupted, failing, rather than hanging for good.
``tests/unit/test_isolation.py`` holds these rules.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store.dsn import LOCAL_DISCOVERY_ENV
from inturn.worker.store.migrate import migrate
from tests.support import keys
from tests.support.db import database, empty_tables

#: pytester: tests/unit/test_isolation.py runs pytest on a hanging test; the watchdog: a bound
#: on every test; the schedule: the order in which xdist's workers get the test files.
pytest_plugins = ["pytester", "tests.support.watchdog", "tests.support.schedule"]

#: The ``INTURN_*`` variables that steer the test suite itself (every other ``INTURN_*`` variable
#: is a setting of the user's installation, and is removed before any test runs).
TEST_KNOBS = ("INTURN_TEST_", "INTURN_REQUIRE_", "INTURN_SAMPLES", "INTURN_PG_BIN")
TEST_KNOBS += ("INTURN_CHROMIUM", "INTURN_SCREENSHOTS", LOCAL_DISCOVERY_ENV)
for _name in [n for n in os.environ if n.startswith("INTURN_") and not n.startswith(TEST_KNOBS)]:
    del os.environ[_name]
os.environ[LOCAL_DISCOVERY_ENV] = "off"

#: The shared sample messages, read in place: ../shared/samples/hl7 beside the repository, or
#: wherever INTURN_SAMPLES points.
SAMPLES = Path(
    os.environ.get("INTURN_SAMPLES")
    or Path(__file__).resolve().parents[2] / "shared" / "samples" / "hl7"
)


@pytest.fixture(scope="session", autouse=True)
def away_from_the_user() -> Iterator[Path]:
    """Run the whole session from a temporary working folder of its own (removed after)."""
    before = os.getcwd()
    home = Path(tempfile.mkdtemp(prefix="inturn-tests-cwd-"))
    os.chdir(home)
    try:
        yield home
    finally:
        os.chdir(before)
        shutil.rmtree(home, ignore_errors=True)


#: The folder of the acceptance tier: tests that start whole processes.
ACCEPTANCE = Path(__file__).resolve().parent / "acceptance"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under ``tests/acceptance`` ``acceptance``; tests elsewhere that start
    whole processes mark themselves. Every ``acceptance`` or ``serial`` test is ``slow`` too:
    ``make test-fast`` (the edit-test loop, ``-m "not slow"``) leaves out the slow ones, so it
    runs in one parallel part with nothing left to run alone."""
    for item in items:
        if ACCEPTANCE in item.path.parents:
            item.add_marker(pytest.mark.acceptance)
        if item.get_closest_marker("acceptance") or item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """DSN of a Postgres server (not a database of our own yet)."""
    dsn = os.environ.get("INTURN_TEST_DSN")
    if dsn:
        yield dsn
        return
    import pgserver

    from inturn.worker.local.embedded import ensure_server_user

    ensure_server_user()  # xdist workers on a machine that never ran pgserver as root
    data = tempfile.mkdtemp(prefix="inturn-pg-")
    server = pgserver.get_server(data, cleanup_mode="delete")
    try:
        uri = server.get_uri()
        unsynced(uri)
        yield uri
    finally:
        server.cleanup()


def unsynced(server_dsn: str) -> None:
    """Turn ``fsync`` off on the embedded server (its data folder is thrown away after the run,
    so a crash of the machine loses nothing worth keeping): a commit then waits for no disk
    flush, which made ``fresh_db`` 3 to 4 times quicker and every commit of every test cheaper
    (docs/explanation/architecture.md, Tests). Never done to ``INTURN_TEST_DSN``'s server."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def dsn(pg_server_dsn: str) -> Iterator[str]:
    """DSN of a fresh, migrated database that lives for the whole test session."""
    with database(pg_server_dsn, "inturn_test") as db_dsn:
        migrate(db_dsn)
        yield db_dsn


@pytest.fixture
def empty_db(pg_server_dsn: str) -> Iterator[str]:
    """DSN of a database nobody migrated (dropped after the test)."""
    with database(pg_server_dsn, "inturn_empty") as db_dsn:
        yield db_dsn


@pytest.fixture
def fresh_db(dsn: str) -> str:
    """The session database with every table emptied before the test (the list read from the
    catalog: :func:`tests.support.db.empty_tables`)."""
    empty_tables(dsn)
    return dsn


@pytest.fixture
async def conn(fresh_db: str) -> AsyncIterator[AsyncConnection[Any]]:
    """An autocommit connection to the emptied session database (closed after the test)."""
    c = await AsyncConnection.connect(fresh_db, autocommit=True)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="session")
def samples() -> list[Path]:
    """The 110 sample HL7 messages in ../shared/samples/hl7, read in place, sorted by name."""
    files = sorted(SAMPLES.glob("*.hl7"))
    if not files:
        pytest.skip(f"no samples under {SAMPLES} (set INTURN_SAMPLES to their folder)")
    return files


@pytest.fixture
def key_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A key store database of the test's own on the test server (dropped after it)."""
    with keys.key_store(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    """A folder of master keys (one, made for the test)."""
    return keys.master_keys(tmp_path / "keys")


@pytest.fixture
def pg_home() -> Iterator[Path]:
    """A folder for an embedded Postgres outside pytest's tmp tree: pytest keeps
    /tmp/pytest-of-<user> at mode 0700, which the server's own user (pgserver runs it as an
    unprivileged user when we are root) cannot always traverse. Its path is short: the
    server's Unix socket lives under it."""
    home = Path(tempfile.mkdtemp(prefix="inturn-pg-home-"))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)
