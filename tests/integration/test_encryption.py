"""Payloads encrypted at rest, end to end on real Postgres: the worker opens right before the
send, a dump holds no payload byte, erasure defeats a restored older dump, lookups by patient
find the same rows, copies are sealed for their own row (issue 31)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.cli import main
from inturn.worker.crypto import envelope
from inturn.worker.crypto.codec import PayloadCodec, PayloadErased, PayloadKeysMissing
from inturn.worker.drain.main import run, runtime_settings
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.pid import lookup_key, patient_identifiers
from inturn.worker.ingest.service import Ingest
from inturn.worker.operations import payload_keys, privacy
from inturn.worker.operations import queue as ops
from inturn.worker.operations.actor import Trusted
from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.registry import make_sender
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store import identifiers, migrate, queue, sealing
from inturn.worker.store.ingest import store_batch
from inturn.worker.store.model import Message, NewItem, StoreResult
from inturn.worker.testing import MllpReceiver
from tests.support import keys, pipeline
from tests.support.db import database
from tests.support.ingest import pull_all, sealing_ingest, sender
from tests.support.pipeline import register
from tests.support.pipeline import worker as run_worker

pytestmark = pytest.mark.store

DEST = "ward/lab"
NAME = b"ZYZZYVA"  # a patient name found in no other byte of a dump


def adt(n: int, mrn: str, name: bytes = NAME) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|MSG{n:05d}|P|2.5\r".encode()
        + f"PID|1||{mrn}^^^HOSP^MR||".encode()
        + name
        + b"^QUENTIN\r"
    )


def item(payload: bytes, destination: str = DEST) -> NewItem:
    header = parse_header(payload)
    return NewItem(destination, "adt", header.control_id, header.message_type.raw, payload)


async def sealed_queue(dsn: str, codec: PayloadCodec, payloads: list[bytes]) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await queue.enqueue(conn, [item(p) for p in payloads], codec)


async def rows(dsn: str) -> list[tuple[int, str, bytes, int]]:
    """(id, state, payload as stored, attempts) of every delivery row, the channel log pulled
    first; a slim row's payload is its log row's."""
    await asyncio.to_thread(pull_all, dsn)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT d.id, d.state, coalesce(d.payload, m.payload), d.attempts"
            " FROM inturn_delivery d LEFT JOIN inturn_message m ON m.id = d.message_id"
            " ORDER BY d.id"
        )
        return [(r[0], r[1], bytes(r[2]), r[3]) for r in await cur.fetchall()]


def worker_config(port: int, lanes: int = 1) -> WorkerConfig:
    return pipeline.worker_config(DEST, port, channel="adt", lanes=lanes)


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_the_worker_opens_right_before_the_send_and_delivers_the_message_unchanged(
    fresh_db: str, keys_dir: Path, key_dsn: str, lanes: int
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    sent = [adt(n, f"MRN-{n % 3}") for n in range(6)]
    ids = await sealed_queue(fresh_db, codec, sent)
    assert ids == sorted(ids)
    stored = await rows(fresh_db)
    assert all(envelope.is_envelope(p) and NAME not in p for _, _, p, _ in stored)
    reader = await keys.codec(keys_dir, key_dsn)  # the worker's own process: a cold cache
    async with (
        MllpReceiver() as rx,
        run_worker(worker_config(rx.port, lanes), fresh_db, payloads=reader),
    ):
        await rx.wait_for(6)
        async with asyncio.timeout(10):
            while any(s != "delivered" for _, s, _, _ in await rows(fresh_db)):
                await asyncio.sleep(0.05)
    if lanes == 1:
        assert rx.received == sent
    else:  # each patient's messages in order (lanes: patients may interleave)
        for mrn in (b"MRN-0", b"MRN-1", b"MRN-2"):
            assert [p for p in rx.received if mrn in p] == [p for p in sent if mrn in p]
    assert reader.unwraps == 3  # one per patient, then the cache


def _held_lines(caplog: pytest.LogCaptureFixture, item_id: int) -> list[str]:
    return [
        m
        for m in (r.getMessage() for r in caplog.records)
        if f"the queue holds at id={item_id}: " in m
    ]


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_a_worker_without_keys_stops_saying_why_and_delivers_once_given_keys(
    fresh_db: str, keys_dir: Path, key_dsn: str, lanes: int
) -> None:
    """A worker started without --payload-keys over sealed rows can never send them: it stops
    (issue 39: says so once and exits non-zero, so that Kubernetes shows it; `inturn worker`
    turns the error into one line and exit 2), nothing sent, the rows untouched; the same queue
    with the keys is delivered in order."""
    codec = await keys.codec(keys_dir, key_dsn)
    sent = [adt(1, "MRN-1"), adt(2, "MRN-1")]
    await sealed_queue(fresh_db, codec, sent)
    async with MllpReceiver() as rx:
        cfg = worker_config(rx.port, lanes)
        keyless = DestinationWorker(cfg, fresh_db, make_sender(cfg.sender))
        with pytest.raises(PayloadKeysMissing, match="--payload-keys"):
            await asyncio.wait_for(keyless.run(asyncio.Event()), 30)  # ends on its own
        assert rx.received == [] and rx.connections == 0
        with psycopg.connect(fresh_db) as conn:
            rows = conn.execute(
                "SELECT state, attempts FROM inturn_delivery ORDER BY id"
            ).fetchall()
        assert rows == [("pending", 0), ("pending", 0)]
        reader = await keys.codec(keys_dir, key_dsn)
        async with run_worker(worker_config(rx.port, lanes), fresh_db, payloads=reader):
            await rx.wait_for(2)
    assert rx.received == sent


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_a_head_whose_key_was_erased_holds_the_queue_until_skipped(
    fresh_db: str, keys_dir: Path, key_dsn: str, lanes: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The head's patient key was erased: the worker says the message can never be delivered
    and names `inturn queue skip ID`, holds it (nothing of its lane sent behind it: the whole
    queue with one stream; in the lanes, only that patient's lane: another patient's message
    goes), keeps its lease, and once the item is skipped delivers what waited, in order,
    without a restart."""
    codec = await keys.codec(keys_dir, key_dsn)
    gone, behind = adt(1, "GONE-1"), [adt(2, "KEEP-1"), adt(3, "KEEP-1")]
    first, _, _ = await sealed_queue(fresh_db, codec, [gone, *behind])
    assert await privacy.erase_patient_keys(Trusted("dpo"), "GONE-1", None, "test", codec) == 1
    caplog.set_level(logging.INFO, logger="inturn.drain")
    reader = await keys.codec(keys_dir, key_dsn)
    async with (
        MllpReceiver() as rx,
        run_worker(worker_config(rx.port, lanes), fresh_db, payloads=reader) as worker,
    ):
        await pipeline.until(lambda: len(_held_lines(caplog, first)) >= 2)  # looked again
        if lanes > 1:
            await rx.wait_for(2)  # another patient's lane is not held
        assert rx.received == ([] if lanes == 1 else behind)
        line = _held_lines(caplog, first)[0]
        assert "can never be delivered" in line and f"`inturn queue skip {first}`" in line
        assert "\n" not in line
        reason = worker.state.not_ready()
        assert reason is not None and reason.startswith(f"held at id={first}: ")
        assert worker.state.lock_held
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await ops.skip(conn, Trusted("dpo"), first, "its key was erased")
        await rx.wait_for(2)
        await pipeline.until(lambda: worker.state.not_ready() is None)
    assert rx.received == behind
    assert [s for _, s, _, _ in await rows(fresh_db)] == ["skipped", "delivered", "delivered"]


async def test_a_dump_and_the_table_pages_hold_no_payload_byte(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    big = adt(2, "MRN-BIG") + b"NTE|1||" + NAME * 4000 + b"\r"  # stored out of line (TOAST)
    await sealed_queue(fresh_db, codec, [adt(1, "MRN-DUMP"), big])
    dumped = keys.dump(fresh_db)
    assert b"inturn_delivery" in dumped
    assert NAME not in dumped and b"MRN-DUMP" not in dumped
    # the plain digests of its identifiers are not there either: a dump alone says nothing
    assert lookup_key("MRN-DUMP", "HOSP").encode() not in dumped
    assert lookup_key("MRN-DUMP").encode() not in dumped
    not_here = keys.files_not_here(fresh_db)
    if not_here:  # a server elsewhere (INTURN_TEST_DSN)
        pytest.skip(not_here)
    pages = keys.relation_bytes(fresh_db, "inturn_delivery")
    assert NAME not in pages and b"MRN-DUMP" not in pages


async def test_erasure_defeats_a_restored_older_dump_read_with_the_live_key_store(
    fresh_db: str, pg_server_dsn: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    ids = await sealed_queue(
        fresh_db, codec, [adt(1, "ERASE-ME"), adt(2, "KEEP-ME"), adt(3, "ERASE-ME")]
    )
    last_night = keys.dump(fresh_db)
    actor = Trusted("dpo")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        found = await privacy.find_for_erasure(conn, patient_id="ERASE-ME", payloads=codec)
        assert [m.id for m in found] == [ids[0], ids[2]]
        # the payload scan (no index) opens every payload through the codec, and finds the same
        scanned = await privacy.find_for_erasure(
            conn, patient_id="ERASE-ME", scan=True, payloads=codec
        )
        assert scanned == found
        with pytest.raises(PayloadKeysMissing):
            await privacy.find_for_erasure(conn, patient_id="ERASE-ME", scan=True)
        done = await privacy.erase(conn, actor, [m.id for m in found], "request 7")
        destroyed = await privacy.erase_patient_keys(
            actor, "ERASE-ME", None, "request 7", codec, erased=len(done.ids)
        )
        assert destroyed == 1
        # run again (as after a half failure): nothing left to find, nothing more destroyed
        assert await privacy.find_for_erasure(conn, patient_id="ERASE-ME", payloads=codec) == []
        assert await privacy.erase_patient_keys(actor, "ERASE-ME", None, "request 7", codec) == 0
        audit = await conn.execute("SELECT to_jsonb(a)::text FROM inturn_audit a")
        assert "ERASE-ME" not in str(await audit.fetchall())
    with database(pg_server_dsn, "inturn_restored") as restored:
        keys.restore(last_night, restored)
        reader = await keys.codec(keys_dir, key_dsn)
        back = {i: p for i, _, p, _ in await rows(restored)}
        assert sorted(back) == ids
        for erased in (ids[0], ids[2]):
            with pytest.raises(PayloadErased):
                await reader.open(erased, DEST, back[erased])
        assert await reader.open(ids[1], DEST, back[ids[1]]) == adt(2, "KEEP-ME")


async def test_lookups_by_patient_find_the_same_rows_with_keys_as_without(
    fresh_db: str, keys_dir: Path, key_dsn: str, samples: list[Path]
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    messages = []
    for path in samples:
        try:
            parse_header(path.read_bytes())
        except ValueError:  # the samples' malformed headers: ingest refuses those
            continue
        messages.append(path.read_bytes())
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(m, "plain/before") for m in messages])
        await queue.enqueue(conn, [item(m, "sealed/after") for m in messages], codec)
        patients = {
            (p.id, a)
            for m in messages
            for p in patient_identifiers(m)
            for a in (None, *p.authorities)
        }
        assert len(patients) > 50
        for ident, authority in sorted(patients, key=str):
            found = await identifiers.find_patient(conn, ident, authority, payloads=codec)
            by: dict[str, list[str]] = {"plain/before": [], "sealed/after": []}
            for i in found:
                by[i.destination].append(i.control_id)
            assert by["plain/before"] == by["sealed/after"] != [], (ident, authority)
            # without keys, only the plain rows are found (as before)
            plain = await identifiers.find_patient(conn, ident, authority)
            assert [i.control_id for i in plain] == by["plain/before"]


async def test_a_resent_copy_is_sealed_for_its_own_row_and_the_view_decrypts_on_demand(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    [original] = await sealed_queue(fresh_db, codec, [adt(1, "MRN-R")])
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now() WHERE id = %s",
            (original,),
        )
        with pytest.raises(PayloadKeysMissing):
            await ops.resend(conn, Trusted("ops"), original, "again")
        copy = (await ops.resend(conn, Trusted("ops"), original, "again", codec)).copy
        stored = {i: p for i, _, p, _ in await rows(fresh_db)}
        assert envelope.is_envelope(stored[copy]) and stored[copy] != stored[original]
        shown = await privacy.view_payload(conn, Trusted("ops"), copy, "check", codec)
        assert shown.data == adt(1, "MRN-R")
        with pytest.raises(PayloadKeysMissing):
            await privacy.view_payload(conn, Trusted("ops"), copy, "check")


async def test_ingest_seals_every_payload_once_for_its_log_row_and_the_window_keeps_working(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """Each message is sealed once, in the channel log, bound to its log id and the channel
    (``channel:adt``), whatever the number of its destinations; each destination's slim row
    holds no payload and its head opens the log row's."""
    register(fresh_db, DEST, "adt")
    register(fresh_db, "ward/pharmacy", "adt")
    config = sealing_ingest(keys_dir, key_dsn)
    sent = [adt(n, f"ING-{n % 2}") for n in range(4)]
    async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
        for payload in [*sent, sent[0]]:  # the last one is a duplicate inside the window
            await client.send(payload)
    with psycopg.connect(fresh_db) as conn:
        logged = conn.execute(
            "SELECT id, channel, payload, size, patient_keys FROM inturn_message ORDER BY id"
        ).fetchall()
        window = conn.execute("SELECT digest FROM inturn_received").fetchall()
    assert len(logged) == 4  # four messages once each (two destinations), the duplicate dropped
    reader = await keys.codec(keys_dir, key_dsn)
    opened = [await reader.open(i, f"channel:{c}", bytes(p)) for i, c, p, _, _ in logged]
    assert opened == sent
    assert all(
        NAME not in bytes(p) and size == len(m)
        for (_, _, p, size, _), m in zip(logged, opened, strict=True)
    )
    blind = reader.lookup_keys("ING-1", "HOSP")[1]
    assert [i for i, _, _, _, k in logged if blind in k] == [logged[1][0], logged[3][0]]
    assert all(lookup_key("ING-1") not in k for *_, k in logged)  # no plain digest
    assert hashlib.sha256(sent[0]).digest() not in {bytes(w[0]) for w in window}
    pull_all(fresh_db)
    with psycopg.connect(fresh_db) as conn:
        slim = conn.execute(
            "SELECT destination, message_id, payload FROM inturn_delivery ORDER BY id"
        ).fetchall()
    assert sorted((d, m) for d, m, _ in slim) == sorted(
        (d, i) for i, *_ in logged for d in (DEST, "ward/pharmacy")
    )
    assert all(p is None for *_, p in slim)
    async with (
        MllpReceiver() as rx,
        run_worker(worker_config(rx.port), fresh_db, payloads=reader),
    ):
        await rx.wait_for(len(sent))
    assert rx.received == sent


async def test_a_sealed_store_on_its_own_transaction_stores_all_or_nothing(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """Ingest's sealed store outside a transaction runs its two statements in a transaction of
    its own, pipelined (BEGIN with the reservation, COMMIT with the rows): refused while the
    channel's lock is held past lock_timeout, nothing of it is kept and the connection is
    ready for the next store, which keeps every message sealed for its log row."""
    codec = await keys.codec(keys_dir, key_dsn)
    payloads = [adt(n, f"PIPE-{n}") for n in range(3)]
    messages = [
        Message(
            control_id=parse_header(p).control_id,
            message_type="ADT^A01",
            payload=p,
            digest=hashlib.sha256(p).digest(),
        )
        for p in payloads
    ]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("SET lock_timeout = '200ms'")

        def store() -> Coroutine[Any, Any, list[StoreResult]]:
            return store_batch(
                conn,
                channel="adt",
                destinations=[DEST],
                messages=messages,
                window_seconds=60,
                payloads=codec,
            )

        with psycopg.connect(fresh_db) as holder:  # the channel's lock, held by another batch
            holder.execute("SELECT inturn_enqueue_lock('channel:adt')")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await store()
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            holder.rollback()
        with psycopg.connect(fresh_db) as check:
            kept = check.execute(
                "SELECT (SELECT count(*) FROM inturn_message),"
                " (SELECT count(*) FROM inturn_received)"
            ).fetchone()
        assert kept == (0, 0)
        results = await store()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    ids = [i for r in results for i in r.ids]
    with psycopg.connect(fresh_db) as conn:
        logged = conn.execute(
            "SELECT id, payload FROM inturn_message WHERE id = ANY(%s) ORDER BY id", (ids,)
        ).fetchall()
    assert [await codec.open(i, "channel:adt", bytes(p)) for i, p in logged] == payloads


async def test_ingest_with_keys_queues_a_resend_after_a_failure_sealed_for_its_own_log_row(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """Issue 28, item 2 on the sealed path (reserve_log, store_log_sealed): the same bytes
    again while the first copy is pending (in the log, not pulled yet) are a duplicate; after it
    failed, a re-send: a log row of its own, sealed for it, whose pulled row is linked to the
    failed one."""
    register(fresh_db, DEST, "adt")
    config = sealing_ingest(keys_dir, key_dsn)
    payload = adt(7, "RESEND-1")
    async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
        await client.send(payload)
        await client.send(payload)  # pending (in the log): a duplicate
        pull_all(fresh_db)  # the worker pulls it, then it fails
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("UPDATE inturn_delivery SET state = 'failed', finished_at = now()")
        await client.send(payload)  # failed: a re-send
    pull_all(fresh_db)
    with psycopg.connect(fresh_db) as conn:
        stored = conn.execute(
            "SELECT d.id, d.message_id, m.payload, d.state, d.resent_from, d.resent_as"
            " FROM inturn_delivery d JOIN inturn_message m ON m.id = d.message_id ORDER BY d.id"
        ).fetchall()
    [(first, one, _, _, _, resent_as), (copy, two, sealed, state, resent_from, _)] = stored
    assert (state, resent_from, resent_as) == ("pending", first, copy) and two > one
    reader = await keys.codec(keys_dir, key_dsn)
    assert await reader.open(two, "channel:adt", bytes(sealed)) == payload
    assert NAME not in bytes(sealed)


def test_the_queue_commands_open_list_and_erase_with_the_keys_and_refuse_without(
    fresh_db: str, keys_dir: Path, key_dsn: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    async def seal() -> list[int]:
        codec = await keys.codec(keys_dir, key_dsn)
        return await sealed_queue(fresh_db, codec, [adt(1, "CLI-1"), adt(2, "CLI-2")])

    first, second = asyncio.run(seal())
    keyed = ["--payload-keys", str(keys_dir), "--key-dsn", key_dsn]
    payload = ["queue", "payload", str(first), "--dsn", fresh_db, "--why", "support call"]
    with pytest.raises(SystemExit) as exited:
        main(payload)
    assert exited.value.code == 2
    err = capsysbinary.readouterr().err.decode().strip()
    assert len(err.splitlines()) == 1 and "--payload-keys" in err
    main([*payload, *keyed])
    assert capsysbinary.readouterr().out == adt(1, "CLI-1")
    listing = ["queue", "list", "--dsn", fresh_db, "--patient-id", "CLI-2", "--json"]
    main([*listing, "--why", "ticket 7", *keyed])
    listed = json.loads(capsysbinary.readouterr().out)
    assert [i["id"] for i in listed["items"]] == [second]
    erase = ["queue", "erase", "--dsn", fresh_db, "--patient-id", "CLI-2", "--who", "dpo"]
    main([*erase, "--why", "request 9", "--json", *keyed])
    done = json.loads(capsysbinary.readouterr().out)
    assert (done["erased"], done["keysDestroyed"]) == ([second], 1)
    main([*erase, "--why", "request 9", "--json", *keyed])  # again: nothing left, no more keys
    again = json.loads(capsysbinary.readouterr().out)
    assert (again["erased"], again["keysDestroyed"]) == ([], 0)


@pytest.mark.slow  # under traffic: left out by make test-fast
async def test_encrypt_existing_under_load_loses_nothing_and_keeps_order(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """Rows in clear are sealed in batches while a worker drains them and ingest adds sealed
    ones: every message arrives once, in order; every row ends sealed and found by patient,
    under the blind index alone."""
    register(fresh_db, DEST, "adt")
    before = [adt(n, f"LOAD-{n % 7}") for n in range(400)]
    during = [adt(n, f"LOAD-{n % 7}") for n in range(400, 600)]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [item(p) for p in before])  # stored in clear, no keys yet
    config = sealing_ingest(keys_dir, key_dsn)
    async with MllpReceiver() as rx, Ingest(config, dsn=fresh_db) as running:
        assert running.payloads is not None and running.payloads.dual_index  # rows in clear
        cfg = worker_config(rx.port)
        async with run_worker(cfg, fresh_db, payloads=await keys.codec(keys_dir, key_dsn)):

            async def send() -> None:
                async with sender(running) as client:
                    for payload in during:
                        await client.send(payload)

            async def seal() -> payload_keys.Sealed:
                codec = await keys.codec(keys_dir, key_dsn)
                async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                    first = await payload_keys.encrypt_existing(conn, codec, batch=37)
                    while first.pending_in_clear:  # the worker has not reached them all yet
                        await asyncio.sleep(0.2)
                        first = await payload_keys.encrypt_existing(conn, codec, batch=37)
                    return first

            sent, done = await asyncio.gather(send(), seal())
            del sent
            await rx.wait_for(len(before) + len(during), timeout=60)
            async with asyncio.timeout(20):
                while any(s != "delivered" for _, s, _, _ in await rows(fresh_db)):
                    await asyncio.sleep(0.05)
    assert rx.received == before + during  # once each, in order
    assert done.rekeyed > 0
    stored = await rows(fresh_db)
    assert all(envelope.is_envelope(p) for _, _, p, _ in stored)
    codec = await keys.codec(keys_dir, key_dsn)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        found = 0
        for n in range(7):
            found += len(await identifiers.find_patient(conn, f"LOAD-{n}", payloads=codec))
        assert found == 600
        cur = await conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE patient_keys && %s",
            ([lookup_key(f"LOAD-{n}") for n in range(7)],),
        )
        assert (await cur.fetchone()) == (0,)  # no plain digest is left


async def test_with_keys_a_receivers_error_text_that_quotes_the_message_is_not_stored(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    [only] = await sealed_queue(fresh_db, codec, [adt(1, "MRN-AE")])
    async with MllpReceiver(ack_code="AE") as rx:
        rx.ack_text = "bad name ZYZZYVA in PID-5"
        async with run_worker(worker_config(rx.port), fresh_db, payloads=codec):
            await rx.wait_for(1)
            async with asyncio.timeout(10):
                while True:
                    with psycopg.connect(fresh_db) as conn:
                        row = conn.execute(
                            "SELECT last_error, (SELECT string_agg(error, '|') FROM inturn_attempt)"
                            " FROM inturn_delivery WHERE id = %s",
                            (only,),
                        ).fetchone()
                    if row and row[0]:
                        break
                    await asyncio.sleep(0.05)
    assert row[0].startswith("AE: the receiver's text is not stored")
    assert "ZYZZYVA" not in str(row)


@pytest.mark.parametrize("which", ["wrong key", "no key store"])
def test_a_worker_started_with_unusable_keys_refuses_in_one_line(
    fresh_db: str,
    keys_dir: Path,
    key_dsn: str,
    tmp_path: Path,
    which: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(keys.codec(keys_dir, key_dsn))  # the key store knows k1
    other = keys.master_keys(tmp_path / "other")  # another k1
    settings = json.loads(
        runtime_settings(
            worker_config(9),
            fresh_db,
            "127.0.0.1",
            0,
            "INFO",
            False,
            str(other if which == "wrong key" else keys_dir),
            key_dsn if which == "wrong key" else key_dsn + " port=1",
        )
    )
    assert run(settings) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inturn: error: ")
    assert ("--payload-keys" if which == "wrong key" else "--key-dsn") in err[0]


def test_inturn_local_encrypt_makes_a_master_key_and_a_key_store_once(
    pg_server_dsn: str, tmp_path: Path
) -> None:
    from inturn.worker.cli.local import local_key_database, local_keys

    with database(pg_server_dsn, "inturn_local") as queue_dsn:
        key_database = local_key_database(queue_dsn)
        assert key_database.endswith("_keys") and key_database != "inturn_keys"
        try:
            folder, key_dsn = local_keys(tmp_path, queue_dsn, None, None)
            assert Path(folder) == tmp_path / "payload-keys"
            assert (tmp_path / "payload-keys" / "k1").stat().st_mode & 0o777 == 0o600
            again = local_keys(tmp_path, queue_dsn, None, None)  # a second start: the same
            assert again == (folder, key_dsn)
            assert sorted(p.name for p in (tmp_path / "payload-keys").iterdir()) == ["k1"]
            asyncio.run(keys.codec(Path(folder), key_dsn))
        finally:
            with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{key_database}" WITH (FORCE)')


def test_a_lookup_by_patient_without_keys_on_a_sealed_database_refuses_instead_of_finding_none(
    fresh_db: str,
    keys_dir: Path,
    key_dsn: str,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """The new user's trial: ingest sealed a patient's messages (two destinations); without
    the keys, `queue list --patient-id`, `queue erase --patient-id --dry-run` and the erasure
    said "0 of 0" / "erased 0" with exit 0. Now each refuses in one line naming --payload-keys
    (exit 2) and erases nothing; with the keys they find every row."""
    register(fresh_db, DEST, "adt")
    register(fresh_db, "ward/pharmacy", "adt")
    config = sealing_ingest(keys_dir, key_dsn)

    async def ingest() -> None:
        async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
            for n in range(4):
                await client.send(adt(n, "E1"))

    asyncio.run(ingest())
    pull_all(fresh_db)  # what the destinations' workers pull from the channel log
    capsysbinary.readouterr()  # ingest's own log lines
    keyed = ["--payload-keys", str(keys_dir), "--key-dsn", key_dsn]
    listing = ["queue", "list", "--dsn", fresh_db, "--patient-id", "E1", "--json", "--why", "t"]
    erase = ["queue", "erase", "--dsn", fresh_db, "--patient-id", "E1", "--authority", "HOSP"]
    erase += ["--who", "dpo", "--json", "--why", "request 12"]
    for args in (listing, [*erase, "--dry-run"], erase):
        with pytest.raises(SystemExit) as exited:
            main(args)
        assert exited.value.code == 2, args
        said = capsysbinary.readouterr()
        err = said.err.decode().strip()
        assert said.out == b"" and len(err.splitlines()) == 1, err
        assert "--payload-keys" in err and "blind index" in err
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (8,)
    main([*listing, *keyed])
    assert json.loads(capsysbinary.readouterr().out)["total"] == 8
    main([*erase, "--dry-run", *keyed])
    assert len(json.loads(capsysbinary.readouterr().out)["matched"]) == 8
    main([*erase, *keyed])
    done = json.loads(capsysbinary.readouterr().out)
    assert (len(done["erased"]), done["keysDestroyed"]) == (8, 1)
    # still refused without keys with nothing left: the blind index is what it cannot read
    with pytest.raises(SystemExit) as exited:
        main(listing)
    assert exited.value.code == 2


def test_a_lookup_by_patient_on_a_database_that_never_sealed_answers_as_before(
    fresh_db: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """No payload keys ever: no marker row, the plain index, "nothing found" is the truth."""
    register(fresh_db, DEST, "adt")
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM inturn_payload_keys").fetchone() == (0,)

    async def plain() -> list[int]:
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            return await queue.enqueue(conn, [item(adt(1, "P1"))])

    [only] = asyncio.run(plain())
    why = ["--why", "ticket 3"]
    main(["queue", "list", "--dsn", fresh_db, "--patient-id", "P1", "--json", *why])
    assert [i["id"] for i in json.loads(capsysbinary.readouterr().out)["items"]] == [only]
    main(["queue", "list", "--dsn", fresh_db, "--patient-id", "NOBODY", "--json", *why])
    assert json.loads(capsysbinary.readouterr().out)["total"] == 0
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM inturn_payload_keys").fetchone() == (0,)


async def test_migration_0021_marks_a_database_sealed_before_it(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """A database whose rows were sealed before migration 0021 existed gets its row from the
    migration itself (it looks for envelopes once): lookups without keys refuse there too."""
    codec = await keys.codec(keys_dir, key_dsn)
    await sealed_queue(fresh_db, codec, [adt(1, "OLD-1")])
    sql = (
        Path(migrate.__file__).parent / "migrations" / "0021_payload_keys_in_use.sql"
    ).read_text()
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("DROP TABLE inturn_payload_keys")  # as before 0021
        await conn.execute(sql.encode())
        with pytest.raises(PayloadKeysMissing, match="--payload-keys"):
            await privacy.find_for_erasure(conn, patient_id="OLD-1")
        assert [
            m.id for m in await privacy.find_for_erasure(conn, patient_id="OLD-1", payloads=codec)
        ] != []


async def test_a_key_store_outage_is_named_in_ingests_log_its_answer_and_readyz(
    fresh_db: str,
    keys_dir: Path,
    key_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The key store's database refuses connections and its sessions are ended: a new
    patient's message is answered AE, the log says why with "key store" (not "connection
    lost") and never that a pooled (queue) connection was dead, /readyz's reason names
    the key store; once it is back, readiness returns without traffic and messages are AA."""
    monkeypatch.setattr(sealing, "INDEX_FORM_EVERY_SECONDS", 0.2)
    register(fresh_db, DEST, "adt")
    config = sealing_ingest(keys_dir, key_dsn)

    caplog.set_level(logging.INFO)
    async with Ingest(config, dsn=fresh_db) as running, sender(running) as client:
        await client.send(adt(1, "KS-1"))
        assert running.readiness() is None
        _key_store_away(fresh_db, key_dsn, True)
        try:
            with pytest.raises(DeliveryError) as refused:
                await client.send(adt(2, "KS-2"))  # a new patient: its key is not cached
            assert str(refused.value).startswith("AE: ")  # send it again: nothing kept
            reason = running.readiness()
            assert reason is not None and reason.startswith("key store unreachable for")
            assert "--key-dsn" in reason
        finally:
            _key_store_away(fresh_db, key_dsn, False)
        for _ in range(100):
            if running.readiness() is None:
                break
            await asyncio.sleep(0.1)
        assert running.readiness() is None
        await client.send(adt(3, "KS-2"))
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "pooled connection was dead" in m]
    assert [m for m in said if "key store unreachable" in m]
    assert "key store (--key-dsn) reachable again" in said
    with psycopg.connect(fresh_db) as conn:  # stored once each, in the channel log
        assert conn.execute("SELECT count(*) FROM inturn_message").fetchone() == (2,)


def _key_store_away(dsn: str, key_dsn: str, away: bool) -> None:
    """The key store's database refuses connections (and its sessions end), or is back."""
    name = psycopg.conninfo.conninfo_to_dict(key_dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(not away).lower()}')
        if away:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


async def test_a_worker_names_a_key_store_outage_and_delivers_once_it_is_back(
    fresh_db: str, keys_dir: Path, key_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The head's key is not cached and the key store is away: the worker sends nothing, logs
    "key store unreachable" (not "database connection lost"), its readiness names the key
    store; once it is back, the head is delivered."""
    codec = await keys.codec(keys_dir, key_dsn)
    sent = adt(1, "KSW-1")
    await sealed_queue(fresh_db, codec, [sent])
    reader = await keys.codec(keys_dir, key_dsn)  # started; its cache is cold
    caplog.set_level(logging.WARNING)
    async with MllpReceiver() as rx:
        _key_store_away(fresh_db, key_dsn, True)
        async with run_worker(worker_config(rx.port), fresh_db, payloads=reader) as worker:
            try:
                async with asyncio.timeout(10):
                    while not [r for r in caplog.records if "key store" in r.getMessage()]:
                        await asyncio.sleep(0.05)
                reason = worker.state.not_ready()
                assert reason is not None and reason.startswith("key store unreachable for")
                assert rx.received == []
            finally:
                _key_store_away(fresh_db, key_dsn, False)
            await rx.wait_for(1)
    assert rx.received == [sent]
    said = [r.getMessage() for r in caplog.records]
    assert any("key store unreachable (--key-dsn)" in m for m in said)
    assert not any("database connection lost" in m for m in said)
    assert reader.store is not None and worker.state.key_store is not None
    assert worker.state.key_store() is None
