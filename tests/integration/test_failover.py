"""A failed-over database (issue 18, item 8b): multi-host DSNs with every documented
``target_session_attrs``, against a real streaming standby made with pg_basebackup, and a
promotion in the middle of a drain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.spec.config import RetryPolicy
from inturn.worker.store import queue
from inturn.worker.store.connect import Pools, connect_worker, write_target
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.pgcluster import Cluster, Server, missing
from tests.support.pipeline import control_ids, worker, worker_config

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())), pytest.mark.slow]

#: Every value libpq documents for target_session_attrs (libpq "Parameter Key Words").
ATTRS = ("any", "read-write", "primary", "read-only", "standby", "prefer-standby")
#: Where a read-pool session lands for each, with the standby up: True = on the standby.
READS_ON_STANDBY = {
    "any": None,  # the first host that answers
    "read-write": False,
    "primary": False,
    "read-only": True,
    "standby": True,
    "prefer-standby": True,
}
DEST = "ward/failover"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        migrate(c.primary.dsn())
        c.add_standby(synchronous=True)
        yield c
    finally:
        c.close()


def both(primary: Server, standby: Server, attrs: str, standby_first: bool = False) -> str:
    first, second = (standby, primary) if standby_first else (primary, standby)
    return (
        f"host=127.0.0.1,127.0.0.1 port={first.port},{second.port} user=postgres"
        f" dbname=postgres target_session_attrs={attrs}"
    )


async def on_standby(conn: AsyncConnection[object]) -> bool:
    cur = await conn.execute("SELECT pg_is_in_recovery()")
    row = await cur.fetchone()
    assert row is not None
    return bool(row[0])


async def show(conn: AsyncConnection[object], name: str) -> str:
    cur = await conn.execute(f"SHOW {name}")  # type: ignore[arg-type]
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("standby_first", [False, True])
@pytest.mark.parametrize("attrs", ATTRS)
async def test_pools_open_with_every_target_session_attrs(
    cluster: Cluster, attrs: str, standby_first: bool
) -> None:
    standby = cluster.servers[1]
    dsn = both(cluster.primary, standby, attrs, standby_first)
    async with await Pools.open(dsn, write_size=1, read_size=1) as pools:
        async with pools.write.connection() as conn:
            assert not await on_standby(conn)  # writes always reach the primary
            await conn.execute("SELECT count(*) FROM inturn_delivery")
            assert await show(conn, "default_transaction_read_only") == "off"
        async with pools.read.connection() as conn:
            assert await show(conn, "transaction_read_only") == "on"
            expected = READS_ON_STANDBY[attrs]
            if expected is None:
                expected = standby_first
            assert await on_standby(conn) == expected
    worker_conn = await connect_worker(dsn)
    try:
        assert not await on_standby(worker_conn)
    finally:
        await worker_conn.close()


def test_migrations_reach_the_primary_whatever_comes_first(cluster: Cluster) -> None:
    dsn = both(cluster.primary, cluster.servers[1], "any", standby_first=True)
    assert write_target(dsn) == {"target_session_attrs": "read-write"}
    migrate(dsn)  # on the standby it would fail: cannot execute in a read-only transaction


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("host=a port=5432", {}),
        ("host=a,b target_session_attrs=primary", {}),
        ("host=a,b target_session_attrs=read-write", {}),
        ("host=a,b", {"target_session_attrs": "read-write"}),
        ("host=a target_session_attrs=standby", {"target_session_attrs": "read-write"}),
        (
            "postgresql://a,b/db?target_session_attrs=prefer-standby",
            {"target_session_attrs": "read-write"},
        ),
    ],
)
def test_write_target(dsn: str, expected: dict[str, str]) -> None:
    assert write_target(dsn) == expected


async def test_a_promoted_standby_takes_over_the_drain() -> None:
    """A primary with a synchronous standby dies in the middle of a drain; the standby is
    promoted; the worker, on a two-host DSN, reconnects to it by itself and delivers the rest:
    every message once and in order, at most one twice."""
    cluster = Cluster()
    try:
        migrate(cluster.primary.dsn())
        standby = cluster.add_standby(synchronous=True)
        dsn = both(cluster.primary, standby, "read-write")
        total = 60
        async with await AsyncConnection.connect(cluster.primary.dsn(), autocommit=True) as conn:
            await queue.enqueue(
                conn,
                [NewItem(DEST, "adt", f"F{n:03d}", "ADT^A01", _message(n)) for n in range(total)],
            )
        receiver = MllpReceiver()
        receiver.delay_seconds = 0.02
        retry = RetryPolicy(max_attempts=0, backoff_seconds=1, max_backoff_seconds=1)
        async with receiver:
            cfg = worker_config(DEST, receiver.port, channel="adt", retry=retry)
            async with worker(cfg, dsn, stop_seconds=30):
                await receiver.wait_for(total // 3, timeout=30)
                cluster.primary.stop("immediate")  # the primary is gone mid-drain
                standby.promote()
                await receiver.wait_for(total, timeout=90)
                await _until_delivered(standby, total)
        ids = control_ids(receiver.received)
        distinct = list(dict.fromkeys(ids))
        assert distinct == [f"F{n:03d}" for n in range(total)]  # none lost, in order
        assert len(ids) - len(distinct) <= 1  # at most the one in flight, twice
    finally:
        cluster.close()


def _message(n: int) -> bytes:
    return f"MSH|^~\\&|A|B|C|D|2026||ADT^A01|F{n:03d}|P|2.5\rPID|1||{n}\r".encode()


async def _until_delivered(server: Server, total: int) -> None:
    async with asyncio.timeout(60):
        while True:
            with psycopg.connect(server.dsn(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'"
                ).fetchone()
            if row is not None and row[0] == total:
                return
            await asyncio.sleep(0.2)
