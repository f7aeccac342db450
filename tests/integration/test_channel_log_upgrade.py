"""The channel log's migration (0033, issue 43) upgrades a database in place: the rows stored
before it, plain and sealed, keep their payload and their binding and are delivered after it,
in order, none lost; the new tables are there with their partition and indexes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.crypto import envelope
from inturn.worker.hl7.header import parse_header
from inturn.worker.store import queue
from inturn.worker.store.migrate import available, migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys, pipeline
from tests.support.db import migrate_below
from tests.support.pipeline import worker as run_worker

pytestmark = pytest.mark.store

LOG = 33
PLAIN = "ward/plain"
SEALED = "ward/sealed"


def adt(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|UP{n:05d}|P|2.5\r".encode()
        + f"PID|1||MRN-{n % 3}^^^HOSP^MR||UPGRADE^QUENTIN\r".encode()
    )


def item(destination: str, payload: bytes) -> NewItem:
    header = parse_header(payload)
    return NewItem(destination, "adt", header.control_id, header.message_type.raw, payload)


async def states(dsn: str, destination: str) -> list[str]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT state FROM inturn_delivery WHERE destination = %s ORDER BY id", (destination,)
        )
        return [r[0] for r in await cur.fetchall()]


async def test_pending_rows_plain_and_sealed_are_delivered_after_the_upgrade(
    empty_db: str, keys_dir: Path, key_dsn: str
) -> None:
    migrate_below(empty_db, LOG)
    codec = await keys.codec(keys_dir, key_dsn)
    plain = [adt(n) for n in range(5)]
    sealed = [adt(100 + n) for n in range(5)]
    async with await AsyncConnection.connect(empty_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(PLAIN, p) for p in plain])
        await queue.enqueue(conn, [item(SEALED, p) for p in sealed], codec)
    applied = migrate(empty_db)
    assert [m.version for m in applied] == [m.version for m in available() if m.version >= LOG]
    with psycopg.connect(empty_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT destination, payload, message_id, seal_id, seal_scope FROM inturn_delivery"
            " ORDER BY id"
        ).fetchall()
        # the rows keep their own payload and their binding (their own id and destination)
        assert [(r[2], r[3], r[4]) for r in rows] == [(None, None, None)] * 10
        assert [bytes(r[1]) for r in rows if r[0] == PLAIN] == plain
        assert all(envelope.is_envelope(bytes(r[1])) for r in rows if r[0] == SEALED)
        assert conn.execute("SELECT n, lo, hi FROM inturn_epoch").fetchall() == [(1, 1, 2**40)]
        parts = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'inturn_message'::regclass"
        ).fetchall()
        assert parts == [("inturn_message_e1",)]
        indexes = {
            r[0]
            for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'inturn_message_e1'"
            ).fetchall()
        }
        assert any("USING btree (channel, id)" in d for d in indexes)
        assert any("USING hash (control_id)" in d for d in indexes)
        assert any("USING gin (patient_keys)" in d for d in indexes)
    reader = await keys.codec(keys_dir, key_dsn)  # the worker's own process: a cold cache
    for destination, sent, payloads in ((PLAIN, plain, None), (SEALED, sealed, reader)):
        async with MllpReceiver() as rx:
            config = pipeline.worker_config(destination, rx.port, channel="adt")
            async with run_worker(config, empty_db, payloads=payloads):
                await rx.wait_for(len(sent))
                async with asyncio.timeout(10):
                    while any(s != "delivered" for s in await states(empty_db, destination)):
                        await asyncio.sleep(0.05)
        assert rx.received == sent, destination  # 0 lost, in order, unchanged
