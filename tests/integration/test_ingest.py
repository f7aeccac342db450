"""Ingest against a real Postgres and real sockets: AA only after COMMIT, AE on storage failure,
AR for what cannot be taken, framing edge cases, the duplicate window, fan-out, filters and the
routing refresh, MSH-15, timeouts, many idle connections, HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence

import aiohttp
import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo

from inturn.worker.hl7.ack import Ack, parse_ack
from inturn.worker.hl7.mllp import frame
from inturn.worker.ingest import metrics
from inturn.worker.ingest.service import Ingest, forget_old
from inturn.worker.store.notify import channel_wake_name, notify_channel
from inturn.worker.store.queries import load
from tests.support.ingest import HOST, Client, config, msg, pull_all, rows
from tests.support.pipeline import register

pytestmark = pytest.mark.store

QUEUE_SQL = load("queue.sql")
#: A message received again asks for its latest copies through this function (migration 0041).
LATEST_COPY = "inturn_latest_copy(text, text, text, timestamptz)"


def log_id(dsn: str, item_id: int) -> int:
    """The channel log's id of delivery row ``item_id`` (the id ingest logs)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT message_id FROM inturn_delivery WHERE id = %s", (item_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(), dsn=fresh_db) as running:
        yield running


async def client(ingest: Ingest, channel: str = "adt") -> Client:
    return await Client.connect(ingest.mllp_ports[channel])


# --- AA means committed --------------------------------------------------------------------------


async def test_accepts_and_stores_exact_bytes(ingest: Ingest, fresh_db: str) -> None:
    raw = msg("C1", body="PID|1||1^^^H^MR||MÜLLER^JÖRG\nOBX|1|TX|||a\r\n")  # LF, CRLF, UTF-8
    c = await client(ingest)
    ack = await c.send(raw)
    await c.close()
    assert (ack.code, ack.control_id) == ("AA", "C1")
    [(_, destination, channel, control_id, message_type, payload)] = rows(fresh_db)
    assert (destination, channel, control_id, message_type) == (
        "hospital/adt-out",
        "adt",
        "C1",
        "ADT^A01",
    )
    assert bytes(payload) == raw


async def test_aa_is_sent_only_after_commit(ingest: Ingest, fresh_db: str) -> None:
    """While another transaction holds the channel's lock (the enqueue lock of
    ``channel:<name>``, under which ingest writes the channel's log), ingest waits and no ACK
    leaves; once it lets go, the ACK arrives and the row is visible to everyone. This also pins
    ingest's lock key to the store's."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as blocker:
        await blocker.execute("BEGIN")
        # the delivery queue's own enqueue lock, of the channel: ingest must take the same one
        await blocker.execute(QUEUE_SQL["enqueue_lock"], {"destination": "channel:adt"})
        c = await client(ingest)
        await c.write(frame(msg("LOCKED")))
        with pytest.raises(TimeoutError):
            await c.reply(timeout=0.5)
        assert rows(fresh_db) == []
        await blocker.execute("ROLLBACK")
        ack = await c.ack()
        await c.close()
    assert ack.code == "AA"
    assert [r[3] for r in rows(fresh_db)] == ["LOCKED"]


async def test_ack_echoes_delimiters_and_swaps_applications(ingest: Ingest) -> None:
    # field separator '#', component '$', five encoding characters
    raw = b"MSH#$%@!*#SAPP#SFAC#RAPP#RFAC#20240101##ORU$R01$ORU_R01#X-9#T#2.7\rPID#1\r"
    c = await client(ingest)
    await c.write(frame(raw))
    reply = await c.reply()
    await c.close()
    text = reply.decode()
    assert text.startswith("MSH#$%@!*#RAPP#RFAC#SAPP#SFAC#")
    msh = text.split("\r")[0].split("#")
    assert msh[8] == "ACK$R01$ACK" and msh[10:12] == ["T", "2.7"] and msh[9] != "X-9"
    assert text.split("\r")[1] == "MSA#AA#X-9"


# --- AE: storage failure stores nothing ----------------------------------------------------------


@pytest.fixture
def limited_role(fresh_db: str) -> Iterator[str]:
    """A DSN for a non-superuser role with the privileges ingest needs (privileges can be revoked
    from it, unlike from the superuser the tests otherwise use)."""
    role = f"inturn_ingest_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
        )
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT EXECUTE ON FUNCTION inturn_enqueue_lock(text) TO {role}")
        conn.execute(f"GRANT EXECUTE ON FUNCTION {LATEST_COPY} TO {role}")
    try:
        yield make_conninfo(fresh_db, user=role, password=password)
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
            conn.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}")
            conn.execute(f"REVOKE ALL ON FUNCTION inturn_enqueue_lock(text) FROM {role}")
            conn.execute(f"REVOKE ALL ON FUNCTION {LATEST_COPY} FROM {role}")
            conn.execute(f"GRANT CONNECT ON DATABASE {conn.info.dbname} TO PUBLIC")
            conn.execute(f"DROP ROLE {role}")


def admin(dsn: str, sql: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql)


@pytest.mark.parametrize(
    ("break_it", "repair"),
    [
        # the duplicate-window row, the first statement, fails
        (
            "REVOKE INSERT ON inturn_received FROM {role}",
            "GRANT INSERT ON inturn_received TO {role}",
        ),
        # the window row is written, then the log row fails
        (
            "REVOKE INSERT ON inturn_message FROM {role}",
            "GRANT INSERT ON inturn_message TO {role}",
        ),
        # the window row and the route set are written, then the log row's partition refuses
        (
            "ALTER TABLE inturn_message_e1 ADD CONSTRAINT test_no_b"
            " CHECK (control_id <> 'FAIL1') NOT VALID",
            "ALTER TABLE inturn_message_e1 DROP CONSTRAINT test_no_b",
        ),
    ],
)
async def test_storage_failure_answers_ae_and_stores_nothing(
    fresh_db: str, limited_role: str, break_it: str, repair: str
) -> None:
    for name in ("a", "b", "c"):
        register(fresh_db, f"hospital/{name}", "adt")
    role = psycopg.conninfo.conninfo_to_dict(limited_role)["user"]
    before = counter("inturn_ingest_messages_total", channel="adt", code="AE")
    async with Ingest(config(), dsn=limited_role) as ingest:
        c = await client(ingest)
        assert (await c.send(msg("OK1"))).code == "AA"
        admin(fresh_db, break_it.format(role=role))
        try:
            await c.write(frame(msg("FAIL1")))
            reply = await c.reply()
            ack = parse_ack(reply)
            assert (ack.code, ack.control_id, ack.error_code) == ("AE", "FAIL1", "207")
            assert b"ERR|" in reply
            assert b"permission" not in reply.lower() and b"test_no_b" not in reply
            assert sorted(r[3] for r in rows(fresh_db)) == ["OK1"] * 3
            with psycopg.connect(fresh_db) as conn:
                received = conn.execute("SELECT control_id FROM inturn_received").fetchall()
            assert received == [("OK1",)]  # no window row left behind either
        finally:
            admin(fresh_db, repair.format(role=role))
        # once storage works again, the same message goes through (it was not remembered)
        assert (await c.send(msg("FAIL1"))).code == "AA"
        await c.close()
    assert sorted(r[3] for r in rows(fresh_db)) == ["FAIL1"] * 3 + ["OK1"] * 3
    assert counter("inturn_ingest_messages_total", channel="adt", code="AE") == before + 1


async def test_database_unreachable_answers_ae(fresh_db: str, limited_role: str) -> None:
    """Cut the database away (connections killed, new ones refused): AE, never AA."""
    register(fresh_db, "hospital/adt-out", "adt")
    role = psycopg.conninfo.conninfo_to_dict(limited_role)["user"]
    async with Ingest(config(store_timeout=1.5), dsn=limited_role) as ingest:
        c = await client(ingest)
        assert (await c.send(msg("UP"))).code == "AA"
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(f"REVOKE CONNECT ON DATABASE {conn.info.dbname} FROM PUBLIC, {role}")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
        started = time.monotonic()
        ack = await c.send(msg("DOWN"))
        assert ack.code == "AE" and ack.control_id == "DOWN"
        assert time.monotonic() - started < 10
        await c.close()
        async with aiohttp.ClientSession() as http:
            url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
            async with http.post(url, data=msg("DOWN-HTTP")) as response:
                assert response.status == 503
                assert parse_ack(await response.read()).code == "AE"
    assert [r[3] for r in rows(fresh_db)] == ["UP"]


# --- AR: what cannot be taken is not stored ------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "error_code"),
    [
        (b"PID|1||42\rMSH|^~\\&|A|B|C|D|||ADT^A01|X|P|2.5\r", "100"),  # MSH not first
        (b"", "100"),  # empty frame
        (b"MSH|\r", "101"),  # no MSH-2
        (b"MSH|^~|A|B|C|D|||ADT^A01|X|P|2.5\r", "102"),  # two encoding characters
        (b"MSHA^~\\&A|B|C|D|||ADT^A01|X|P|2.5\r", "102"),  # a letter as field separator
        (b"MSH|^~\\&|A|B|C|D|||ADT^A01||P|2.5\r", "101"),  # no MSH-10
        (b"MSH|^~\\&|A|B|C|D|||||P|2.5\r", "101"),  # no MSH-9
        (b"FHS|^~\\&|A\rBHS|^~\\&\rPID|1||42\r", "100"),  # a batch out of sequence
        (b"MSH|^~\\&|A|B|C|D|||ADT^A01|X\x00Y|P|2.5\r", "102"),  # NUL: no database takes it
        # two messages in one frame (CR or LF between them): never stored as one
        (b"MSH|^~\\&|A|B|C|D|||ADT^A01|X1|P|2.5\rMSH|^~\\&|A|B|C|D|||ADT^A01|X2|P|2.5\r", "100"),
        (b"MSH|^~\\&|A|B|C|D|||ADT^A01|X1|P|2.5\nPID|1\nMSH|^~\\&|A|B|||||ADT^A03|X2|P|2.5", "100"),
    ],
)
async def test_unparseable_message_gets_ar_and_is_not_stored(
    ingest: Ingest, fresh_db: str, payload: bytes, error_code: str
) -> None:
    c = await client(ingest)
    await c.write(frame(payload))
    ack = parse_ack(await c.reply())
    assert ack.code == "AR" and ack.error_code == error_code
    # the connection stays usable for the next message
    assert (await c.send(msg("AFTER"))).code == "AA"
    await c.close()
    assert [r[3] for r in rows(fresh_db)] == ["AFTER"]


STRAY = (
    b"MSH|^~\\&|LAB|H|HIE|H|20261205||ORU^R01|FS001|P|2.5.1\rPID|1||X9^^^H^MR\r"
    b"OBX|1|ST|GLU||abc\x1cdef\rOBX|2|ST|K||4.1\r"
)


async def test_a_stray_end_block_byte_inside_a_message_is_refused_never_cut(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0x1C followed by more of the message is content: AR 102 (an MLLP destination could
    never send it), nothing stored; split by the network right after that byte, the first part
    is a message of its own, and the rest is dropped with a WARNING saying it may be cut."""
    register(fresh_db, "hospital/adt-out", "adt", sender_kind="mllp")
    async with Ingest(config(), dsn=fresh_db) as ingest:
        c = await client(ingest)
        await c.write(b"\x0b" + STRAY + b"\x1c\r")
        ack = parse_ack(await c.reply())
        assert (ack.code, ack.control_id, ack.error_code) == ("AR", "FS001", "102")
        assert ack.error_text is not None and "0x1C" in ack.error_text
        assert rows(fresh_db) == []
        cut = STRAY.index(b"\x1c") + 1
        with caplog.at_level(logging.INFO, logger="inturn"):
            # only this window's records: the listeners' INFO lines at the start were kept too
            # when an earlier test in the same worker had left the logger at INFO
            caplog.clear()
            await c.write(b"\x0b" + STRAY[:cut])
            assert parse_ack(await c.reply()).code == "AA"  # the block ended with the read
            await c.write(STRAY[cut:] + b"\x1c\r")
            assert (await c.send(msg("AFTER"))).code == "AA"
        await c.close()
    assert [r[3] for r in rows(fresh_db)] == ["FS001", "AFTER"]
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("channel")]
    assert warned == [
        "channel adt: dropped 19 bytes that followed a message's end-block byte 0x1C sent"
        " without its CR: that message (answered already) may have been cut at a 0x1C inside"
        " it; ask the sender to check it"
    ]


async def test_channel_without_destinations_gets_ar(ingest: Ingest, fresh_db: str) -> None:
    c = await client(ingest, "lab")
    ack = await c.send(msg("L1", "ORU^R01"))
    await c.close()
    assert (ack.code, ack.control_id, ack.error_code) == ("AR", "L1", "207")
    assert ack.error_text is not None and "no destinations" in ack.error_text
    assert rows(fresh_db) == []


async def test_oversized_frame_gets_ar_and_the_connection_is_closed(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inturn")
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(max_frame_bytes=1000), dsn=fresh_db) as ingest:
        c = await client(ingest)
        assert (await c.send(msg("SMALL", body="OBX|1|TX|||" + "x" * 800 + "\r"))).code == "AA"
        await c.write(frame(msg("BIG", body="OBX|1|TX|||" + "x" * 2000 + "\r")))
        ack = await c.ack()
        assert (ack.code, ack.error_code) == ("AR", "104")
        assert await c.closed_by_server()
        await c.close()
        # the limit applies to HTTP bodies as well: 413 (a new user's trial expected it, not
        # 400), with the AR, whether the length was declared or the body was chunked
        async with aiohttp.ClientSession() as http:
            url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
            big = msg("BIG-HTTP", body="OBX|1|TX|||" + "x" * 2000 + "\r")
            async with http.post(url, data=big) as response:
                assert response.status == 413
                assert parse_ack(await response.read()).code == "AR"

            async def chunks() -> AsyncIterator[bytes]:
                yield big[:500]
                yield big[500:]

            async with http.post(url, data=chunks()) as response:
                assert response.status == 413
                assert parse_ack(await response.read()).code == "AR"
    assert [r[3] for r in rows(fresh_db)] == ["SMALL"]
    # the log line says the cause first, and never that an MSH was missing
    refused = [r.getMessage() for r in caplog.records if "limit" in r.getMessage()]
    assert (
        refused
        == [
            "channel adt: a message over the 1000-byte limit was refused (AR); nothing of it was"
            " kept, its MSH was not read"
        ]
        * 3
    )
    assert "MSH could not be used" not in caplog.text


async def test_a_sender_still_writing_a_huge_frame_reads_the_ar(fresh_db: str) -> None:
    """The rest of a refused frame is read and dropped before closing, so no reset eats the AR."""
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(max_frame_bytes=1000), dsn=fresh_db) as ingest:
        reader, writer = await asyncio.open_connection(HOST, ingest.mllp_ports["adt"])
        writer.write(frame(msg("HUGE", body="OBX|1|TX|||" + "x" * 4_000_000 + "\r")))
        await writer.drain()  # all 4 MB accepted: the server keeps reading
        reply = await asyncio.wait_for(reader.readuntil(b"\x1c\r"), 10)
        writer.close()
    assert parse_ack(reply.strip(b"\x0b\x1c\r")).code == "AR"
    assert rows(fresh_db) == []


# --- framing -------------------------------------------------------------------------------------


async def test_pipelined_frames_in_one_write_are_answered_in_order(
    ingest: Ingest, fresh_db: str
) -> None:
    ids = [f"P{n:03d}" for n in range(50)]
    # NUL, whitespace and a missing CR after EB between some frames
    stream = b"".join(
        (b"\x00\r\n " if n % 3 == 0 else b"")
        + (frame(msg(cid))[:-1] if n % 5 == 0 else frame(msg(cid)))
        for n, cid in enumerate(ids)
    )
    c = await client(ingest)
    await c.write(stream)
    acks = [await c.ack() for _ in ids]
    await c.close()
    assert [a.control_id for a in acks] == ids
    assert {a.code for a in acks} == {"AA"}
    assert [r[3] for r in rows(fresh_db)] == ids  # stored in the order sent


async def test_frames_split_across_reads(ingest: Ingest, fresh_db: str) -> None:
    data = frame(msg("S1")) + frame(msg("S2"))
    c = await client(ingest)
    for i in range(0, len(data), 7):
        await c.write(data[i : i + 7])
        await asyncio.sleep(0.002)
    acks = [await c.ack(), await c.ack()]
    await c.close()
    assert [(a.code, a.control_id) for a in acks] == [("AA", "S1"), ("AA", "S2")]
    assert [bytes(r[5]) for r in rows(fresh_db)] == [msg("S1"), msg("S2")]


async def test_garbage_between_frames_is_dropped(ingest: Ingest, fresh_db: str) -> None:
    before = counter("inturn_ingest_garbage_bytes_total", channel="adt")
    c = await client(ingest)
    await c.write(b"HELLO" + frame(msg("G1")))
    ack = await c.ack()
    await c.close()
    assert ack.code == "AA"
    assert counter("inturn_ingest_garbage_bytes_total", channel="adt") == before + 5
    assert [r[3] for r in rows(fresh_db)] == ["G1"]


async def test_idle_and_stalled_connections_are_closed(fresh_db: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(idle_timeout=0.4, frame_timeout=0.3), dsn=fresh_db) as ingest:
        idle = await client(ingest)
        assert (await idle.send(msg("I1"))).code == "AA"
        started = time.monotonic()
        assert await idle.closed_by_server()
        assert 0.3 < time.monotonic() - started < 3
        await idle.close()
    # the frame timeout, told from an idle timeout far from it (their 0.1 s apart was a timed
    # assertion a loaded machine could fail)
    async with Ingest(config(idle_timeout=30, frame_timeout=0.3), dsn=fresh_db) as ingest:
        stalled = await client(ingest)
        half = frame(msg("HALF"))
        await stalled.write(half[: len(half) // 2])
        started = time.monotonic()
        assert await stalled.closed_by_server()
        assert time.monotonic() - started < 10  # the frame timeout, not the idle timeout
        await stalled.close()
    assert [r[3] for r in rows(fresh_db)] == ["I1"]


async def test_many_idle_connections_are_cheap(ingest: Ingest) -> None:
    gauge_before = counter("inturn_ingest_connections", channel="adt")
    idle = await asyncio.gather(*(client(ingest) for _ in range(1000)))
    await asyncio.sleep(0.2)
    assert counter("inturn_ingest_connections", channel="adt") == gauge_before + 1000
    started = time.monotonic()
    c = await client(ingest)
    assert (await c.send(msg("BUSY"))).code == "AA"
    assert time.monotonic() - started < 2
    await c.close()
    await asyncio.gather(*(i.close() for i in idle))


# --- MSH-15 ---------------------------------------------------------------------------------------


async def test_enhanced_mode_msh15_and_msh16(ingest: Ingest, fresh_db: str) -> None:
    """Exactly the answers MSH-15 (accept level, CA) and MSH-16 (application level, AA) ask for,
    in that order; a refusal is one answer, at the accept level when that one is due."""
    c = await client(ingest)
    ack = await c.send(msg("E-AL", msh15="AL", msh16="NE"))
    assert (ack.code, ack.control_id) == ("CA", "E-AL")
    ack = await c.send(msg("E-NE", msh15="NE", msh16="AL"))
    assert (ack.code, ack.control_id) == ("AA", "E-NE")
    ack = await c.send(msg("E-ER", msh15="ER", msh16="AL"))
    assert (ack.code, ack.control_id) == ("AA", "E-ER")
    ack = await c.send(msg("E-SU", msh15="SU", msh16="AL"))
    assert (ack.code, ack.control_id) == ("CA", "E-SU")
    ack = await c.ack()
    assert (ack.code, ack.control_id) == ("AA", "E-SU")
    # Silent ones: the next answer on the connection is the next message's.
    await c.write(frame(msg("E-NE-NE", msh15="NE", msh16="NE")))
    await c.write(frame(msg("E-ER-2", "ORU^R01", msh15="ER", msh16="ER")))
    ack = await c.send(msg("E-AL-2", msh15="AL"))  # an empty MSH-16 reads as NE
    assert (ack.code, ack.control_id) == ("CA", "E-AL-2")
    # ER on a failure does answer: a message no filter takes, in enhanced mode, gets CR ...
    register(fresh_db, "hospital/adt-out", "adt", ["ADT^*"])
    await ingest.router.refresh()  # type: ignore[union-attr]
    await c.write(frame(msg("E-ER-BAD2", "ORU^R01", msh15="ER", msh16="AL")))
    ack = await c.ack()
    assert (ack.code, ack.control_id, ack.error_code) == ("CR", "E-ER-BAD2", "200")
    # ... and only AR when the accept level is not due but the application level is.
    await c.write(frame(msg("E-NE-BAD", "ORU^R01", msh15="NE", msh16="ER")))
    ack = await c.ack()
    assert (ack.code, ack.control_id, ack.error_code) == ("AR", "E-NE-BAD", "200")
    await c.close()
    assert [r[3] for r in rows(fresh_db)] == [
        "E-AL",
        "E-NE",
        "E-ER",
        "E-SU",
        "E-NE-NE",
        "E-ER-2",
        "E-AL-2",
    ]


# --- duplicates ----------------------------------------------------------------------------------


async def test_duplicate_window(ingest: Ingest, fresh_db: str) -> None:
    identical = counter("inturn_ingest_duplicates_total", channel="adt", kind="identical")
    reused = counter("inturn_ingest_duplicates_total", channel="adt", kind="control_id_reused")
    c = await client(ingest)
    first = await c.send(msg("D1"))
    again = await c.send(msg("D1"))  # the sender lost our ACK and sends the same bytes
    other = await c.send(msg("D1", body="PID|1||99999^^^HOSP^MR||ROE^RICHARD\r"))
    await c.close()
    c2 = await client(ingest)  # a duplicate on another connection is recognised as well
    assert (await c2.send(msg("D1"))).code == "AA"
    await c2.close()
    assert (first.code, again.code, other.code) == ("AA", "AA", "AA")
    assert again.control_id == "D1" and again.text is not None and "duplicate" in again.text
    stored = rows(fresh_db)
    assert [r[3] for r in stored] == ["D1", "D1"]
    assert bytes(stored[1][5]) != bytes(stored[0][5])
    assert counter("inturn_ingest_duplicates_total", channel="adt", kind="identical") == (
        identical + 2
    )
    assert counter("inturn_ingest_duplicates_total", channel="adt", kind="control_id_reused") == (
        reused + 1
    )
    with psycopg.connect(fresh_db) as conn:
        window = conn.execute("SELECT control_id, size FROM inturn_received ORDER BY id").fetchall()
    assert window == [("D1", len(stored[0][5])), ("D1", len(stored[1][5]))]


async def test_duplicate_window_per_channel_and_expiry(fresh_db: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    register(fresh_db, "hospital/lab-out", "lab")
    async with Ingest(config(duplicate_window=0.5), dsn=fresh_db) as ingest:
        adt, lab = await client(ingest, "adt"), await client(ingest, "lab")
        assert (await adt.send(msg("W1"))).code == "AA"
        assert (await lab.send(msg("W1"))).code == "AA"  # another channel: not a duplicate
        assert (await adt.send(msg("W1"))).code == "AA"  # duplicate
        assert len(rows(fresh_db)) == 2
        await asyncio.sleep(0.7)  # the window has passed: the same bytes are a new message
        assert (await adt.send(msg("W1"))).code == "AA"
        await adt.close()
        await lab.close()
    assert [r[1] for r in rows(fresh_db)] == [
        "hospital/adt-out",
        "hospital/lab-out",
        "hospital/adt-out",
    ]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        # The expired adt row was replaced, not added to: at most one window row per channel.
        # (Ingest's own purge, every second, may already have forgotten some of them on a
        # loaded machine: what is left is what forget_old removes.)
        cur = await conn.execute(
            "SELECT channel, count(*) FROM inturn_received GROUP BY channel ORDER BY channel"
        )
        window = await cur.fetchall()
        assert all(n == 1 for _, n in window) and {c for c, _ in window} <= {"adt", "lab"}
        await asyncio.sleep(0.6)
        assert await forget_old(conn, 0.5, batch=1) == len(window)
        cur = await conn.execute("SELECT count(*) FROM inturn_received")
        assert await cur.fetchone() == (0,)


async def test_duplicate_window_off_stores_every_copy(fresh_db: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(duplicate_window=0), dsn=fresh_db) as ingest:
        c = await client(ingest)
        assert [(await c.send(msg("OFF"))).code for _ in range(2)] == ["AA", "AA"]
        await c.close()
    assert len(rows(fresh_db)) == 2


async def test_concurrent_copies_are_stored_once(ingest: Ingest, fresh_db: str) -> None:
    """Two replicas (here: connections) receiving the same message at once: one copy."""
    clients = await asyncio.gather(*(client(ingest) for _ in range(8)))
    acks = await asyncio.gather(*(c.send(msg("RACE")) for c in clients))
    await asyncio.gather(*(c.close() for c in clients))
    assert {a.code for a in acks} == {"AA"}
    assert len(rows(fresh_db)) == 1


def finish(dsn: str, ids: Sequence[int], state: str, ago_seconds: float = 0.0) -> None:
    """Mark delivery rows finished in ``state`` (as the worker or a person would),
    ``ago_seconds`` ago."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = %s,"
            " finished_at = now() - make_interval(secs => %s) WHERE id = ANY(%s)",
            (state, ago_seconds, list(ids)),
        )


def links(dsn: str) -> list[tuple[int, str, str, int | None, int | None]]:
    """(id, destination, state, resent_from, resent_as) of every delivery row, the channel log
    pulled first (as the worker does when woken)."""
    pull_all(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT id, destination, state, resent_from, resent_as FROM inturn_delivery ORDER BY id"
        ).fetchall()


def duplicates(kind: str) -> float:
    return counter("inturn_ingest_duplicates_total", channel="adt", kind=kind)


async def test_a_copy_received_again_after_a_failure_is_queued_as_a_resend(
    ingest: Ingest, fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The "please resend it" an analyst asks of a sender: the same bytes after the first copy
    failed are a new message, linked to the failed one, logged and counted; while that copy is
    pending, the same bytes are a duplicate (a lost ACK), logged with its id."""
    identical, resent = duplicates("identical"), duplicates("resent")
    c = await client(ingest)
    caplog.set_level(logging.INFO, logger="inturn.ingest")
    assert (await c.send(msg("R1"))).code == "AA"
    [(first, *_)] = rows(fresh_db)
    again = await c.send(msg("R1"))  # pending: the sender lost our ACK
    assert again.code == "AA" and again.text is not None and "duplicate" in again.text
    assert [r[0] for r in rows(fresh_db)] == [first]
    assert (
        f"channel adt: MSH-10 'R1' received again; earlier copy #{first} at hospital/adt-out"
        " (pending): acknowledged, not queued again"
    ) in caplog.messages
    finish(fresh_db, [first], "failed")
    resend = await c.send(msg("R1"))  # after the failure: a re-send
    assert resend.code == "AA" and (resend.text is None or "duplicate" not in resend.text)
    [_, (copy, *_)] = rows(fresh_db)
    logged = log_id(fresh_db, copy)
    assert links(fresh_db) == [
        (first, "hospital/adt-out", "failed", None, copy),
        (copy, "hospital/adt-out", "pending", first, None),
    ]
    assert (
        f"channel adt: MSH-10 'R1' received again; earlier copy #{first} at hospital/adt-out"
        f" (failed): queued again as log #{logged} (a re-send)"
    ) in caplog.messages
    # the copy is now the latest: pending, so the same bytes are a duplicate of it
    assert "duplicate" in ((await c.send(msg("R1"))).text or "")
    assert len(rows(fresh_db)) == 2
    assert (duplicates("identical"), duplicates("resent")) == (identical + 2, resent + 1)
    # skipped: a re-send too, linked to the copy (the end of the chain)
    finish(fresh_db, [copy], "skipped")
    assert (await c.send(msg("R1"))).code == "AA"
    third = links(fresh_db)[-1]
    assert third[2:] == ("pending", copy, None) and links(fresh_db)[1][4] == third[0]
    await c.close()


async def test_delivered_copies_are_duplicates_only_inside_the_lost_ack_window(
    fresh_db: str,
) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(duplicate_delivered_window=60), dsn=fresh_db) as ingest:
        c = await client(ingest)
        assert (await c.send(msg("L1"))).code == "AA"
        assert (await c.send(msg("L2"))).code == "AA"
        [(one, *_), (two, *_)] = rows(fresh_db)
        finish(fresh_db, [one], "delivered", ago_seconds=5)  # ACK lost a moment ago
        finish(fresh_db, [two], "delivered", ago_seconds=3600)  # delivered an hour ago
        assert "duplicate" in ((await c.send(msg("L1"))).text or "")
        assert "duplicate" not in ((await c.send(msg("L2"))).text or "")
        await c.close()
    assert [(r[0], r[3]) for r in links(fresh_db)] == [(one, None), (two, None), (two + 1, two)]


async def test_a_copy_of_an_erased_message_is_queued_unlinked(
    ingest: Ingest, fresh_db: str
) -> None:
    c = await client(ingest)
    assert (await c.send(msg("E1"))).code == "AA"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("DELETE FROM inturn_delivery")  # what erasure does to the rows
        conn.execute("DELETE FROM inturn_message")  # and to the log
    assert (await c.send(msg("E1"))).code == "AA"
    await c.close()
    [(_, destination, state, resent_from, _)] = links(fresh_db)
    assert (destination, state, resent_from) == ("hospital/adt-out", "pending", None)


async def test_a_fanned_out_copy_is_queued_only_where_its_earlier_copy_failed(
    fresh_db: str,
) -> None:
    register(fresh_db, "hospital/a", "adt")
    register(fresh_db, "hospital/b", "adt")
    async with Ingest(config(), dsn=fresh_db) as ingest:
        c = await client(ingest)
        assert (await c.send(msg("F1"))).code == "AA"
        [(a, *_), (b, *_)] = rows(fresh_db)
        finish(fresh_db, [b], "failed")
        assert (await c.send(msg("F1"))).code == "AA"
        await c.close()
    assert links(fresh_db) == [
        (a, "hospital/a", "pending", None, None),
        (b, "hospital/b", "failed", None, b + 1),
        (b + 1, "hospital/b", "pending", b, None),
    ]


async def test_concurrent_resends_of_a_failed_message_queue_one_copy(fresh_db: str) -> None:
    """Two replicas receive the re-send at the same moment: both statements wait on the window
    row (held here by a third session) with snapshots that see neither copy; one copy."""
    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(), dsn=fresh_db) as one, Ingest(config(), dsn=fresh_db) as two:
        c = await client(one)
        assert (await c.send(msg("C9"))).code == "AA"
        await c.close()
        [(first, *_)] = rows(fresh_db)
        finish(fresh_db, [first], "failed")
        async with await AsyncConnection.connect(fresh_db) as holder:
            await holder.execute("SELECT 1 FROM inturn_received FOR UPDATE")
            clients = [await client(one), await client(two)]
            sends = [asyncio.create_task(k.send(msg("C9"))) for k in clients]
            async with asyncio.timeout(10):
                while True:  # both statements are waiting on the row
                    cur = await holder.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    if (await cur.fetchone()) == (2,):
                        break
                    await asyncio.sleep(0.05)
            await holder.commit()
        acks = await asyncio.gather(*sends)
        await asyncio.gather(*(k.close() for k in clients))
    assert [a.code for a in acks] == ["AA", "AA"]
    assert [r[3] for r in links(fresh_db)] == [None, first]


# --- routing -------------------------------------------------------------------------------------


async def test_fan_out_is_one_log_row_and_one_notify(ingest: Ingest, fresh_db: str) -> None:
    """A message for three destinations is one row of the channel's log (its payload once),
    routed to the three, and one NOTIFY on the channel's wake-up name; each destination's pull
    makes it a row of its queue."""
    names = ["hospital/a", "hospital/b", "radiology/c"]
    for name in names:
        register(fresh_db, name, "lab")
    await ingest.router.refresh()  # type: ignore[union-attr]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as listener:
        await listener.execute(f"LISTEN {channel_wake_name('lab')}")
        for name in names:
            await listener.execute(f"LISTEN {notify_channel(name)}")
        c = await client(ingest, "lab")
        ack = await c.send(msg("F1", "ORU^R01"))
        await c.close()
        notified = []
        async with asyncio.timeout(5):
            async for note in listener.notifies():
                notified.append(note.channel)
                break
        await asyncio.sleep(0.3)  # no other notification follows
        async with asyncio.timeout(1):
            notified += [n.channel async for n in listener.notifies(timeout=0.2)]
    assert ack.code == "AA"
    assert notified == [channel_wake_name("lab")]
    with psycopg.connect(fresh_db) as conn:
        logged = conn.execute(
            "SELECT m.control_id, r.destinations FROM inturn_message m"
            " JOIN inturn_route r ON r.id = m.route"
        ).fetchall()
    assert logged == [("F1", names)]
    stored = rows(fresh_db)
    assert [r[1] for r in stored] == names
    assert {bytes(r[5]) for r in stored} == {msg("F1", "ORU^R01")}


async def test_filters_suspension_and_deletion(ingest: Ingest, fresh_db: str) -> None:
    register(fresh_db, "hospital/admissions", "lab", ["ADT^A0?", "ADT^A1*"])
    register(fresh_db, "hospital/results", "lab", ["ORU^*"], suspended=True)
    register(fresh_db, "hospital/acks", "lab", ["ACK^*"])
    register(fresh_db, "hospital/everything", "lab")
    register(fresh_db, "hospital/gone", "lab", deleted=True)
    await ingest.router.refresh()  # type: ignore[union-attr]
    c = await client(ingest, "lab")
    for cid, mtype in [
        ("A01", "ADT^A01^ADT_A01"),
        ("A10", "ADT^A10"),
        ("A20", "ADT^A20"),
        ("R01", "ORU^R01^ORU_R01"),
        ("ACK", "ACK"),
        ("adt", "adt^a01"),
    ]:
        assert (await c.send(msg(cid, mtype))).code == "AA"
    await c.close()
    got: dict[str, list[str]] = {}
    for row in rows(fresh_db):
        got.setdefault(row[3], []).append(row[1].split("/")[1])
    assert got == {
        "A01": ["admissions", "everything"],
        "A10": ["admissions", "everything"],
        "A20": ["everything"],
        "R01": ["everything", "results"],  # suspended still receives
        "ACK": ["acks", "everything"],
        "adt": ["everything"],  # patterns are case-sensitive
    }


async def test_no_filter_matches_gets_ar(ingest: Ingest, fresh_db: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt", ["ADT^A0*"])
    await ingest.router.refresh()  # type: ignore[union-attr]
    c = await client(ingest)
    ack = await c.send(msg("NOPE", "ORU^R01"))
    await c.close()
    assert (ack.code, ack.error_code) == ("AR", "200")
    assert rows(fresh_db) == []


async def test_routing_follows_registry_changes_without_restart(
    ingest: Ingest, fresh_db: str
) -> None:
    """The background refresh (0.2 s here) picks up additions, filter changes, channel moves and
    deletions; nothing calls refresh() by hand."""

    async def settle() -> None:
        await asyncio.sleep(0.6)

    c = await client(ingest, "lab")
    assert (await c.send(msg("R1", "ORU^R01"))).code == "AR"
    register(fresh_db, "hospital/lab-out", "lab", ["ORU^R01"])
    await settle()
    assert (await c.send(msg("R2", "ORU^R01"))).code == "AA"
    register(fresh_db, "hospital/lab-out", "lab", ["ORU^R30"])
    await settle()
    assert (await c.send(msg("R3", "ORU^R01"))).code == "AR"
    assert (await c.send(msg("R4", "ORU^R30"))).code == "AA"
    pull_all(fresh_db)  # its worker on lab pulls before it moves
    register(fresh_db, "hospital/lab-out", "adt", [])  # moved to another channel
    register(fresh_db, "hospital/adt-out", "adt", deleted=True)
    await settle()
    assert (await c.send(msg("R5", "ORU^R30"))).code == "AR"
    a = await client(ingest, "adt")
    assert (await a.send(msg("R6", "ORU^R30"))).code == "AA"
    await a.close()
    await c.close()
    assert [(r[3], r[1]) for r in rows(fresh_db)] == [
        ("R2", "hospital/lab-out"),
        ("R4", "hospital/lab-out"),
        ("R6", "hospital/lab-out"),
    ]


async def test_held_channel_accepts_unrouted_messages(fresh_db: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt", ["ADT^*"])
    async with Ingest(config(hold_unrouted=frozenset({"adt", "lab"})), dsn=fresh_db) as ingest:
        adt, lab = await client(ingest, "adt"), await client(ingest, "lab")
        assert (await adt.send(msg("H1", "ORU^R01"))).code == "AA"  # filtered out: held
        assert (await adt.send(msg("H2", "ADT^A01"))).code == "AA"  # routed normally
        assert (await lab.send(msg("H3", "ORU^R01"))).code == "AA"  # no destinations: held
        await adt.close()
        await lab.close()
    assert sorted((r[3], r[1]) for r in rows(fresh_db)) == [
        ("H1", "_unrouted/adt"),
        ("H2", "hospital/adt-out"),
        ("H3", "_unrouted/lab"),
    ]


# --- HTTP ----------------------------------------------------------------------------------------


async def test_http_messages_health_and_metrics(ingest: Ingest, fresh_db: str) -> None:
    base = f"http://{HOST}:{ingest.http_port}"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/channels/adt/messages", data=msg("H-OK")) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("application/hl7-v2")
            ack = parse_ack(await response.read())
            assert (ack.code, ack.control_id) == ("AA", "H-OK")
        async with http.post(f"{base}/channels/adt/messages", data=b"not hl7") as response:
            assert response.status == 400
            assert parse_ack(await response.read()).code == "AR"
        async with http.post(f"{base}/channels/nowhere/messages", data=msg("H-NO")) as response:
            assert response.status == 400
        # MSH-15 NE: HTTP answers anyway
        async with http.post(
            f"{base}/channels/adt/messages", data=msg("H-NE", msh15="NE", msh16="NE")
        ) as response:
            assert response.status == 200
            assert parse_ack(await response.read()).code == "CA"
        ops = f"http://{HOST}:{ingest.ops_port}"
        async with http.get(f"{ops}/healthz") as response:
            assert response.status == 200
        async with http.get(f"{ops}/readyz") as response:
            assert response.status == 200
        for path in ("/healthz", "/readyz", "/metrics"):  # not on the message port
            async with http.get(f"{base}{path}") as response:
                assert response.status in (404, 405)
        async with http.get(f"{ops}/metrics") as response:
            text = await response.text()
    for name in (
        "inturn_ingest_messages_total",
        "inturn_ingest_duplicates_total",
        "inturn_ingest_store_seconds_bucket",
        "inturn_ingest_connections",
    ):
        assert name in text
    assert 'inturn_ingest_messages_total{channel="adt",code="AA"}' in text
    assert "DOE" not in text and "H-OK" not in text  # no payload, no control id in labels
    # A channel nobody configured does not become a label of its own.
    assert 'channel="nowhere"' not in text
    assert 'inturn_ingest_messages_total{channel="_other",code="AR"}' in text
    assert [r[3] for r in rows(fresh_db)] == ["H-OK", "H-NE"]


async def test_readyz_reports_a_stale_routing_table(ingest: Ingest) -> None:
    assert ingest.readiness() is None
    assert ingest.router is not None
    ingest.router.refreshed_at = time.monotonic() - 3600
    assert ingest.readiness() is not None and "unreadable" in str(ingest.readiness())
    await ingest.router.refresh()
    assert ingest.readiness() is None


async def test_store_seconds_histogram_and_payload_free_logs(
    ingest: Ingest, caplog: pytest.LogCaptureFixture
) -> None:
    count = counter("inturn_ingest_store_seconds_count", channel="adt")
    caplog.set_level("DEBUG", logger="inturn")
    c = await client(ingest)
    secret = "PID|1||SECRET-MRN-777^^^HOSP^MR||SECRETNAME^X\r"
    assert (await c.send(msg("LOG1", body=secret))).code == "AA"
    await c.write(frame(b"NOT-MSH|SECRET-MRN-777\r"))
    assert (await c.ack()).code == "AR"
    await c.close()
    assert counter("inturn_ingest_store_seconds_count", channel="adt") == count + 1
    assert "SECRET" not in caplog.text
    # what is not known is left out, never printed as None or "?"
    assert "channel adt: AR for a message whose MSH could not be used (23 bytes): " in caplog.text
    assert "None" not in caplog.text and "? bytes" not in caplog.text
    assert metrics.MESSAGES is not None


async def test_stop_waits_for_a_message_being_stored(fresh_db: str) -> None:
    """Shutdown lets the message in flight commit and be acknowledged."""
    register(fresh_db, "hospital/adt-out", "adt")
    ingest = Ingest(config(shutdown_grace=5.0), dsn=fresh_db)
    await ingest.start()
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as blocker:
        await blocker.execute("BEGIN")
        # the delivery queue's own enqueue lock, of the channel: ingest takes the same one
        await blocker.execute(QUEUE_SQL["enqueue_lock"], {"destination": "channel:adt"})
        c = await client(ingest)
        await c.write(frame(msg("INFLIGHT")))
        await asyncio.sleep(0.3)
        stopping = asyncio.create_task(ingest.stop())
        await asyncio.sleep(0.3)
        assert not stopping.done()
        await blocker.execute("ROLLBACK")
        ack = await c.ack()
        await stopping
        await c.close()
    assert ack.code == "AA"
    assert [r[3] for r in rows(fresh_db)] == ["INFLIGHT"]


# --- group commit ------------------------------------------------------------------------------


async def _hold_then_release(
    ingest: Ingest, dsn: str, first: bytes, others: Sequence[bytes]
) -> tuple[Ack, list[Ack]]:
    """Send ``first`` while the channel's lock is held elsewhere, so that its transaction is in
    flight; send ``others`` on their own connections meanwhile (they queue behind it); then
    release the lock."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as blocker:
        await blocker.execute("BEGIN")
        await blocker.execute(QUEUE_SQL["enqueue_lock"], {"destination": "channel:adt"})
        lead = await client(ingest)
        await lead.write(frame(first))
        await asyncio.sleep(0.2)
        followers = [await client(ingest) for _ in others]
        for c, payload in zip(followers, others, strict=True):
            await c.write(frame(payload))
        await asyncio.sleep(0.2)
        await blocker.execute("ROLLBACK")
        lead_ack = await lead.ack()
        acks = [await c.ack() for c in followers]
    for c in [lead, *followers]:
        await c.close()
    return lead_ack, acks


async def test_messages_waiting_on_one_channel_share_a_commit(
    ingest: Ingest, fresh_db: str
) -> None:
    others = [msg(f"G{n}") for n in range(5)] + [msg("G0")]  # a copy inside the batch, too
    lead, acks = await _hold_then_release(ingest, fresh_db, msg("LEAD"), others)
    assert lead.code == "AA"
    assert [(a.code, a.control_id) for a in acks] == [("AA", f"G{n}") for n in range(5)] + [
        ("AA", "G0")
    ]
    assert acks[-1].text is not None and "duplicate" in acks[-1].text
    with psycopg.connect(fresh_db) as conn:
        stored = conn.execute(
            "SELECT control_id, xmin::text FROM inturn_message ORDER BY id"
        ).fetchall()
    assert [cid for cid, _ in stored] == ["LEAD", "G0", "G1", "G2", "G3", "G4"]
    assert len({xmin for cid, xmin in stored if cid != "LEAD"}) == 1  # one transaction


async def test_a_message_the_database_refuses_does_not_sink_its_batch(
    ingest: Ingest, fresh_db: str
) -> None:
    admin(
        fresh_db,
        "ALTER TABLE inturn_message_e1 ADD CONSTRAINT test_no_poison"
        " CHECK (control_id <> 'POISON') NOT VALID",
    )
    try:
        others = [msg("B1"), msg("POISON"), msg("B2")]
        lead, acks = await _hold_then_release(ingest, fresh_db, msg("LEAD"), others)
    finally:
        admin(fresh_db, "ALTER TABLE inturn_message_e1 DROP CONSTRAINT test_no_poison")
    assert lead.code == "AA"
    assert [(a.code, a.control_id) for a in acks] == [("AA", "B1"), ("AE", "POISON"), ("AA", "B2")]
    assert [r[3] for r in rows(fresh_db)] == ["LEAD", "B1", "B2"]
    with psycopg.connect(fresh_db) as conn:
        window = conn.execute("SELECT control_id FROM inturn_received ORDER BY id").fetchall()
    assert window == [("LEAD",), ("B1",), ("B2",)]


async def test_http_rejects_an_invalid_channel_name(ingest: Ingest) -> None:
    async with aiohttp.ClientSession() as http:
        url = f"http://{HOST}:{ingest.http_port}/channels/bad%20name/messages"
        async with http.post(url, data=msg("X")) as response:
            assert response.status == 400
