"""Ingest's sealed store with every key cached (issue 43): the key store's lock of the keys
runs beside the first round trip (BEGIN, the log ids drawn under the channel's lock) instead of
before it, and is awaited before the COMMIT; keys the key store no longer holds as cached (an
erasure elsewhere), or a lock that answers late, make the batch give the channel's lock back,
roll back and store again the usual way, keys first. Real Postgres, ``store_batch``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec, PayloadUnreadable
from inturn.worker.crypto.keystore import StoredKey
from inturn.worker.crypto.masterkeys import FileKeyProvider
from inturn.worker.store import ingest
from inturn.worker.store.keystore import PgKeyStore
from inturn.worker.store.model import Message, StoreResult
from tests.support.ingest import to_store

pytestmark = pytest.mark.store

DEST = "ward/lab"


def adt(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|AHEAD{n:04d}|P|2.5\r"
        f"PID|1||AHEAD-{n % 2}^^^HOSP^MR||ZYZZYVA^Q\r"
    ).encode()


def message(payload: bytes) -> Message:
    return to_store(payload, "ADT^A01")


class _Hold:
    """A hold whose lock first runs ``before`` (the test's look at the queue)."""

    def __init__(self, inner: Any, before: Any) -> None:
        self.inner = inner
        self.before = before

    async def lock(self, refs: Sequence[bytes]) -> Mapping[bytes, StoredKey]:
        await self.before()
        result: Mapping[bytes, StoredKey] = await self.inner.lock(refs)
        return result


class WatchedStore(PgKeyStore):
    """The key store with a hook in front of each hold's lock."""

    before: Any = None

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[Any]:
        async with super().hold() as inner:
            yield inner if self.before is None else _Hold(inner, self.before)


async def _store(conn: AsyncConnection[Any], codec: PayloadCodec, first: int) -> list[int]:
    results: list[StoreResult] = await ingest.store_batch(
        conn,
        channel="adt",
        destinations=[DEST],
        messages=[message(adt(n)) for n in range(first, first + 3)],
        window_seconds=60,
        payloads=codec,
    )
    return [i for r in results for i in r.ids]


def _advisory_locks(dsn: str, pid: int) -> int:
    with psycopg.connect(dsn, autocommit=True) as check:
        row = check.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND granted",
            [pid],
        ).fetchone()
    return int(row[0]) if row else 0


async def _opened(dsn: str, keys_dir: Path, key_dsn: str, ids: list[int]) -> list[bytes]:
    reader = PayloadCodec(FileKeyProvider(keys_dir), PgKeyStore(key_dsn))  # type: ignore[arg-type]
    await reader.start()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id, payload FROM inturn_message WHERE id = ANY(%s) ORDER BY id", [ids]
        ).fetchall()
    return [await reader.open(i, "channel:adt", bytes(p)) for i, p in rows]


async def test_a_cached_batch_locks_its_keys_while_its_log_ids_are_drawn(
    fresh_db: str, keys_dir: Path, key_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second batch's keys are cached: its key store lock is still to run once the queue
    connection holds the channel's lock (the ids drawn), and the rows open."""
    monkeypatch.setattr(ingest, "LOCK_AHEAD_GRACE_SECONDS", 30.0)
    store = WatchedStore(key_dsn)
    codec = PayloadCodec(FileKeyProvider(keys_dir), store)  # type: ignore[arg-type]
    await codec.start()
    seen: list[bool] = []
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        pid = conn.info.backend_pid

        async def channel_locked() -> None:
            deadline = time.monotonic() + 10
            while not await asyncio.to_thread(_advisory_locks, fresh_db, pid):
                if time.monotonic() > deadline:
                    seen.append(False)
                    return
                await asyncio.sleep(0.02)
            seen.append(True)

        first = await _store(conn, codec, 0)  # keys made (not cached yet): keys first
        store.before = channel_locked
        second = await _store(conn, codec, 3)
    await store.close()
    assert seen == [True]
    assert await _opened(fresh_db, keys_dir, key_dsn, first + second) == [adt(n) for n in range(6)]


async def test_keys_gone_from_the_key_store_or_a_late_lock_give_the_channel_back(
    fresh_db: str, keys_dir: Path, key_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cached keys erased elsewhere: the batch rolls back (nothing of its first try kept) and
    is sealed under keys made again; a lock that answers after the grace: rolled back, then
    stored once it has answered."""
    store = WatchedStore(key_dsn)
    codec = PayloadCodec(FileKeyProvider(keys_dir), store)  # type: ignore[arg-type]
    await codec.start()
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        first = await _store(conn, codec, 0)
        with psycopg.connect(key_dsn, autocommit=True) as other:
            other.execute("DELETE FROM inturn_key")  # an erasure by another process
        second = await _store(conn, codec, 3)

        async def late() -> None:
            await asyncio.sleep(0.3)

        monkeypatch.setattr(ingest, "LOCK_AHEAD_GRACE_SECONDS", 0.01)
        store.before = late
        third = await _store(conn, codec, 6)
    await store.close()
    with psycopg.connect(fresh_db) as check:
        counted = check.execute(
            "SELECT (SELECT count(*) FROM inturn_message), (SELECT count(*) FROM inturn_received)"
        ).fetchone()
    assert counted == (9, 9)
    assert await _opened(fresh_db, keys_dir, key_dsn, second + third) == [
        adt(n) for n in range(3, 9)
    ]
    with pytest.raises(PayloadUnreadable):  # its key destroyed; the one made again differs
        await _opened(fresh_db, keys_dir, key_dsn, first[:1])
