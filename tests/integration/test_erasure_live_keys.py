"""An erasure by patient against a running ingest that seals (issue 31, the new-user trial's
data loss): ingest must never seal a message under a key the erasure destroyed. A message for
the patient stored after the erasure decrypts; one stored while the erasure runs is erased with
the others or decrypts, never left unreadable. Real Postgres, the Ingest service in-process,
the erasure through ``inturn queue erase``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from pathlib import Path

import psycopg
import pytest

from inturn.worker.cli import main
from inturn.worker.crypto.codec import PayloadErased
from inturn.worker.ingest.service import Ingest
from tests.support import keys
from tests.support.ingest import pull_all, sealing_ingest, sender
from tests.support.pipeline import register

pytestmark = pytest.mark.store

DEST = "ward/records"


def adt(n: int, mrn: str) -> bytes:
    """An ADT^A08 naming patient ``mrn`` (assigned by HOSP), MSH-10 ``ERA<n>``."""
    return (
        f"MSH|^~\\&|REG|HOSP|REC|HOSP|20261201090000||ADT^A08|ERA{n:04d}|P|2.5\r"
        f"PID|1||{mrn}^^^HOSP^MR||QUILLFEATHER^ODA\r"
    ).encode()


def _erase(dsn: str, keyed: list[str], patient: str) -> dict[str, object]:
    """``inturn queue erase --patient-id`` (the CLI, run in a thread by the tests)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(
            [
                *("queue", "erase", "--dsn", dsn, "--patient-id", patient, "--who", "dpo"),
                *("--why", "request 11", "--json", *keyed),
            ]
        )
    return dict(json.loads(out.getvalue()))


def _stored(dsn: str) -> list[tuple[int, str, bytes]]:
    """Each message of the destination's queue, the channel log pulled first (as its worker
    does): the binding its envelope was sealed under (a log row's id and channel) and the
    stored bytes."""
    pull_all(dsn)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT coalesce(d.seal_id, m.id, d.id), coalesce(d.seal_scope,"
            " CASE WHEN m.id IS NOT NULL THEN 'channel:' || m.channel END, d.destination),"
            " coalesce(d.payload, m.payload)"
            " FROM inturn_delivery d LEFT JOIN inturn_message m ON m.id = d.message_id"
            " ORDER BY d.id"
        ).fetchall()
    return [(int(i), str(scope), bytes(p)) for i, scope, p in rows]


async def test_a_message_stored_after_an_erasure_by_the_same_ingest_decrypts(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    register(fresh_db, DEST, "adt")
    keyed = ["--payload-keys", str(keys_dir), "--key-dsn", key_dsn]
    config = sealing_ingest(keys_dir, key_dsn)
    async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
        await client.send(adt(1, "GONE-1"))
        await client.send(adt(2, "STAYS-1"))
        done = await asyncio.to_thread(_erase, fresh_db, keyed, "GONE-1")
        assert done["keysDestroyed"] == 1 and len(done["erased"]) == 1  # type: ignore[arg-type]
        await client.send(adt(3, "GONE-1"))  # the patient again, the same running ingest
    reader = await keys.codec(keys_dir, key_dsn)
    opened = [await reader.open(i, scope, p) for i, scope, p in _stored(fresh_db)]
    assert opened == [adt(2, "STAYS-1"), adt(3, "GONE-1")]


async def test_a_reader_that_cached_the_erased_key_opens_the_message_stored_since(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """A worker opened the patient's first message (so cached its key) before the erasure; the
    key made again under the same reference for the message stored since is read from the key
    store when the cached one does not open it, so the worker goes on without a restart."""
    register(fresh_db, DEST, "adt")
    keyed = ["--payload-keys", str(keys_dir), "--key-dsn", key_dsn]
    config = sealing_ingest(keys_dir, key_dsn)
    reader = await keys.codec(keys_dir, key_dsn)  # the worker's codec, kept across the erasure
    async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
        await client.send(adt(1, "AGAIN-1"))
        [(first, scope, payload)] = _stored(fresh_db)
        assert await reader.open(first, scope, payload) == adt(1, "AGAIN-1")
        cached = len(reader.cache)
        done = await asyncio.to_thread(_erase, fresh_db, keyed, "AGAIN-1")
        assert done["keysDestroyed"] == 1 and len(done["erased"]) == 1  # type: ignore[arg-type]
        await client.send(adt(2, "AGAIN-1"))
    [(second, scope, payload)] = _stored(fresh_db)
    assert second > first and len(reader.cache) == cached  # still holding the erased key
    assert await reader.open(second, scope, payload) == adt(2, "AGAIN-1")


def _key_store_waiters(key_dsn: str) -> int:
    with psycopg.connect(key_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


async def _wait_for(check: object, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(check):  # type: ignore[arg-type]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_message_sealed_while_the_erasure_runs_is_erased_with_the_others(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """The message is sealed (its key confirmed) and then held before its commit by a second
    session holding the destination's enqueue lock; the erasure runs meanwhile. Its key's
    destruction waits for the seal's commit, and then the row is found and erased."""
    register(fresh_db, DEST, "adt")
    keyed = ["--payload-keys", str(keys_dir), "--key-dsn", key_dsn]
    config = sealing_ingest(keys_dir, key_dsn)
    async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
        await client.send(adt(1, "RACE-1"))  # the key made and cached
        with psycopg.connect(fresh_db) as blocker:
            # ingest's lock on the channel's log (issue 43), held until the blocker is done
            blocker.execute("SELECT inturn_enqueue_lock(%s)", ["channel:adt"])
            sent = asyncio.create_task(client.send(adt(2, "RACE-1")))

            def ingest_waits() -> bool:
                with psycopg.connect(fresh_db, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database() AND pid <> %s",
                        [blocker.info.backend_pid],
                    ).fetchone()
                return bool(row and row[0])

            await _wait_for(ingest_waits, "ingest to wait on the enqueue lock")
            erasing = asyncio.create_task(asyncio.to_thread(_erase, fresh_db, keyed, "RACE-1"))
            # the erasure's key destruction waits for the seal in flight (or is done)
            await _wait_for(
                lambda: erasing.done() or _key_store_waiters(key_dsn) > 0,
                "the erasure to wait for the seal in flight",
            )
            blocker.rollback()
        await asyncio.wait_for(sent, 10)
        done = await asyncio.wait_for(erasing, 30)
    assert done["keysDestroyed"] == 1
    reader = await keys.codec(keys_dir, key_dsn)
    for i, scope, payload in _stored(fresh_db):
        try:
            await reader.open(i, scope, payload)
        except PayloadErased:
            pytest.fail(f"item {i} is stored and sealed under an erased key")
    assert _stored(fresh_db) == []
