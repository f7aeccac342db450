"""Upgrading in place to ingest writing the channel log (issue 43, migration 0041), online: a
database of the schema before it, holding pending rows of the release before (one per
destination, each with its payload), is migrated while the new ingest accepts a steady feed
for three destinations (one of them filtered) and their workers deliver it, in clear and with
payload keys. Until the migration commits, ingest stores as the release before did; within a
second after, each message once in the log. Nothing is lost, duplicated or reordered at any
destination, no session waits a second for a lock (so no AA waits on the migration), and the
old rows are delivered with their own binding."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path

import psycopg
import pytest

from inturn.worker.crypto import envelope
from inturn.worker.hl7.header import parse_header
from inturn.worker.ingest.service import Ingest
from inturn.worker.store import queue
from inturn.worker.store.migrate import Q as MQ
from inturn.worker.store.migrate import available, migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys, pipeline
from tests.support.db import lock_waits
from tests.support.ingest import sealing_ingest, sender
from tests.support.pipeline import worker as run_worker

#: slow (left out by make test-fast): a long run of whole parts
pytestmark = [pytest.mark.store, pytest.mark.slow]

BEFORE = 41  # migration 0041: ingest writes the channel log
ALL = ("ward/a", "ward/b")
FILTERED = "ward/f"  # takes ADT^A04 only: one message in ten


def adt(n: int) -> bytes:
    event = "A04" if n % 10 == 0 else "A01"
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^{event}|UPL{n:05d}|P|2.5\r".encode()
        + f"PID|1||MRN-{n % 5}^^^HOSP^MR||LOG^LENA\r".encode()
    )


def migrate_before(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(MQ["ensure_table"])
        for m in available():
            if m.version < BEFORE:
                conn.execute(m.sql.encode())
                conn.execute(MQ["record"], {"version": m.version, "name": m.name})


def item(destination: str, payload: bytes) -> NewItem:
    header = parse_header(payload)
    return NewItem(destination, "adt", header.control_id, header.message_type.raw, payload)


def takes(destination: str, payload: bytes) -> bool:
    return destination != FILTERED or b"ADT^A04" in payload


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
async def test_ingest_moves_to_the_log_under_traffic(
    empty_db: str, keys_dir: Path, key_dsn: str, sealed: bool
) -> None:
    migrate_before(empty_db)
    for destination in ALL:
        pipeline.register(empty_db, destination, "adt")
    pipeline.register(empty_db, FILTERED, "adt", ["ADT^A04"])
    codec = await keys.codec(keys_dir, key_dsn) if sealed else None
    old = [adt(n) for n in range(-30, 0)]
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        for destination in (*ALL, FILTERED):
            mine = [item(destination, p) for p in old if takes(destination, p)]
            await queue.enqueue(conn, mine, codec)
    config = sealing_ingest(keys_dir, key_dsn)
    if not sealed:
        config = dataclasses.replace(config, payload_keys=None, key_dsn=None)
    sent: list[bytes] = []
    latencies: list[float] = []
    upgraded = asyncio.Event()
    receivers = {d: MllpReceiver() for d in (*ALL, FILTERED)}
    async with contextlib.AsyncExitStack() as stack:
        for rx in receivers.values():
            await stack.enter_async_context(rx)
        running = await stack.enter_async_context(Ingest(config, dsn=empty_db))
        for destination, rx in receivers.items():
            cfg = pipeline.worker_config(destination, rx.port, channel="adt")
            payloads = await keys.codec(keys_dir, key_dsn) if sealed else None
            await stack.enter_async_context(run_worker(cfg, empty_db, payloads=payloads))

        async def feed() -> None:
            n = after = 0
            async with sender(running) as client:
                while after < 100:  # 100 messages (two seconds) once the migration is in
                    after += upgraded.is_set()
                    payload = adt(n)
                    started = time.monotonic()
                    await client.send(payload)  # AA, or DeliveryError
                    latencies.append(time.monotonic() - started)
                    sent.append(payload)
                    n += 1
                    await asyncio.sleep(0.02)

        async def upgrade() -> None:
            await asyncio.sleep(0.8)
            await asyncio.to_thread(migrate, empty_db)
            upgraded.set()

        longest = [0.0]
        watching = asyncio.create_task(lock_waits(empty_db, upgraded, longest))
        await asyncio.gather(feed(), upgrade())
        await watching
        for destination, rx in receivers.items():
            wanted = [p for p in old + sent if takes(destination, p)]
            await rx.wait_for(len(wanted), timeout=60)
        await asyncio.sleep(0.5)  # a duplicate would have come by now
    for destination, rx in receivers.items():
        wanted = [p for p in old + sent if takes(destination, p)]
        assert rx.received == wanted, destination  # once each, in order, unchanged
    # The promise is no AA waiting a second on the migration: what would break it is a lock
    # ingest waits on, seen directly (pg_locks); the AA times themselves get room for a loaded
    # shared machine (one reached 1.02 s at load 5: loop pass 12 of 56dd786), as
    # test_history_upgrade's do.
    assert longest[0] < 1.0, longest  # no session waited a second for a lock
    assert max(latencies) < 2.0, sorted(latencies)[-5:]
    with psycopg.connect(empty_db) as conn:
        kinds = conn.execute(
            "SELECT count(*) FILTER (WHERE message_id IS NULL AND payload IS NOT NULL),"
            " count(*) FILTER (WHERE message_id IS NOT NULL AND payload IS NULL)"
            " FROM inturn_delivery"
        ).fetchone()
        logged = conn.execute("SELECT payload FROM inturn_message ORDER BY id").fetchall()
    assert kinds is not None
    before_rows, slim_rows = kinds
    assert before_rows >= len(old) * 2  # the old rows, and what came before the migration
    # after it: each message once in the log, its destinations pulling slim rows
    assert 50 <= len(logged) < len(sent) and slim_rows >= 2 * len(logged)
    assert all(envelope.is_envelope(bytes(p)) == sealed for (p,) in logged)
