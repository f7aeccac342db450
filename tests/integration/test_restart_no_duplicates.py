"""A database restart or failover with the workers alive sends nothing twice (issue 40, part
2): many destinations' workers in one process drain backlogs to a real MLLP receiver that holds
each ACK a moment, so that most of them have a message at the receiver when the server goes
away; their delivered marks are lost with the sessions, remembered by the workers, and written
(one batch each, rows still pending only) when the database is back, before anything is sent.
The receiver counts every message once. (Before, a 22 s restart gave 92 of 96 active
destinations one duplicate each.) On Postgres servers of the test's own: a restart with
``pg_ctl``, and a synchronous standby promoted after the primary was stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import pgcluster
from tests.support.pipeline import control_ids, until, worker, worker_config

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.store,
    pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing())),
    pytest.mark.slow,
]

#: Destinations (workers in this process) and messages each: every third one has lanes.
DESTINATIONS, EACH = 16, 10


def _message(d: int, n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205||ADT^A01|D{d:02d}M{n:03d}|P|2.5\r"
        f"PID|1||P{d}-{n % 4}^^^HOSP^MR\r"
    ).encode()


async def _backlog(dsn: str) -> None:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        for d in range(DESTINATIONS):
            await queue.enqueue(
                conn,
                [
                    NewItem(f"ward/d{d:02d}", "adt", f"D{d:02d}M{n:03d}", "ADT^A01", _message(d, n))
                    for n in range(EACH)
                ],
            )


def _delivered(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'")
            found = row.fetchone()
    except psycopg.OperationalError:
        return -1
    return int(found[0]) if found else 0


async def _drain_through(
    dsn: str, check_dsn: str, fault: object, caplog: pytest.LogCaptureFixture
) -> list[str]:
    """Run the workers on ``dsn``, call ``fault`` (a coroutine function) once most of them have
    a message at the receiver, and wait until everything is delivered (read on
    ``check_dsn``); the control IDs the receiver got, in arrival order."""
    caplog.set_level(logging.INFO, logger="inturn.drain")
    total = DESTINATIONS * EACH
    async with MllpReceiver() as rx, contextlib.AsyncExitStack() as stack:
        rx.delay_seconds = 0.4  # each message waits at the receiver before its ACK
        for d in range(DESTINATIONS):
            cfg = worker_config(
                f"ward/d{d:02d}",
                rx.port,
                channel="adt",
                idle_seconds=1,
                lanes=3 if d % 3 == 0 else 1,
            )
            await stack.enter_async_context(worker(cfg, dsn, stop_seconds=30))
        await until(lambda: len(rx.received) >= 2 * DESTINATIONS, timeout=60)
        assert callable(fault)
        await fault()
        await until(lambda: _delivered(check_dsn) == total, timeout=120, every=0.5)
        got = control_ids(rx.received)
    remembered = [
        r.getMessage() for r in caplog.records if "receiver had acknowledged" in r.getMessage()
    ]
    assert remembered, "no worker had a message at the receiver when the server went away"
    return got


def _expected() -> list[str]:
    return sorted(f"D{d:02d}M{n:03d}" for d in range(DESTINATIONS) for n in range(EACH))


async def test_a_postgres_restart_sends_nothing_twice(caplog: pytest.LogCaptureFixture) -> None:
    cluster = pgcluster.Cluster()
    try:
        dsn = cluster.primary.dsn()
        migrate(dsn)
        await _backlog(dsn)

        async def restart() -> None:
            await asyncio.to_thread(cluster.primary.stop, "fast")
            await asyncio.sleep(2)  # the workers try again and again meanwhile
            await asyncio.to_thread(cluster.primary.start)

        got = await _drain_through(dsn, dsn, restart, caplog)
    finally:
        cluster.close()
    twice = {c: n for c, n in Counter(got).items() if n > 1}
    assert twice == {}  # not one duplicate at the receiver
    assert sorted(got) == _expected()  # nothing lost


async def test_a_failover_sends_nothing_twice(caplog: pytest.LogCaptureFixture) -> None:
    cluster = pgcluster.Cluster()
    try:
        migrate(cluster.primary.dsn())
        standby = cluster.add_standby(synchronous=True)
        await _backlog(cluster.primary.dsn())
        dsn = (
            f"host=127.0.0.1,127.0.0.1 port={cluster.primary.port},{standby.port}"
            " user=postgres dbname=postgres target_session_attrs=read-write"
        )

        async def failover() -> None:
            await asyncio.to_thread(cluster.primary.stop, "immediate")  # the primary is gone
            await asyncio.to_thread(standby.promote)

        got = await _drain_through(dsn, standby.dsn(), failover, caplog)
    finally:
        cluster.close()
    twice = {c: n for c, n in Counter(got).items() if n > 1}
    assert twice == {}
    assert sorted(got) == _expected()
