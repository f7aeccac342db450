"""Rotating the blind index key while ingest and a worker run (issue 40, part 1;
``inturn keys rotate-index``; docs/howto/encryption.md "Rotating the blind index key").

Every message arrives once and each patient's in order (lanes compare index keys: one
patient's pending rows share a key throughout); lookups by patient find every row during and
after; no row keeps a digest of the old key; erasure finds the keys made before the rotation;
the old key is destroyed when nothing needs it, kept (and said) when an unreached key does, and
a rotation stopped after its first step is finished by the next run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.cli import main
from inturn.worker.crypto import envelope
from inturn.worker.crypto.codec import PayloadErased
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.pid import lookup_key
from inturn.worker.ingest.service import Ingest
from inturn.worker.operations import payload_keys
from inturn.worker.store import identifiers, queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys, pipeline
from tests.support.ingest import sealing_ingest, sender
from tests.support.pipeline import register
from tests.support.pipeline import worker as run_worker

#: slow (left out by make test-fast): a long run of whole parts
pytestmark = [pytest.mark.store, pytest.mark.slow]

DEST = "ward/lab"
PATIENTS = 7


def adt(n: int, mrn: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|ROT{n:05d}|P|2.5\r".encode()
        + f"PID|1||{mrn}^^^HOSP^MR||ROTATE^ANNA\r".encode()
    )


def item(payload: bytes) -> NewItem:
    header = parse_header(payload)
    return NewItem(DEST, "adt", header.control_id, header.message_type.raw, payload)


def old_digests(index: object, mrns: list[str]) -> list[str]:
    """Every lookup form of ``mrns`` under a blind index (an old one, kept by the test)."""
    return [
        lookup_key(m, a, index.identifier)  # type: ignore[attr-defined]
        for m in mrns
        for a in (None, "HOSP")
    ]


def _by_patient(messages: list[bytes]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for m in messages:
        out.setdefault(m.split(b"PID|1||")[1].split(b"^")[0].decode(), []).append(m)
    return out


async def test_a_rotation_under_load_keeps_order_lookups_and_erasure(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    register(fresh_db, DEST, "adt")
    mrns = [f"ROT-{n}" for n in range(PATIENTS)]
    before = [adt(n, mrns[n % PATIENTS]) for n in range(300)]
    during = [adt(n, mrns[n % PATIENTS]) for n in range(300, 500)]
    codec = await keys.codec(keys_dir, key_dsn)
    old_index = codec.index
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(p) for p in before], codec)
    async with MllpReceiver() as rx, Ingest(sealing_ingest(keys_dir, key_dsn), dsn=fresh_db) as ing:
        rx.delay_seconds = 0.005  # the queue drains while the rotation runs
        cfg = pipeline.worker_config(DEST, rx.port, channel="adt", lanes=4)
        async with run_worker(cfg, fresh_db, payloads=await keys.codec(keys_dir, key_dsn)):

            async def send() -> None:
                async with sender(ing) as client:
                    for payload in during:
                        await client.send(payload)
                        await asyncio.sleep(0.02)

            async def rotate() -> payload_keys.IndexRotation:
                mine = await keys.codec(keys_dir, key_dsn)
                async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                    return await payload_keys.rotate_index(conn, mine, actor="test", batch=41)

            _, done = await asyncio.gather(send(), rotate())
            await rx.wait_for(len(before) + len(during), timeout=90)
    # once each, and each patient's messages in order (lanes keep a patient's order)
    assert sorted(rx.received) == sorted(before + during)
    assert _by_patient(rx.received) == _by_patient(before + during)
    assert done.finished and (done.generation, done.unreached, done.open_orders) == (2, 0, 0)
    assert done.rows > 0 and done.keys >= PATIENTS
    fresh = await keys.codec(keys_dir, key_dsn)
    assert (fresh.generation, fresh.rotation, fresh.previous) == (2, "", None)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        found = 0
        for mrn in mrns:
            found += len(await identifiers.find_patient(conn, mrn, payloads=fresh))
        assert found == len(before) + len(during)
        cur = await conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE patient_keys && %s",
            (old_digests(old_index, mrns),),
        )
        assert (await cur.fetchone()) == (0,)  # no digest of the old key is left
        cur = await conn.execute("SELECT action, why FROM inturn_audit WHERE action LIKE 'index-%'")
        audited = await cur.fetchall()
        assert [a for a, _ in audited] == ["index-rotated"]
        # an erasure finds the key made before the rotation, under the new key alone, and the
        # one made under the new index key when the patient was seen again after the switch:
        # exactly the keys the patient's stored messages are sealed under
        mine = [f"ROT{n:05d}" for n in range(0, len(before) + len(during), PATIENTS)]
        cur = await conn.execute(
            "SELECT payload FROM inturn_delivery WHERE control_id = ANY(%s)"
            " AND payload IS NOT NULL UNION ALL"
            " SELECT payload FROM inturn_message WHERE control_id = ANY(%s)",
            (mine, mine),
        )
        refs = {r for (p,) in await cur.fetchall() for r in envelope.header(bytes(p)).refs}
        assert len(refs) in (1, 2)
        destroyed = await fresh.erase_patient(mrns[0], actor="dpo", reason="request 1")
        assert destroyed == len(refs)
        cur = await conn.execute(
            "SELECT id, payload FROM inturn_delivery WHERE control_id = %s", ("ROT00000",)
        )
        row_id, stored = await cur.fetchone()  # type: ignore[misc]
    with pytest.raises(PayloadErased):
        await fresh.open(row_id, DEST, bytes(stored))
    with psycopg.connect(key_dsn) as kconn:
        names = {r[0] for r in kconn.execute("SELECT name FROM inturn_key_setting")}
    assert "index_previous" not in names  # the old index key is destroyed


async def test_a_key_no_message_names_keeps_the_old_index_key_until_it_is_erased(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(adt(1, "KEPT-1")), item(adt(2, "GONE-1"))], codec)
        # GONE-1's message was purged: its key protects only the copies in backups
        await conn.execute("DELETE FROM inturn_delivery WHERE control_id = 'ROT00002'")
        done = await payload_keys.rotate_index(conn, codec, actor="test", settle_seconds=0)
        assert (done.finished, done.unreached) == (False, 1)
        fresh = await keys.codec(keys_dir, key_dsn)
        assert fresh.rotation == "retired" and fresh.previous is not None
        # the unreached key is still found by an erasure (through the kept old key) ...
        assert await fresh.erase_patient("GONE-1", actor="dpo", reason="request 2") == 1
        # ... after which nothing needs the old key: the next run destroys it
        again = await payload_keys.rotate_index(conn, fresh, actor="test", settle_seconds=0)
        assert (again.finished, again.unreached, again.generation) == (True, 0, 2)
        assert len(await identifiers.find_patient(conn, "KEPT-1", payloads=fresh)) == 1
        cur = await conn.execute(
            "SELECT action FROM inturn_audit WHERE action LIKE 'index-%' ORDER BY id"
        )
        assert [r[0] for r in await cur.fetchall()] == ["index-rotation-kept", "index-rotated"]


async def test_a_rotation_stopped_after_its_first_step_is_finished_by_the_next_run(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(adt(n, f"STOP-{n % 3}")) for n in range(30)], codec)
        assert await codec.begin_index_rotation()
        assert not await codec.begin_index_rotation()  # one rotation at a time
        # stopped here: rows hold the old form only, lookups still find them (both searched)
        stale = await keys.codec(keys_dir, key_dsn)
        assert stale.rotation == "dual" and stale.generation == 2
        assert len(await identifiers.find_patient(conn, "STOP-1", payloads=stale)) == 10
        # a row stored now carries both forms
        await queue.enqueue(conn, [item(adt(99, "STOP-1"))], stale)
        done = await payload_keys.rotate_index(conn, stale, actor="test", settle_seconds=0)
        assert done.finished
        fresh = await keys.codec(keys_dir, key_dsn)
        assert len(await identifiers.find_patient(conn, "STOP-1", payloads=fresh)) == 11


def test_the_command_rotates_and_status_says_the_generation(
    fresh_db: str, keys_dir: Path, key_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def seal() -> None:
        codec = await keys.codec(keys_dir, key_dsn)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await queue.enqueue(conn, [item(adt(1, "CLI-R1"))], codec)

    asyncio.run(seal())
    keyed = ["--payload-keys", str(keys_dir), "--key-dsn", key_dsn]
    main(["keys", "rotate-index", "--dsn", fresh_db, "--who", "ops", *keyed])
    out = capsys.readouterr().out
    assert "blind index key generation 2: 2 row(s) and 2 patient key(s) re-indexed" in out
    assert "the previous key is destroyed" in out
    main(["keys", "status", *keyed])
    assert "blind index key: generation 2\n" in capsys.readouterr().out


async def test_a_rotation_begun_while_keys_rotate_rewraps_the_index_key_still_begins(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """``keys rotate`` re-wraps the current index key (the same key under the newest master
    key) between the rotation's read of it and its compare and set: the start reads it again
    and begins, rather than going on with no rotation under way and auditing one. A second
    session holds the setting's row while the start waits, re-wraps it and commits."""
    codec = await keys.codec(keys_dir, key_dsn)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(adt(n, f"RACE-{n % 2}")) for n in range(6)], codec)
    keys.master_keys(keys_dir, "k2")
    codec = await keys.codec(keys_dir, key_dsn)  # a run started with k1 and k2 in the folder
    rewrapper = await keys.codec(keys_dir, key_dsn)  # k2 is its newest master key
    rewrapped = await rewrapper._wrap_index(rewrapper._index().key)
    assert rewrapped.startswith("k2:")
    with psycopg.connect(key_dsn) as holder:
        holder.execute(
            "SELECT value FROM inturn_key_setting WHERE name = 'index_wrapped' FOR UPDATE"
        )
        beginning = asyncio.create_task(codec.begin_index_rotation())
        async with asyncio.timeout(20):  # the start waits on the row, its old value read
            while True:
                with psycopg.connect(key_dsn, autocommit=True) as look:
                    row = look.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    ).fetchone()
                if row and row[0]:
                    break
                await asyncio.sleep(0.05)
        holder.execute(
            "UPDATE inturn_key_setting SET value = %s WHERE name = 'index_wrapped'", (rewrapped,)
        )
        holder.commit()
        assert await beginning is True
    assert (codec.rotation, codec.generation) == ("dual", 2)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        done = await payload_keys.rotate_index(conn, codec, actor="test", settle_seconds=0)
        assert (done.finished, done.generation) == (True, 2)
        fresh = await keys.codec(keys_dir, key_dsn)
        assert len(await identifiers.find_patient(conn, "RACE-1", payloads=fresh)) == 3
