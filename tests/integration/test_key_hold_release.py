"""A seal's hold in the key store released after its block (issue 43): ingest's key store
(``release_after``) leaves a finished hold's row locks to the next hold on its connection,
which commits them in front of its first lock in the same round trip, or to an idle release
a moment later; the key store's default commits them as the block ends. Either way an
erasure waits for the hold and then destroys the key. Real Postgres."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.masterkeys import FileKeyProvider
from inturn.worker.store.keystore import PgKeyStore

pytestmark = pytest.mark.store

ADT = b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\rPID|1||HOLD-1^^^HOSP||ZYZZYVA^Q\r"


async def _codec(keys_dir: Path, key_dsn: str, release_after: float | None) -> PayloadCodec:
    store = PgKeyStore(key_dsn, release_after=release_after)
    codec = PayloadCodec(FileKeyProvider(keys_dir), store)  # type: ignore[arg-type]
    await codec.start()
    return codec


def _key_locked(key_dsn: str) -> bool:
    """Whether a session holds a row lock on a key (another session cannot take one)."""
    with psycopg.connect(key_dsn) as conn:
        try:
            conn.execute("SELECT ref FROM inturn_key FOR UPDATE NOWAIT").fetchall()
        except psycopg.errors.LockNotAvailable:
            return True
        return False


async def _seal_held(codec: PayloadCodec, item: int) -> None:
    async with codec.sealing():  # as ingest stores a batch
        await codec.seal(item, "lab", ADT)


async def test_a_finished_hold_stays_until_the_next_hold_locks_or_its_idle_time_ends(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await _codec(keys_dir, key_dsn, release_after=0.5)
    store = codec.store
    assert isinstance(store, PgKeyStore)
    try:
        await codec.seal(1, "lab", ADT)  # the key made and cached, outside a hold
        trips = store.round_trips
        await _seal_held(codec, 2)
        # the block cost its lock alone (no COMMIT of its own), and the lock is still there
        assert store.round_trips - trips == 1
        assert await asyncio.to_thread(_key_locked, key_dsn)
        await _seal_held(codec, 3)  # releases the hold before in its lock: one trip again
        assert store.round_trips - trips == 2
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(_key_locked, key_dsn):  # released once idle 0.5 s
            assert time.monotonic() < deadline, "a finished hold was never released"
            await asyncio.sleep(0.1)
        await _seal_held(codec, 4)
        # an erasure waits for a hold, then destroys the key (the release is not stuck)
        erased = await asyncio.wait_for(
            codec.erase_patient("HOLD-1", "HOSP", actor="t", reason="r"), 10
        )
        assert erased == 1
    finally:
        await store.close()
    assert not await asyncio.to_thread(_key_locked, key_dsn)


async def test_by_default_a_hold_commits_as_its_block_ends(keys_dir: Path, key_dsn: str) -> None:
    codec = await _codec(keys_dir, key_dsn, release_after=None)
    store = codec.store
    assert isinstance(store, PgKeyStore)
    try:
        await codec.seal(1, "lab", ADT)
        trips = store.round_trips
        await _seal_held(codec, 2)
        assert store.round_trips - trips == 1  # its lock (the COMMIT is not counted)
        assert not await asyncio.to_thread(_key_locked, key_dsn)
    finally:
        await store.close()
