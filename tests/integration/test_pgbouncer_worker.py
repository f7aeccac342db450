"""Every inturn path through a real PgBouncer (tests/support/pgbouncer.py) in session and
transaction mode, with PgBouncer's defaults but the pool mode (issue 29): the pools (ingest, CLI,
console) leak no setting, the worker delivers in order and never two senders, wake-ups by LISTEN
on a direct connection or by polling, and a dead holder is replaced after its lease expires."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.spec.config import LeaseSettings, WorkerConfig
from inturn.worker.store import lease as leases
from inturn.worker.store import queue, reads
from inturn.worker.store.connect import Pools, detect_pooling, pooling_notes
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import pgbouncer
from tests.support.pipeline import (
    QUICK_LEASE,
    SHORT_ATTEMPTS,
    control_ids,
    count,
    until,
    worker,
    worker_config,
)
from tests.support.ports import free_port

pytestmark = pytest.mark.skipif(bool(pgbouncer.missing()), reason=str(pgbouncer.missing()))

DEST = "ward/pooled"


def message(n: int) -> bytes:
    return f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|MSG{n:05d}|P|2.5\r".encode()


def items(numbers: range | list[int]) -> list[NewItem]:
    return [NewItem(DEST, "adt", f"MSG{n:05d}", "ADT^A01", message(n)) for n in numbers]


def config(port: int, idle_seconds: int = 30) -> WorkerConfig:
    return worker_config(DEST, port, channel="adt", retry=SHORT_ATTEMPTS, idle_seconds=idle_seconds)


def running(
    cfg: WorkerConfig, dsn: str, **options: Any
) -> contextlib.AbstractAsyncContextManager[DestinationWorker]:
    options.setdefault("lease", QUICK_LEASE)
    options.setdefault("poll_seconds", 0.2)
    return worker(cfg, dsn, **options)


async def delivered(dsn: str, n: int) -> bool:
    return await count(dsn, "delivered", DEST) == n


async def listening(dsn: str) -> bool:
    """Whether a session other than this one has LISTENed on ``dsn``'s database (the worker's
    direct LISTEN connection, before it waits)."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %'"
        )
        row = await cur.fetchone()
    return row is not None and row[0] > 0


async def test_detection_tells_transaction_pooling_apart(
    bouncer: pgbouncer.Bouncer, pooled: str, fresh_db: str
) -> None:
    found = await detect_pooling(pooled)
    assert found.pooled == (bouncer.pool_mode == "transaction")
    assert not (await detect_pooling(fresh_db)).pooled
    if found.pooled:
        assert "pooled connection" in found.note and "tcp_keepalives" in found.note


def readyz(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as answer:
        return answer.status, answer.read().decode()


async def test_readyz_says_the_pooling_of_its_own_database_only(pooled: str, fresh_db: str) -> None:
    """One process, two DSNs probed (a test process does this; so would a tool that serves
    several databases): an ingest on the direct one says nothing of the other's pooler on
    ``/readyz``; one through the pooler says it is pooled when the pooler moves sessions. (A
    pooled DSN probed by an earlier test once made a direct ingest's ``/readyz`` say "pooled
    connection", and the test that read it failed in about one run in ten.)"""
    found = await detect_pooling(pooled)
    assert not (await detect_pooling(fresh_db)).pooled
    own = [found.note] if found.pooled else []
    assert pooling_notes([fresh_db]) == []
    assert pooling_notes([pooled, fresh_db]) == pooling_notes([pooled]) == own
    for dsn, said in ((fresh_db, []), (pooled, own)):
        ops = free_port()
        config = IngestConfig(
            listeners=[ListenerConfig(channel="adt", host="127.0.0.1", port=0)],
            ops=("127.0.0.1", ops),
        )
        async with Ingest(config, dsn=dsn):
            got = await asyncio.to_thread(readyz, ops)
        assert got == (200, "".join(f"{line}\n" for line in ["ready", *said])), dsn


async def test_a_pooler_with_one_server_connection_is_known_without_waiting(
    dsn: str, fresh_db: str
) -> None:
    """Two sessions on one backend: transaction pooling, decided at once (the probe's bound is
    for a pooler whose connections are all held, and long, so that a direct server under load
    is never read as pooled)."""
    with pgbouncer.Bouncer(dsn, "transaction", settings={"default_pool_size": "1"}) as one:
        found = await detect_pooling(one.dsn(fresh_db))
    assert found.pooled and "pooled connection" in found.note


async def test_the_pools_leak_no_setting_between_reads_and_writes(pooled: str) -> None:
    """The read pool's read-only transactions and statement timeout never reach a write: each
    is set per transaction (issue 29 saw AE for every message after a listing)."""
    async with await Pools.open(pooled, write_size=4, read_size=4) as pools:

        async def read() -> None:
            async with pools.read.connection() as conn:
                await reads.list_items(conn, destination=DEST)
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    await conn.execute("DELETE FROM inturn_delivery")

        async def write(n: int) -> None:
            async with pools.write.connection() as conn:
                await queue.enqueue(conn, items([n]))

        for round_ in range(5):
            writes = [write(round_ * 4 + i) for i in range(4)]
            await asyncio.gather(*(read() for _ in range(4)), *writes)
        async with pools.write.connection() as conn:
            cur = await conn.execute("SHOW default_transaction_read_only")
            assert await cur.fetchone() == ("off",)
            cur = await conn.execute("SHOW statement_timeout")
            assert await cur.fetchone() == ("0",)
        async with pools.read.connection() as conn:
            _, total = await reads.list_items(conn, destination=DEST)
    assert total == 20


async def test_a_worker_delivers_in_order_through_the_pooler(pooled: str) -> None:
    async with MllpReceiver() as rx, running(config(rx.port), pooled) as w:
        await until(lambda: w.state.lock_held)
        async with await Pools.open(pooled, write_size=2, read_size=1) as pools:
            for start in range(0, 30, 10):
                async with pools.write.connection() as conn:
                    await queue.enqueue(conn, items(range(start, start + 10)))
        await until(lambda: delivered(pooled, 30))
    assert control_ids(rx.received) == [f"MSG{n:05d}" for n in range(30)]


async def test_two_workers_for_one_destination_never_both_send(pooled: str) -> None:
    async with MllpReceiver() as rx_a, MllpReceiver() as rx_b:
        async with running(config(rx_a.port), pooled) as a, running(config(rx_b.port), pooled) as b:
            await until(lambda: a.state.lock_held or b.state.lock_held)
            async with await AsyncConnection.connect(
                pooled, autocommit=True, prepare_threshold=None
            ) as conn:
                for start in range(0, 60, 20):
                    await queue.enqueue(conn, items(range(start, start + 20)))
            await until(lambda: delivered(pooled, 60))
            assert [a.state.lock_held, b.state.lock_held].count(True) == 1
        got = control_ids(rx_a.received) + control_ids(rx_b.received)
    assert [] in (rx_a.received, rx_b.received)  # one sender only
    assert got == [f"MSG{n:05d}" for n in range(60)]  # each once, in order


async def test_listen_on_a_direct_connection_wakes_a_pooled_worker(
    bouncer: pgbouncer.Bouncer, pooled: str, fresh_db: str
) -> None:
    """With --listen-dsn the NOTIFY of an enqueue wakes the worker; polling is off (an hour)."""
    if bouncer.pool_mode != "transaction":
        pytest.skip("a session-mode pooler keeps LISTEN on the worker's own session")
    async with MllpReceiver() as rx, running(
        config(rx.port, idle_seconds=3600), pooled, listen_dsn=fresh_db, poll_seconds=3600,
        lease=LeaseSettings(ttl_seconds=3600, renew_seconds=1800, acquire_seconds=0.2),
    ) as w:  # fmt: skip
        await until(lambda: w.state.lock_held)
        await until(lambda: listening(fresh_db))  # a NOTIFY from now on reaches the worker
        async with await AsyncConnection.connect(
            pooled, autocommit=True, prepare_threshold=None
        ) as conn:
            await queue.enqueue(conn, items([1]))
        await until(lambda: delivered(pooled, 1), timeout=20)
        assert w.state.pooling is not None and "pooled connection" in w.state.pooling
    assert control_ids(rx.received) == ["MSG00001"]


async def test_a_dead_holder_is_replaced_after_its_lease_expires(pooled: str) -> None:
    async with await AsyncConnection.connect(pooled, autocommit=True, prepare_threshold=None) as c:
        dead = await leases.acquire(c, DEST, "dead-pod:1:0", 2)
        assert dead is not None
        await queue.enqueue(c, items(range(5)))
    async with MllpReceiver() as rx, running(config(rx.port), pooled) as w:
        await asyncio.sleep(0.5)
        assert rx.received == [] and not w.state.lock_held
        await until(lambda: delivered(pooled, 5))
        assert w.lease is not None and w.lease.epoch == dead.epoch + 1
    assert control_ids(rx.received) == [f"MSG{n:05d}" for n in range(5)]
