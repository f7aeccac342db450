"""Every master key is retirable (issue 40, part 1; docs/howto/encryption.md, "Rotating master
keys"): on a key store made by a version that derived the blind index key from its first master
key, with patient keys under two older master keys and a blind index key rotation keeping its
previous key, ``inturn keys rotate`` under a third, then EVERY older master key file deleted:
``keys status`` names nothing missing, every payload opens (a real worker delivers every
message, in order), every lookup by patient finds its rows, an erasure by patient still reaches
a key only the previous index key finds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.cli import main
from inturn.worker.crypto.codec import INDEX_MASTER, INDEX_WRAPPED
from inturn.worker.crypto.masterkeys import new_key_file
from inturn.worker.hl7.header import parse_header
from inturn.worker.operations import payload_keys
from inturn.worker.store import identifiers, queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys, pipeline
from tests.support.pipeline import register
from tests.support.pipeline import worker as run_worker

pytestmark = pytest.mark.store

DEST = "ward/retire"


def adt(n: int, mrn: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|RET{n:04d}|P|2.5\r".encode()
        + f"PID|1||{mrn}^^^HOSP^MR||RETIRE^ROSA\r".encode()
    )


def item(payload: bytes) -> NewItem:
    header = parse_header(payload)
    return NewItem(DEST, "adt", header.control_id, header.message_type.raw, payload)


def _settings(key_dsn: str) -> dict[str, str]:
    with psycopg.connect(key_dsn) as kconn:
        return dict(kconn.execute("SELECT name, value FROM inturn_key_setting").fetchall())


def test_every_older_master_key_can_go_after_rotate(
    fresh_db: str, tmp_path: Path, key_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = keys.master_keys(tmp_path / "keys", "k1")
    keyed = ["--payload-keys", str(folder), "--key-dsn", key_dsn]
    register(fresh_db, DEST, "adt")
    sent: list[bytes] = []

    async def enqueue(payloads: list[bytes]) -> None:
        codec = await keys.codec(folder, key_dsn)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await queue.enqueue(conn, [item(p) for p in payloads], codec)
        sent.extend(payloads)

    # 1. A key store as a version before the index key was stored wrapped left it: the index
    #    key derived from k1 (recorded as index_master), the patient keys under k1.
    asyncio.run(enqueue([adt(n, f"OLD-{n % 3}") for n in range(9)]))
    with psycopg.connect(key_dsn, autocommit=True) as kconn:
        kconn.execute("DELETE FROM inturn_key_setting WHERE name = %s", (INDEX_WRAPPED,))
    assert set(_settings(key_dsn)) == {INDEX_MASTER, "index_check"}
    assert _settings(key_dsn)[INDEX_MASTER] == "k1"

    # 2. k2 arrives: new patients' keys under it; the index key is still k1's derivation (read
    #    once from k1, then kept wrapped under k2)
    new_key_file(folder, "k2")
    asyncio.run(enqueue([adt(n, f"MID-{n % 3}") for n in range(9, 18)]))
    assert _settings(key_dsn)[INDEX_WRAPPED].startswith("k2:")

    # 3. A blind index key rotation that keeps its previous key (a patient key no stored
    #    message names: its message was purged), wrapped under k2
    async def rotate_index_keeping() -> payload_keys.IndexRotation:
        codec = await keys.codec(folder, key_dsn)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await queue.enqueue(conn, [item(adt(99, "PURGED-1"))], codec)
            await conn.execute("DELETE FROM inturn_delivery WHERE control_id = 'RET0099'")
            return await payload_keys.rotate_index(conn, codec, actor="test", settle_seconds=0)

    kept = asyncio.run(rotate_index_keeping())
    assert (kept.finished, kept.unreached, kept.generation) == (False, 1, 2)
    assert _settings(key_dsn)["index_previous"].startswith("k2:")

    # 4. k3 is the newest; keys rotate re-wraps every patient key and both index keys
    new_key_file(folder, "k3")
    asyncio.run(enqueue([adt(n, f"NEW-{n % 3}") for n in range(18, 27)]))
    main(["keys", "status", *keyed, "--json"])
    before = json.loads(capsys.readouterr().out)
    assert (before["index_master"], before["index_previous_master"]) == ("k2", "k2")
    assert set(before["wrapping"]) == {"k1", "k2", "k3"}
    main(["keys", "rotate", *keyed, "--batch", "2"])
    assert "re-wrapped" in capsys.readouterr().out
    main(["keys", "status", *keyed, "--json"])
    after = json.loads(capsys.readouterr().out)
    assert set(after["wrapping"]) == {"k3"}
    assert (after["index_master"], after["index_previous_master"]) == ("k3", "k3")

    # 5. EVERY older master key file deleted
    (folder / "k1").unlink()
    (folder / "k2").unlink()
    main(["keys", "status", *keyed])
    out = capsys.readouterr().out
    assert "MISSING" not in out and "k1" not in out and "k2" not in out
    assert "k3: in the folder; wraps" in out and "wraps the previous blind index key" in out
    main(["keys", "status", *keyed, "--json"])
    assert json.loads(capsys.readouterr().out)["missing"] == []

    async def read_everything() -> tuple[dict[str, int], int, list[bytes]]:
        codec = await keys.codec(folder, key_dsn)  # starts: nothing it needs is missing
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            found = {
                mrn: len(await identifiers.find_patient(conn, mrn, payloads=codec))
                for mrn in [f"{p}-{n}" for p in ("OLD", "MID", "NEW") for n in range(3)]
            }
        # the key only the previous index key finds is still reached by an erasure
        erased = await codec.erase_patient("PURGED-1", actor="dpo", reason="request 40")
        async with MllpReceiver() as rx:
            cfg = pipeline.worker_config(DEST, rx.port, channel="adt")
            async with run_worker(cfg, fresh_db, payloads=await keys.codec(folder, key_dsn)):
                await rx.wait_for(len(sent), timeout=60)
            return found, erased, list(rx.received)

    found, erased, received = asyncio.run(read_everything())
    assert found == {f"{p}-{n}": 3 for p in ("OLD", "MID", "NEW") for n in range(3)}
    assert erased == 1
    assert received == sent  # every payload opened, once each, in order

    # the rotation kept for that key now ends, under k3 alone
    async def finish() -> payload_keys.IndexRotation:
        codec = await keys.codec(folder, key_dsn)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            return await payload_keys.rotate_index(conn, codec, actor="test", settle_seconds=0)

    done = asyncio.run(finish())
    assert (done.finished, done.unreached) == (True, 0)
    assert "index_previous" not in _settings(key_dsn)
