"""Every periodic statement of every long-running process rides out a database that refuses
for a while (issue 40, part 3): ingest's (the routing refresh, the duplicate window's purge,
the feeds' last-message times, the key store's check and the index form, the worklist gauge,
the history gauge), ``inturn local``'s sweep, the operator's registry statements (its periodic
pass's, the worker logins', the restore clock's), the console's feed, a worker's destination
lease and its look at the key store for a rotated blind index key. Each meets, on a Postgres
server of the test's own, a read-only database (``default_transaction_read_only``, server-wide,
as a maintenance window sets it), a lock held by a second session past ``lock_timeout``, and its
connections ended (``pg_terminate_backend``).
Each is said once when the refusal begins (a WARNING) and once when it ends (an INFO), the
process goes on, its probe says so meanwhile (:func:`inturn.worker.text.conditions.notes`), and
the statement works again once the database does. (``inturn local``'s own lease:
test_periodic_refusals.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from inturn.worker.console.feed import Feed
from inturn.worker.feeds.declare import parse_feeds
from inturn.worker.ingest.service import Ingest
from inturn.worker.local import run as local_run
from inturn.worker.store import queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from inturn.worker.text import conditions
from tests.support import keys, pgcluster
from tests.support.ingest import config as ingest_config
from tests.support.pipeline import register, until, worker, worker_config

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.store,
    pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing())),
    pytest.mark.slow,
]

FAULTS = ["read-only", "lock-timeout", "connection-lost"]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[pgcluster.Cluster, str]]:
    cluster = pgcluster.Cluster()
    try:
        dsn = cluster.primary.dsn()
        migrate(dsn)
        register(dsn, "ward/adt-out", "adt")
        yield cluster, dsn
    finally:
        cluster.close()


def _setting(cluster: pgcluster.Cluster, name: str, value: str | None) -> None:
    cluster.set_system(name, value)


def _terminate_every_session(dsn: str) -> int:
    """End every client session on the server but this one (a restart's effect on sessions,
    without the restart)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


@contextlib.asynccontextmanager
async def refusing(
    cluster: pgcluster.Cluster, dsn: str, fault: str, table: str
) -> AsyncIterator[None]:
    """The database refuses while the block runs: read-only (server-wide, every session at its
    next statement), ``table`` locked by a second session while every session waits at most
    300 ms for a lock, or every session ended once as the block begins.

    The second session's lock is awaited, never taken by a blocking call: the process under
    test runs on this event loop, and a transaction of its own in flight (a worker's pull holds
    its lease row's lock between two statements) could not reach its COMMIT while the loop
    waited for the lock that transaction holds (each would wait for the other until the
    blocker's lock_timeout)."""
    if fault == "read-only":
        _setting(cluster, "default_transaction_read_only", "on")
        try:
            yield
        finally:
            _setting(cluster, "default_transaction_read_only", None)
    elif fault == "lock-timeout":
        _setting(cluster, "lock_timeout", "300ms")
        blocker = await AsyncConnection.connect(dsn)
        try:
            # the fault's own lock may wait for a statement in flight (the worker's renewal,
            # slow on a loaded machine): not held to the 300 ms it imposes on the others
            await blocker.execute("SET lock_timeout = '20s'")
            await blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            yield
        finally:
            await blocker.close()
            _setting(cluster, "lock_timeout", None)
    else:
        _terminate_every_session(dsn)  # none for a statement that connects per turn (the sweep)
        yield


def _lines(caplog: pytest.LogCaptureFixture, what: str, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.getMessage().startswith(what)
    ]


async def ride_out(
    cluster: pgcluster.Cluster,
    dsn: str,
    caplog: pytest.LogCaptureFixture,
    fault: str,
    table: str,
    what: str,
    turn: Callable[[], Awaitable[bool]],
    *,
    writes: bool,
) -> None:
    """One periodic statement (``turn``: one try, True when it worked) meets ``fault``: refused
    (a lock timeout; a read-only database for a statement that ``writes``) it fails with one
    WARNING however often it is tried, is shown by :func:`conditions.notes`, and works again
    once the fault is lifted, with one INFO; a lost connection is made again at once or by the
    next try (at most one WARNING)."""
    caplog.clear()
    refused = fault == "lock-timeout" or (fault == "read-only" and writes)
    with caplog.at_level(logging.DEBUG):
        async with refusing(cluster, dsn, fault, table):
            if fault == "connection-lost":
                results = [await turn() for _ in range(3)]
                assert results[-1], results  # a new connection by the next try at the latest
                refused = not results[0]
            else:
                for _ in range(3):
                    assert await turn() is not refused
                if refused:
                    assert any(n.startswith(what) for n in conditions.notes()), conditions.notes()
        # the server's sessions take a reloaded setting asynchronously (pg_reload_conf signals)
        for _ in range(50):
            if await turn():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"{what}: still failing once the database works")
    assert not any(n.startswith(what) for n in conditions.notes())
    warnings = _lines(caplog, what, logging.WARNING)
    ended = _lines(caplog, what, logging.INFO)
    if refused:
        assert len(warnings) == 1, warnings
        assert "trying again" in warnings[0]
        assert len(ended) == 1 and "works again after" in ended[0], ended
    else:
        assert warnings == [] and ended == []


# --- ingest -------------------------------------------------------------------------------------

#: Ingest's periodic statements: (the name in Ingest.periodic, the table to lock, writes).
INGEST = {
    "routing": ("inturn_destination", False),
    "window-purge": ("inturn_received", True),
    "feeds": ("inturn_feed", True),
    "index-form": ("inturn_delivery", False),
    "worklist-gauge": ("inturn_worklist_item", False),
    "history-gauge": ("inturn_history", False),
}


@contextlib.asynccontextmanager
async def ingest_on(dsn: str, tmp_path: Path, server_dsn: str) -> AsyncIterator[Ingest]:
    declared = parse_feeds({"feeds": [{"channel": "adt", "silentAfterSeconds": 600}]})
    with keys.key_store(server_dsn) as key_dsn:
        cfg = ingest_config(
            refresh_seconds=3600,
            duplicate_window=86400,
            feeds=tuple(declared),
            feed_flush_seconds=3600,
            payload_keys=str(keys.master_keys(tmp_path / "keys")),
            key_dsn=key_dsn,
        )
        async with Ingest(cfg, dsn=dsn) as ingest:
            yield ingest


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", sorted(INGEST))
async def test_an_ingest_periodic_statement_rides_out_a_refusal(
    server: tuple[pgcluster.Cluster, str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    name: str,
    fault: str,
) -> None:
    cluster, dsn = server
    table, writes = INGEST[name]
    async with ingest_on(dsn, tmp_path, dsn) as ingest:
        assert ingest.router is not None
        periodic = ingest.router.periodic if name == "routing" else ingest.periodic[name]

        async def turn() -> bool:
            if ingest.recorder is not None:  # something to write: a message from a sender
                ingest.recorder.seen("adt", "LAB", "HOSP")
            return await periodic.turn()

        await ride_out(
            cluster, dsn, caplog, fault, table, periodic.condition.what, turn, writes=writes
        )
        assert ingest.readiness() is None  # still taking messages


async def test_ingest_key_store_check_rides_out_a_lock_on_the_key_store(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The key store's check meets a lock on the key store's own table (its database apart
    from the queue's; a read-only server and ended sessions reach both: the cases above)."""
    cluster, dsn = server
    async with ingest_on(dsn, tmp_path, dsn) as ingest:
        periodic = ingest.periodic["index-form"]
        key_dsn = ingest.config.key_dsn
        assert key_dsn is not None
        what = periodic.condition.what
        await ride_out(
            cluster,
            key_dsn,
            caplog,
            "lock-timeout",
            "inturn_key_setting",
            what,
            periodic.turn,
            writes=False,
        )
        assert ingest.readiness() is None  # still taking messages


async def test_the_probes_say_so(server: tuple[pgcluster.Cluster, str], tmp_path: Path) -> None:
    """While a statement is refused, ingest's ``/readyz`` (and ``inturn local``'s, the same
    page) names it; once it works again, it does not."""
    import aiohttp

    cluster, dsn = server
    async with ingest_on(dsn, tmp_path, dsn) as ingest:
        purge = ingest.periodic["window-purge"]
        url = f"http://127.0.0.1:{ingest._ops_port}/readyz"
        async with aiohttp.ClientSession() as session:
            async with refusing(cluster, dsn, "read-only", "inturn_received"):
                assert not await purge.turn()
                async with session.get(url) as r:
                    body = await r.text()
            assert "the duplicate window's purge failing for" in body, body
            assert "read-only" in body
            assert await purge.turn()
            async with session.get(url) as r:
                assert "the duplicate window's purge" not in await r.text()


async def test_a_stopped_ingest_leaves_no_condition_behind(
    server: tuple[pgcluster.Cluster, str], tmp_path: Path
) -> None:
    """Stopped while two of its statements are refused, an ingest forgets both: another owner
    in the same process (a later run of ``inturn local``, the next test) does not show them on
    its ``/readyz`` as its own. (The next run's page once carried the last one's pooling.)"""
    cluster, dsn = server
    async with ingest_on(dsn, tmp_path, dsn) as ingest:
        assert ingest.router is not None
        refused = [
            (ingest.periodic["window-purge"], "read-only", "inturn_received"),
            (ingest.router.periodic, "lock-timeout", "inturn_destination"),
        ]
        for periodic, fault, table in refused:
            async with refusing(cluster, dsn, fault, table):
                assert not await periodic.turn()
        whats = [periodic.condition.what for periodic, _, _ in refused]
        assert all(any(n.startswith(w) for n in conditions.notes()) for w in whats)
    assert not [n for n in conditions.notes() if any(n.startswith(w) for w in whats)]
    assert not any(periodic.condition.active for periodic, _, _ in refused)


# --- inturn local's sweep -------------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_local_sweep_rides_out_a_refusal(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    cluster, dsn = server
    sweep = local_run.sweeper(dsn, 3600, [])
    await ride_out(
        cluster, dsn, caplog, fault, "inturn_lease", "the sweep", sweep.turn, writes=True
    )


# --- the operator's registry statements ---------------------------------------------------------


#: The operator's registry statements: (the table a lock holds them on, writes). Every one
#: the operator runs: the periodic pass's (rows, depth, deleted, register, carriers), a
#: Destination's login (logins), the restore clock's tick and witness (restore).
REGISTRY = {
    "rows": ("inturn_destination", False),
    "depth": ("inturn_delivery", False),
    "deleted": ("inturn_destination", True),
    "register": ("inturn_destination", True),
    "carriers": ("inturn_destination_carrier", False),
    "logins": ("inturn_worker_scope", True),
    "restore": ("inturn_clock", True),
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", sorted(REGISTRY))
async def test_an_operator_registry_statement_rides_out_a_refusal(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture, kind: str, fault: str
) -> None:
    from inturn.operator import manifests
    from inturn.operator.registrar import Registrar
    from tests.support.kopf_env import destination as destination_body

    cluster, dsn = server
    if kind == "logins":  # the worker roles a destination's login is made from
        from inturn.worker.store import roles, roles_apply

        roles_apply.apply_roles(dsn, roles.DEFAULT_PREFIX)
    registrar = Registrar(dsn)
    await registrar.open()
    assert registrar.pool is not None
    await registrar.pool.wait(timeout=10)
    condition = registrar.conditions[kind]
    table, writes = REGISTRY[kind]
    generation = [0]

    def children() -> tuple[dict[str, object], manifests.Children]:
        generation[0] += 1  # a changed Destination: the registry row is written each turn
        body = destination_body("refused", generation=generation[0])
        body["spec"]["carriers"] = ["ZQX"]  # type: ignore[index]
        settings = manifests.WorkerPodSettings(image="img:1")
        return body, manifests.render(body, settings)

    async def turn() -> bool:
        if kind == "rows":
            await registrar.rows()
        elif kind == "depth":
            await registrar.depth()
        elif kind == "deleted":
            await registrar.mark_deleted("ward/nobody")
        elif kind == "register":
            body, made = children()
            await registrar.register(body, made, None)
        elif kind == "carriers":
            assert await registrar.carriers_taken(children()[1]) is None
        elif kind == "logins":
            await registrar.ensure_login("ward/refused-login", "pw-refusal")
        else:
            await registrar.restore_pass(move=True)
        return not condition.active

    try:
        await ride_out(cluster, dsn, caplog, fault, table, condition.what, turn, writes=writes)
    finally:
        await registrar.close()


# --- the console's feed ---------------------------------------------------------------------------


async def test_the_console_feed_reads_on_through_a_read_only_database(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The feed only reads: a read-only database refuses none of its refreshes (no line, no
    condition), and it goes on refreshing meanwhile."""
    cluster, dsn = server
    caplog.set_level(logging.DEBUG, logger="inturn.console")
    async with AsyncConnectionPool(
        dsn, min_size=1, open=False, kwargs={"autocommit": True}
    ) as pool:
        feed = Feed(dsn, pool, refresh_seconds=0.2, min_interval=0.05)
        await feed.start()
        try:
            async with refusing(cluster, dsn, "read-only", "inturn_destination"):
                version = feed.snapshot.version
                await until(lambda: feed.snapshot.version > version + 2, timeout=20)
                assert not any(n.startswith("the console feed") for n in conditions.notes())
        finally:
            await feed.stop()
    assert _lines(caplog, "the console feed", logging.WARNING) == []


@pytest.mark.parametrize("fault", ["lock-timeout", "connection-lost"])
async def test_the_console_feed_rides_out_a_refusal(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """The feed keeps one LISTEN session and refreshes on it (reads only: a read-only database
    changes nothing for it): a lock timeout or its session ended is said once, the feed goes
    on, and refreshes again once the database does."""
    cluster, dsn = server
    caplog.set_level(logging.DEBUG, logger="inturn.console")
    async with AsyncConnectionPool(
        dsn, min_size=1, open=False, kwargs={"autocommit": True}
    ) as pool:
        feed = Feed(dsn, pool, refresh_seconds=0.2, min_interval=0.05)
        await feed.start()
        try:

            def failing() -> bool:
                return any(n.startswith("the console feed") for n in conditions.notes())

            async with refusing(cluster, dsn, fault, "inturn_destination"):
                await until(failing, timeout=20)
                if fault == "lock-timeout":
                    await asyncio.sleep(1)  # several refreshes refused meanwhile
                    assert failing()
            await until(lambda: not failing(), timeout=20)
            version = feed.snapshot.version
            await until(lambda: feed.snapshot.version > version + 1, timeout=20)
        finally:
            await feed.stop()
    warnings = _lines(caplog, "the console feed", logging.WARNING)
    assert len(warnings) == 1, warnings
    assert len(_lines(caplog, "the console feed", logging.INFO)) == 1


# --- a worker's destination lease -----------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_worker_keeps_its_lease_through_a_refusal(
    server: tuple[pgcluster.Cluster, str], fault: str
) -> None:
    """A worker idling with its lease (every idle turn reads its head with the lease's guard,
    which renews it: a write) meets the fault: it stays alive, its ``/readyz`` reason names
    the refusal (a lost session: it reconnects), and once the database takes writes again it
    holds its lease and delivers what came meanwhile, once."""
    cluster, dsn = server
    destination = f"ward/lease-{fault}"
    async with MllpReceiver() as rx:
        cfg = worker_config(destination, rx.port, channel="adt", idle_seconds=0.2)
        async with worker(cfg, dsn) as running:
            await until(lambda: running.state.lock_held, timeout=20)
            async with refusing(cluster, dsn, fault, "inturn_lease"):
                if fault != "connection-lost":
                    await until(lambda: running.state.not_ready() is not None, timeout=20)
                    why = running.state.not_ready() or ""
                    assert ("read-only" if fault == "read-only" else "lock not available") in why
                    await asyncio.sleep(1)  # refused again and again: alive (/healthz 200)
                    assert running.state.alive(running.health_window())
            async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
                await queue.enqueue(
                    conn,
                    [
                        NewItem(
                            destination,
                            "adt",
                            "LEASE1",
                            "ADT^A01",
                            b"MSH|^~\\&|A|B|C|D|20261205||ADT^A01|LEASE1|P|2.5\rPID|1||7\r",
                        )
                    ],
                )
            await until(lambda: len(rx.received) >= 1, timeout=30)
            await until(lambda: running.state.not_ready() is None, timeout=20)
            assert running.state.lock_held
        assert [m.count(b"LEASE1") for m in rx.received] == [1]


# --- a worker's look at the key store (a rotated blind index key) --------------------------------


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_worker_look_at_the_key_store_rides_out_a_refusal(
    server: tuple[pgcluster.Cluster, str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    fault: str,
) -> None:
    """A worker with payload keys looks at the key store every few seconds for a rotated blind
    index key (``inturn keys rotate-index``): the key store's table locked past
    ``lock_timeout``, or its sessions ended, is said once and once again when it works, the
    worker goes on delivering meanwhile (a read-only key store changes nothing: a read)."""
    cluster, dsn = server
    destination = f"ward/keylook-{fault}"
    with keys.key_store(dsn) as key_dsn:
        folder = keys.master_keys(tmp_path / "keys")
        codec = await keys.codec(folder, key_dsn)
        async with MllpReceiver() as rx:
            cfg = worker_config(destination, rx.port, channel="adt", idle_seconds=0.2)
            async with worker(cfg, dsn, payloads=await keys.codec(folder, key_dsn)) as running:
                await until(lambda: running._index_look is not None, timeout=20)
                look = running._index_look
                assert look is not None
                await ride_out(
                    cluster,
                    key_dsn,
                    caplog,
                    fault,
                    "inturn_key_setting",
                    look.condition.what,
                    look.turn,
                    writes=False,
                )
                async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
                    payload = b"MSH|^~\\&|A|B|C|D|20261205||ADT^A01|KEYLOOK1|P|2.5\rPID|1||7\r"
                    item = NewItem(destination, "adt", "KEYLOOK1", "ADT^A01", payload)
                    await queue.enqueue(conn, [item], codec)
                await until(lambda: len(rx.received) >= 1, timeout=30)
        assert rx.received == [payload]
