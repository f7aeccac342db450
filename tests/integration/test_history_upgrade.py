"""Upgrading in place to history by the partition (issue 37), online: a database of the schema
before it (0033) whose hot table holds thousands of delivered rows is migrated while ingest
accepts a steady feed and a worker delivers it; then the maintenance moves the old rows to
history in bounded batches, still under traffic. Nothing is lost or reordered, no AA waits a
second, no session waits a second for a lock (each batch is a statement of its own), the pending
rows stay hot, and the old rows are found where they went."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.store import history, reads
from inturn.worker.store.migrate import migrate
from inturn.worker.testing import MllpReceiver
from tests.support import pipeline
from tests.support.db import lock_waits, migrate_below
from tests.support.ingest import sender
from tests.support.pipeline import worker as run_worker

pytestmark = pytest.mark.store

BEFORE = 34  # migration 0034 made history
DEST = "ward/up"
OLD_ROWS = 20_000
BATCH = 1000


def adt(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|LIVE{n:05d}|P|2.5\r".encode()
        + f"PID|1||MRN-{n % 5}^^^HOSP^MR||LIVE^LARA\r".encode()
    )


def seed_old_rows(dsn: str) -> None:
    """A month of delivered rows in the hot table, as the release before left them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, attempts, finished_at, enqueued_at)"
            " SELECT %s, 'adt', 'OLD' || g, 'ADT^A01', convert_to('MSH|^~\\&|OLD' || g, 'UTF8'),"
            " 12, 'delivered', 1, now() - interval '2 days', now() - interval '2 days'"
            " FROM generate_series(1, %s) AS g",
            (DEST, OLD_ROWS),
        )


async def never_stop() -> bool:
    return True


@pytest.mark.slow  # under traffic: left out by make test-fast
async def test_an_online_upgrade_moves_the_old_rows_under_traffic(empty_db: str) -> None:
    migrate_below(empty_db, BEFORE)
    seed_old_rows(empty_db)
    pipeline.register(empty_db, DEST, "adt")
    config = IngestConfig(
        listeners=[ListenerConfig("adt", "127.0.0.1", 0)],
        refresh_seconds=0.2,
        store_timeout=5.0,
        shutdown_grace=2.0,
    )
    sent: list[bytes] = []
    latencies: list[float] = []
    upgraded = asyncio.Event()
    moved: list[int] = []
    longest = [0.0]
    async with MllpReceiver() as rx, Ingest(config, dsn=empty_db) as running:
        cfg = pipeline.worker_config(DEST, rx.port, channel="adt")
        async with run_worker(cfg, empty_db):

            async def feed() -> None:
                n = 0
                async with sender(running) as client:
                    while not upgraded.is_set() or n < 150:
                        payload = adt(n)
                        started = time.monotonic()
                        await client.send(payload)  # AA, or DeliveryError
                        latencies.append(time.monotonic() - started)
                        sent.append(payload)
                        n += 1
                        await asyncio.sleep(0.02)

            async def upgrade() -> None:
                await asyncio.sleep(0.5)
                await asyncio.to_thread(migrate, empty_db)
                settings = history.Settings(
                    retention_seconds=86400 * 30, hot_seconds=900, batch=BATCH
                )
                async with await AsyncConnection.connect(empty_db, autocommit=True) as conn:
                    moved.append(await history.move(conn, settings, never_stop))
                upgraded.set()

            watching = asyncio.create_task(lock_waits(empty_db, upgraded, longest))
            await asyncio.gather(feed(), upgrade())
            await watching
            await rx.wait_for(len(sent), timeout=60)
    assert rx.received == sent  # every message once, in order
    # The promise is an AA gap under 1 s (measured here well under it on an idle machine); the
    # bound leaves room for a loaded shared machine while still catching what it guards
    # against: a migration or a move holding a lock ingest waits on (seconds to minutes).
    assert max(latencies) < 2.0, sorted(latencies)[-5:]
    assert moved == [OLD_ROWS]
    assert longest[0] < 1.0, longest  # no session waited a second for a lock
    with psycopg.connect(empty_db) as conn:
        hot = conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE control_id LIKE 'OLD%'"
        ).fetchone()
        old = conn.execute(
            "SELECT count(*) FROM inturn_history WHERE control_id LIKE 'OLD%'"
        ).fetchone()
        live = conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE control_id LIKE 'LIVE%'"
        ).fetchone()
    assert (hot, old, live) == ((0,), (OLD_ROWS,), (len(sent),))
    async with await AsyncConnection.connect(empty_db, autocommit=True) as conn:
        found, total = await reads.list_items(conn, control_id="OLD12345")
        assert total == 1 and found[0].state == "delivered"
