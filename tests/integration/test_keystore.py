"""The key store (a second Postgres database) under the payload codec: keys per patient,
erasure by key destruction, rotation, wrong keys refused, a bounded cache (issue 31)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from inturn.worker.cli import main
from inturn.worker.crypto import envelope
from inturn.worker.crypto.codec import PayloadCodec, PayloadErased, PayloadUnreadable
from inturn.worker.crypto.masterkeys import FileKeyProvider, MasterKeyError, new_key_file
from inturn.worker.hl7.pid import index_keys, lookup_key
from inturn.worker.store.faults import KeyStoreUnavailable
from inturn.worker.store.keystore import HOLD_LOCK_TIMEOUT_MS, PgKeyStore, create_schema
from tests.support import keys

pytestmark = pytest.mark.store

MSH = b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\r"


def adt(*pid3: str) -> bytes:
    return MSH + b"PID|1||" + "~".join(pid3).encode() + b"||ZYZZYVA^QUENTIN\r"


MERGE = MSH + b"PID|1||NEW-1^^^HOSP||DOE^JO\rMRG|OLD-9^^^HOSP\r"
NOBODY = b"MSH|^~\\&|A|B|C|D|2024||MFN^M02|2|P|2.5\rMFE|MAD|1\r"


@pytest.fixture
def key_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A fresh key store database (its schema made), dropped after the test."""
    with keys.key_store(pg_server_dsn) as dsn:
        create_schema(dsn)  # idempotent
        yield dsn


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    new_key_file(tmp_path / "keys", "k1")
    return tmp_path / "keys"


async def codec_for(keys_dir: Path, key_dsn: str, **kw: int) -> PayloadCodec:
    return await keys.codec(keys_dir, key_dsn, **kw)


async def test_a_message_is_sealed_under_its_patients_keys_and_opens_in_another_process(
    keys_dir: Path, key_dsn: str
) -> None:
    writer = await codec_for(keys_dir, key_dsn)
    stored = await writer.seal(7, "lab", adt("MRN-1^^^HOSP", "MRN-2^^^HOSP"))
    assert b"ZYZZYVA" not in stored and b"MRN-1" not in stored
    assert len(envelope.header(stored).refs) == 2
    reader = await codec_for(keys_dir, key_dsn)
    assert await reader.open(7, "lab", stored) == adt("MRN-1^^^HOSP", "MRN-2^^^HOSP")
    assert reader.unwraps == 2
    with pytest.raises(PayloadUnreadable, match="item 8 does not decrypt"):
        await reader.open(8, "lab", stored)


async def test_a_patient_seen_again_reuses_the_cached_key_once_the_store_confirms_it(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    store = codec.store
    assert isinstance(store, PgKeyStore)
    await codec.seal(1, "lab", adt("MRN-1^^^HOSP"))
    trips, unwraps = store.round_trips, codec.unwraps
    await codec.seal_many([(2, "lab", adt("MRN-1^^^HOSP")), (3, "x", adt("MRN-1^^^HOSP"))])
    # one read confirms the cached key is still live (not erased): no unwrap, no new key
    assert (store.round_trips - trips, codec.unwraps - unwraps) == (1, 0)
    assert await store.masters() == {"k1": 1}


async def test_a_seal_after_an_erasure_makes_a_new_key_and_reads_back(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    first = await codec.seal(1, "lab", adt("MRN-5^^^HOSP"))
    assert await codec.erase_patient("MRN-5", "HOSP", actor="t", reason="request 3") == 1
    async with codec.sealing():  # as ingest seals: the keys held until the block ends
        again = await codec.seal(2, "lab", adt("MRN-5^^^HOSP"))
    assert envelope.header(again).refs == envelope.header(first).refs  # same reference
    reader = await codec_for(keys_dir, key_dsn)
    assert await reader.open(2, "lab", again) == adt("MRN-5^^^HOSP")
    # the erased key stays gone: the new key under the same reference does not open it
    with pytest.raises(PayloadUnreadable):
        await reader.open(1, "lab", first)


async def test_a_message_naming_nobody_is_sealed_under_its_destination_key(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    a = await codec.seal(1, "lab", NOBODY)
    b = await codec.seal(2, "pharmacy", NOBODY)
    assert envelope.header(a).kind == envelope.DESTINATION
    assert envelope.header(a).refs != envelope.header(b).refs
    assert await codec.open(2, "pharmacy", b) == NOBODY


async def test_erasing_either_patient_of_a_merge_leaves_it_unreadable_others_stay(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    merge = await codec.seal(1, "lab", MERGE)
    other = await codec.seal(2, "lab", adt("NEW-1^^^CLINIC"))  # same ID, other authority
    old = await codec.seal(3, "lab", adt("OLD-9^^^HOSP"))
    assert await codec.erase_patient("OLD-9", "HOSP", actor="t", reason="request 1") == 1
    assert await codec.erase_patient("OLD-9", "HOSP", actor="t", reason="request 1") == 0
    fresh = await codec_for(keys_dir, key_dsn)  # no cached keys
    with pytest.raises(PayloadErased, match=r"item 1 does not decrypt: a key .* was erased"):
        await fresh.open(1, "lab", merge)
    with pytest.raises(PayloadErased):
        await fresh.open(3, "lab", old)
    assert await fresh.open(2, "lab", other) == adt("NEW-1^^^CLINIC")
    # erasing by ID alone reaches every authority's key of that ID
    assert await codec.erase_patient("NEW-1", actor="t", reason="request 2") == 2
    with pytest.raises(PayloadErased):
        await (await codec_for(keys_dir, key_dsn)).open(2, "lab", other)
    store = codec.store
    assert isinstance(store, PgKeyStore)
    recorded = await store.erasures()
    assert [r["keys"] for r in recorded] == [2, 0, 1]
    assert all("OLD-9" not in str(r) and "NEW-1" not in str(r) for r in recorded)


async def test_two_processes_creating_one_patients_key_agree(keys_dir: Path, key_dsn: str) -> None:
    a, b = await codec_for(keys_dir, key_dsn), await codec_for(keys_dir, key_dsn)
    sa, sb = await asyncio.gather(
        a.seal(1, "lab", adt("RACE^^^H")), b.seal(2, "lab", adt("RACE^^^H"))
    )
    assert await b.open(1, "lab", sa) == await a.open(2, "lab", sb)


async def test_rotation_rewraps_every_key_and_the_old_master_can_go(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    stored = [await codec.seal(i, "lab", adt(f"P{i}^^^H")) for i in range(5)]
    new_key_file(keys_dir, "k2")
    rotating = await codec_for(keys_dir, key_dsn)
    status = await rotating.status()
    assert status["wrapping"] == {"k1": 5} and status["newest"] == "k2"
    assert (await rotating.status())["index_master"] == "k1"
    assert await rotating.rotate(batch=2) == 6  # five patient keys and the blind index key
    assert await rotating.rotate(batch=2) == 0
    assert (await rotating.status())["wrapping"] == {"k2": 5}
    assert (await rotating.status())["index_master"] == "k2"
    # the old master can go: without k1, everything opens and indexes as before
    (keys_dir / "k1").unlink()
    reader = await codec_for(keys_dir, key_dsn)
    assert (await reader.status())["missing"] == []
    for i, s in enumerate(stored):
        assert await reader.open(i, "lab", s) == adt(f"P{i}^^^H")
        assert reader.index_keys(adt(f"P{i}^^^H")) == codec.index_keys(adt(f"P{i}^^^H"))


async def test_a_wrong_master_key_under_the_same_name_is_refused_in_one_line(
    keys_dir: Path, key_dsn: str, tmp_path: Path
) -> None:
    await codec_for(keys_dir, key_dsn)
    other = tmp_path / "other"
    new_key_file(other, "k1")
    with pytest.raises(MasterKeyError) as caught:
        await codec_for(other, key_dsn)
    line = str(caught.value)
    assert "--payload-keys" in line and "\n" not in line and "'k1'" in line


async def test_the_cache_is_bounded_and_each_miss_is_one_unwrap(
    keys_dir: Path, key_dsn: str
) -> None:
    writer = await codec_for(keys_dir, key_dsn)
    stored = [await writer.seal(i, "lab", adt(f"C{i}^^^H")) for i in range(6)]
    reader = await codec_for(keys_dir, key_dsn, cache_keys=2)
    for _ in range(2):
        for i, s in enumerate(stored):
            await reader.open(i, "lab", s)
    assert len(reader.cache) == 2
    assert reader.unwraps == 12  # every open a miss: six patients cycle through two slots


async def test_the_blind_index_finds_the_same_identifiers_as_the_plain_one(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    msg = adt("MRN-1^^^HOSP", "MRN-2")
    keys = codec.index_keys(msg)
    assert len(keys) == len(index_keys(msg))
    assert not set(keys) & set(index_keys(msg))
    assert set(codec.lookup_keys("MRN-1", "HOSP")) & set(keys)
    assert lookup_key("MRN-1", "HOSP") in codec.lookup_keys("MRN-1", "HOSP")
    codec.dual_index = True
    assert set(codec.index_keys(msg)) == set(keys) | set(index_keys(msg))


def test_master_key_bytes_never_reach_the_key_store(keys_dir: Path, key_dsn: str) -> None:
    async def run() -> None:
        codec = await codec_for(keys_dir, key_dsn)
        await codec.seal(1, "lab", adt("MRN-1^^^HOSP"))

    asyncio.run(run())
    master = FileKeyProvider(keys_dir)._keys["k1"]
    with psycopg.connect(key_dsn) as conn:
        rows = conn.execute("SELECT ref, wrapped, lookups::text FROM inturn_key").fetchall()
    blob = b"".join(bytes(r[0]) + bytes(r[1]) + r[2].encode() for r in rows)
    assert master not in blob and b"MRN-1" not in blob


def test_the_keys_commands_init_new_status_rotate(
    pg_server_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"inturn_keys_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(pg_server_dsn, dbname=name)
    keys = tmp_path / "keys"
    try:
        main(["keys", "init", "--key-dsn", dsn, "--new-key", f"{keys}/k1"])
        asyncio.run(_seal_some(keys, dsn))
        main(["keys", "new", "--payload-keys", str(keys), "k2"])
        args = ["--payload-keys", str(keys), "--key-dsn", dsn]
        main(["keys", "status", *args])
        out = capsys.readouterr().out
        assert "k1: in the folder; wraps 3 keys; wraps the blind index key" in out
        assert "k2: in the folder; newest: new wraps" in out
        main(["keys", "rotate", *args, "--batch", "2"])
        assert "re-wrapped 4 keys" in capsys.readouterr().out  # three patients' and the index's
        main(["keys", "status", *args, "--json"])
        status = json.loads(capsys.readouterr().out)
        assert status["wrapping"] == {"k2": 3} and status["index_master"] == "k2"
        # every older master key can be retired: k1 deleted, everything still opens
        (keys / "k1").unlink()
        main(["keys", "status", *args])
        out = capsys.readouterr().out
        assert "k2: in the folder; wraps 3 keys; wraps the blind index key; newest" in out
        assert "MISSING" not in out and "k1" not in out
        asyncio.run(_open_and_find(keys, dsn))
        with pytest.raises(SystemExit) as exited:
            main(["keys", "status", "--payload-keys", str(keys)])
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err == "inturn: error: this command needs --payload-keys and --key-dsn"
        (keys / "k2").write_bytes(b"\x00" * 32)  # another key behind the name
        with pytest.raises(SystemExit):
            main(["keys", "status", *args])
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--payload-keys" in err and "'k2'" in err
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _seal_some(keys: Path, dsn: str) -> None:
    codec = await codec_for(keys, dsn)
    for i in range(3):
        SEALED[i] = await codec.seal(i, "lab", adt(f"S{i}^^^H"))
        INDEXED[i] = codec.index_keys(adt(f"S{i}^^^H"))


#: What _seal_some stored (by row id), and the patient index keys it computed.
SEALED: dict[int, bytes] = {}
INDEXED: dict[int, list[str]] = {}


async def _open_and_find(keys: Path, dsn: str) -> None:
    """With the current folder: every payload sealed before opens, and the same patient index
    keys come out (lookups by patient find the same rows)."""
    codec = await codec_for(keys, dsn)
    for i, stored in SEALED.items():
        assert await codec.open(i, "lab", stored) == adt(f"S{i}^^^H")
        assert codec.index_keys(adt(f"S{i}^^^H")) == INDEXED[i]


async def test_one_reading_gives_the_same_index_keys_and_keying_as_two(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    for msg in (adt("A^^^H", "B"), MERGE, NOBODY, adt(*[f"C{i}" for i in range(120)])):
        keys, keying = codec.index_and_keying(msg, codec.max_identifiers)
        assert keys == codec.index_keys(msg)
        expected = codec.keying(msg, "lab")
        assert keying == (None if expected.kind == envelope.DESTINATION else expected)


async def test_a_seal_waits_for_a_locked_key_at_most_the_hold_timeout_and_stores_nothing(
    keys_dir: Path, key_dsn: str
) -> None:
    codec = await codec_for(keys_dir, key_dsn)
    await codec.seal(1, "lab", adt("MRN-7^^^HOSP"))
    with psycopg.connect(key_dsn) as other:  # a second session: an erasure's DELETE in flight
        other.execute("SELECT ref FROM inturn_key FOR UPDATE")
        with pytest.raises(KeyStoreUnavailable, match=f"{HOLD_LOCK_TIMEOUT_MS} ms"):
            async with codec.sealing():
                await codec.seal(2, "lab", adt("MRN-7^^^HOSP"))
    assert isinstance(codec.store, PgKeyStore) and codec.store.health() is None  # reachable
    async with codec.sealing():  # the lock gone: the same codec seals again
        sealed = await codec.seal(3, "lab", adt("MRN-7^^^HOSP"))
    assert await codec.open(3, "lab", sealed) == adt("MRN-7^^^HOSP")
