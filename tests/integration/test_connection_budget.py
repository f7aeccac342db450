"""``inturn local``'s connection budget, on a Postgres server of the test's own with a small
``max_connections`` (a new user's trial: 100 destinations on the embedded server's 100
connections, six of them silently without a worker while ingest answered AA, ``/readyz`` ready,
the log calling the full server "unreachable", removals never taking effect).

The server lets a non-superuser open ``max_connections`` minus ``superuser_reserved_connections``
(30 - 3 = 27 here); ``inturn local`` without a console needs ingest's 5, its own 3 and 10 spare
beside one per worker: 9 workers fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.local.budget import budget, embedded_size
from inturn.worker.local.embedded import start_embedded
from inturn.worker.local.run import LocalRunner, OverBudget, run_local
from inturn.worker.store import capacity, faults, registry
from inturn.worker.store.connect import Pools
from inturn.worker.store.migrate import migrate
from tests.support import pgcluster
from tests.support.local import free_port

#: slow (left out by make test-fast): servers of its own
pytestmark = [
    pytest.mark.store,
    pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing())),
    pytest.mark.slow,
]

MAX_CONNECTIONS = 30


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[pgcluster.Cluster, str]]:
    cluster = pgcluster.Cluster()
    try:
        cluster.primary.stop()
        cluster.primary.settings["max_connections"] = str(MAX_CONNECTIONS)
        cluster.primary.start()
        dsn = cluster.primary.dsn()
        migrate(dsn)
        yield cluster, dsn
    finally:
        cluster.close()


def write(folder: Path, name: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\nkind: Destination\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n  channel: adt\n"
        "  sender:\n    mllp:\n      host: 127.0.0.1\n      port: 9\n"
        "  retry: {maxAttempts: 0}\n"
    )
    return path


async def active(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return sorted(r.destination for r in await registry.list_all(conn) if not r.deleted)


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:  # not listening yet
        return 0, ""


async def until(check: Any, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.2)


@pytest.fixture(autouse=True)
def sessions_of_earlier_tests_gone(server: tuple[pgcluster.Cluster, str]) -> None:
    """Each test starts on a server none of the module's earlier tests still holds a session
    of (at most 30 s): the server allows only 30, and a session still closing when the next
    test's workers connect is one its budget did not count (they are refused, then wait)."""
    _, dsn = server
    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT application_name, state FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchall()
        if not rows:
            return
        assert time.monotonic() < deadline, f"sessions of an earlier test still open: {rows}"
        time.sleep(0.1)


async def test_a_run_whose_destinations_do_not_fit_is_refused_with_the_numbers(
    server: tuple[pgcluster.Cluster, str], tmp_path: Path
) -> None:
    _, dsn = server
    for n in range(12):
        write(tmp_path, f"r{n:02d}")
    config = IngestConfig(
        listeners=[ListenerConfig(channel="adt", host="127.0.0.1", port=0)], pool_size=4
    )
    with pytest.raises(OverBudget) as refused:
        await run_local(dsn, [tmp_path], config, None, asyncio.Event(), sweep_every=None)
    assert str(refused.value) == (
        "inturn local needs 30 connections (12 workers, ingest 5, inturn local and console 3,"
        " spare 10), and the server lets it open 27 (max_connections 30 minus 3 reserved):"
        " raise max_connections on that server (and restart it), lower"
        " INTURN_LOCAL_SPARE_CONNECTIONS, or run fewer destinations"
    )
    assert "default/r00" not in await active(dsn)  # nothing was started


async def test_destinations_added_beyond_the_budget_get_no_worker_and_readyz_says_so(
    server: tuple[pgcluster.Cluster, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight fit at start; three added while it runs: one more fits, the last two are
    registered (their messages are queued and kept) but get no worker, and /readyz names them
    until two removed manifests make room, when they start."""
    _, dsn = server
    monkeypatch.setenv("INTURN_REMOVAL_GRACE_SECONDS", "0")
    for n in range(8):
        write(tmp_path, f"a{n:02d}")
    ops = free_port()
    config = IngestConfig(
        listeners=[ListenerConfig(channel="adt", host="127.0.0.1", port=0)],
        ops=("127.0.0.1", ops),
        pool_size=4,
    )
    stop = asyncio.Event()
    runners: list[LocalRunner] = []
    run = asyncio.create_task(
        run_local(dsn, [tmp_path], config, None, stop, sweep_every=None, runners=runners)
    )
    try:
        seen: list[tuple[int, str]] = []

        async def ready() -> bool:
            seen.append(await asyncio.to_thread(readyz, ops))
            return seen[-1] == (200, "ready\n")

        try:
            await until(ready)
        except TimeoutError:
            raise AssertionError(f"/readyz never ready; last said {seen[-1:]}") from None
        for n in (8, 9, 10):
            write(tmp_path, f"a{n:02d}")

        async def two_without() -> bool:
            return bool(runners) and sorted(runners[0].unrun()) == ["default/a09", "default/a10"]

        await until(two_without)
        status, body = await asyncio.to_thread(readyz, ops)
        assert status == 503
        assert "default/a09: no worker: over the connection budget: 9 workers fit" in body
        assert "default/a10: no worker" in body
        assert "max_connections 30" in body
        assert sorted(runners[0].running) == [f"default/a{n:02d}" for n in range(9)]
        assert "default/a10" in await active(dsn)  # routed: its messages are kept for it

        (tmp_path / "a00.yaml").unlink()
        (tmp_path / "a01.yaml").unlink()

        async def started() -> bool:
            return not runners[0].unrun() and "default/a10" in runners[0].running

        await until(started)
        await until(ready)
        assert "default/a00" not in await active(dsn)
    finally:
        stop.set()
        await asyncio.wait_for(run, 60)


async def test_a_full_server_is_named_full_and_a_removal_still_stops_its_worker(
    server: tuple[pgcluster.Cluster, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every slot taken by other sessions: a worker that lost its session is refused a new one.
    The log, the worker and readiness say the database refuses more connections (SQLSTATE
    53300, max_connections 30), never "unreachable"; a manifest removed meanwhile still stops
    its worker at once, and the registry follows once a connection is free."""
    cluster, dsn = server
    # this server alone: other tests of this process measured theirs (the text names a limit
    # only when one server was measured, as in a worker or inturn local)
    monkeypatch.setattr(capacity, "KNOWN", {dsn: MAX_CONNECTIONS})
    for name in ("f1", "f2", "f3"):
        write(tmp_path, name)
    runner = LocalRunner(dsn, [tmp_path], removal_grace=0)
    await runner.start()
    fillers: list[psycopg.Connection[Any]] = []
    try:
        async with asyncio.timeout(30):
            while any(not r.worker.state.lock_held for r in runner.running.values()):
                await asyncio.sleep(0.1)
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            refused: psycopg.OperationalError | None = None
            while refused is None:  # take every slot left
                try:
                    fillers.append(psycopg.connect(dsn, autocommit=True))
                except psycopg.OperationalError as exc:
                    refused = exc
            assert capacity.too_many(refused)
            assert faults.refusal(refused) == (
                "the database refuses more connections (too many clients, SQLSTATE 53300:"
                " max_connections 30 reached)"
            )
            # f1's session ended; its slot taken before the worker can reconnect (this loop
            # holds the event loop the worker runs on)
            fillers[0].execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                " WHERE application_name = 'inturn-worker default/f1'"
            )
            deadline = time.monotonic() + 10
            while fillers[0].execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'inturn-worker default/f1'"
            ).fetchone() != (0,):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            with contextlib.suppress(psycopg.OperationalError):  # its slot, taken again
                while True:
                    fillers.append(psycopg.connect(dsn, autocommit=True))

            async def named() -> bool:
                return "default/f1" in runner.unrun()

            await until(named)
            why = runner.not_ready()
            assert why == (
                "default/f1: no worker session: the database refuses more connections (too many"
                " clients, SQLSTATE 53300: max_connections 30 reached)"
            )
            warned = [r.getMessage() for r in caplog.records if r.name == "inturn.drain"]
            assert any(
                m.startswith("the database refuses more connections") and "default/f1" in m
                for m in warned
            ), warned
            assert not any("unreachable" in m for m in warned), warned

            (tmp_path / "f2.yaml").unlink()
            with contextlib.suppress(psycopg.OperationalError):  # the slot f2 freed, taken
                await runner.poll()
            assert sorted(runner.running) == ["default/f1", "default/f3"]  # f2's stopped
            for conn in fillers:
                conn.close()
            fillers.clear()
            await runner.poll()
            assert await active(dsn) == ["default/f1", "default/f3"]

            async def back() -> bool:
                return runner.not_ready() is None

            await until(back)

            # removed while the server is down: the worker stops, the registry follows later
            cluster.primary.stop("fast")
            (tmp_path / "f3.yaml").unlink()
            with pytest.raises(psycopg.OperationalError):
                await runner.poll()
            assert sorted(runner.running) == ["default/f1"]
            cluster.primary.start()
            await runner.poll()
            assert await active(dsn) == ["default/f1"]
    finally:
        for conn in fillers:
            conn.close()
        await runner.stop()


async def test_people_s_pools_never_hand_out_a_connection_that_died_with_the_server(
    server: tuple[pgcluster.Cluster, str],
) -> None:
    """The console's (and people's commands') pools check a connection before handing it out:
    the first action after the server was restarted works, where it answered "internal"
    (AdminShutdown: terminating connection due to unexpected postmaster exit)."""
    cluster, dsn = server
    pools = await Pools.open(dsn, write_size=2, read_size=2, application_name="inturn-console")
    try:
        for pool in (pools.write, pools.read):
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
        cluster.primary.stop("immediate")  # killed: its sessions die with it
        cluster.primary.start()
        for pool in (pools.write, pools.read):
            async with pool.connection() as conn:  # the first use after the restart
                cur = await conn.execute("SELECT 1")
                assert await cur.fetchone() == (1,)
    finally:
        await pools.close()


def test_the_budget_counts_every_part() -> None:
    plan = budget(100, ingest_pool=4, console=True, spare=10)
    assert (plan.workers, plan.ingest, plan.others, plan.spare, plan.total) == (
        100,
        5,
        8,
        10,
        123,
    )
    assert budget(100, ingest_pool=4, console=True, encrypted=True, spare=10).total == 126
    assert embedded_size(123) == 150  # 123 + 24 for destinations added later + 3 reserved
    assert embedded_size(10) == 100  # never below Postgres's default


def test_the_embedded_server_is_given_the_connections_the_run_needs(pg_home: Path) -> None:
    embedded = start_embedded(pg_home / "d")
    try:
        assert embedded.fit_connections(150) == (100, 150)
        with psycopg.connect(embedded.dsn) as conn:
            assert conn.execute("SHOW max_connections").fetchone() == ("150",)
        assert embedded.fit_connections(120) == (150, 150)  # never lowered
        assert "max_connections = '150'" in (embedded.data_dir / "postgresql.auto.conf").read_text()
    finally:
        embedded.stop()
