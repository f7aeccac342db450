"""Receiver profiles at send time (issue 42): what a real receiver gets, over MLLP and HTTP, on
one stream and on lanes; MSH-13 numbers kept with the queue; a refusal, with
``ackPolicy.profile`` unset, kept at the head under ``maxAttempts: 0`` and given up at once
above 0; ``fail`` and ``retry`` set it whatever maxAttempts says.

The stored bytes never change (the receiver gets the shaped ones); without a profile the
receiver gets the stored bytes themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from email.message import Message
from typing import Any

import hl7
import pytest
from psycopg import AsyncConnection

from inturn.worker.hl7.profile import compile_profile
from inturn.worker.senders.http import HttpSenderConfig
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.spec.config import AckPolicy, WorkerConfig
from inturn.worker.store import queue, registry
from inturn.worker.store.model import NewItem
from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.pipeline import FAST_RETRY, cli, rows, until, worker, worker_config

pytestmark = pytest.mark.store

DEST = "ward/shaped"


def message(n: int, *, name: str = "MÜLLER^JÖRG", code: str = "GLU", patient: int = 0) -> bytes:
    """An ORU in UTF-8 (declared), with a Z-segment, an NTE and a code to map."""
    return (
        f"MSH|^~\\&|LAB|HOSP|EHR|WARD|20260101120000||ORU^R01|C{n:04d}|P|2.5.1|||||"
        f"|UNICODE UTF-8\r"
        f"PID|1||{patient or n}^^^HOSP^MR||{name}||19800101|F|||||555-0100\r"
        f"OBX|1|NM|{code}^Glucose||5.4|mmol/L|||||F\r"
        f"NTE|1||a note\r"
        f"ZXT|1|local\r"
    ).encode()


async def enqueue(dsn: str, payloads: list[bytes], destination: str = DEST) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        items = []
        for p in payloads:
            control_id = p.split(b"|")[9].decode()
            items.append(NewItem(destination, "c", control_id, "ORU^R01", p))
        return await queue.enqueue(conn, items)


def shaped_config(sender: Any, spec: dict[str, Any], **changes: Any) -> WorkerConfig:
    return worker_config(DEST, sender, profile=compile_profile(spec), **changes)


#: ``ackPolicy.profile: retry``: a refusal keeps its message at the head (the opt-in).
RETRY_REFUSALS = AckPolicy(profile="retry")


def _to(cfg: WorkerConfig, port: int) -> WorkerConfig:
    return dataclasses.replace(cfg, sender=MllpSenderConfig("127.0.0.1", port))


PROFILE: dict[str, Any] = {
    "set": {"MSH-5": "LIS_NORTH", "MSH-11": "T"},
    "copy": {"MSH-6": "MSH-4"},
    "removeSegments": ["Z*", "NTE"],
    "clear": ["PID-13"],
    "truncate": {"OBX-3.2": 4},
    "charset": {"to": "ISO-8859-1", "unmappable": "refuse"},
    "maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}, "otherwise": "keep"}],
}


def field(msg: bytes, segment: str, number: int, codec: str = "latin-1") -> str:
    parsed = hl7.parse(msg.decode(codec))
    return str(parsed.segment(segment)[number])


@pytest.mark.parametrize("kind", ["mllp", "http"])
async def test_each_rule_kind_reaches_a_real_receiver_and_the_store_keeps_the_original(
    fresh_db: str, kind: str
) -> None:
    stored = [message(1), message(2, code="NA")]
    await enqueue(fresh_db, stored)
    async with MllpReceiver() as mllp_rx, HttpReceiver() as http_rx:
        sender = (
            MllpSenderConfig("127.0.0.1", mllp_rx.port)
            if kind == "mllp"
            else HttpSenderConfig(http_rx.url)
        )
        async with worker(shaped_config(sender, PROFILE), fresh_db):
            await until(lambda: [r["state"] for r in rows(fresh_db, DEST)] == ["delivered"] * 2)
    got = mllp_rx.received if kind == "mllp" else http_rx.received
    assert len(got) == 2
    first = got[0]
    # charset: ISO-8859-1 bytes, declared in MSH-18, decoded by a real peer library
    assert "MÜLLER".encode("latin-1") in first and "MÜLLER".encode() not in first
    parsed = hl7.parse(first.decode("latin-1"))
    assert str(parsed.segment("MSH")[18]) == "8859/1"
    assert str(parsed.segment("PID")[5]) == "MÜLLER^JÖRG"
    # set, copy, clear, truncate, maps, removeSegments
    assert str(parsed.segment("MSH")[5]) == "LIS_NORTH"
    assert str(parsed.segment("MSH")[11]) == "T"
    assert str(parsed.segment("MSH")[6]) == "HOSP"
    assert str(parsed.segment("PID")[13]) == ""
    assert str(parsed.segment("OBX")[3]) == "2345-7^Gluc"
    assert [str(s[0]) for s in parsed] == ["MSH", "PID", "OBX"]
    # correlation fields as stored: MSH-10 (the ACK names it) and PID-3
    assert str(parsed.segment("MSH")[10]) == "C0001"
    assert str(parsed.segment("PID")[3]) == "1^^^HOSP^MR"
    # a code not in the map is kept (otherwise: keep)
    assert field(got[1], "OBX", 3) == "NA^Gluc"
    # the stored bytes are the bytes as received
    assert [bytes(r["payload"]) for r in rows(fresh_db, DEST)] == stored


@pytest.mark.parametrize("lanes", [1, 3])
async def test_without_a_profile_the_receiver_gets_the_stored_bytes(
    fresh_db: str, lanes: int
) -> None:
    odd = [
        message(1),
        b"MSH|^~\\&|A|B|C|D|2026||ORU^R01|C0002|P|2.5\rOBX|1|TX|X||\xe9\xff\x00 raw||||||F\r",
        b"MSH|^~\\&|A|B|C|D|2026||ORU^R01|C0003|P|2.5|||||ZZ|8859/1\rNTE|1||caf\xe9",
    ]
    await enqueue(fresh_db, odd)
    async with MllpReceiver() as rx:
        cfg = worker_config(DEST, rx.port, lanes=lanes)
        assert cfg.profile is None
        async with worker(cfg, fresh_db):
            await rx.wait_for(3)
    assert sorted(rx.received) == sorted(odd)


def body_charset(headers: dict[str, str]) -> str | None:
    """The charset a request's Content-Type names, as a MIME parser reads it (lower case)."""
    parsed = Message()
    parsed["Content-Type"] = headers["Content-Type"]
    return parsed.get_content_charset()


@pytest.mark.parametrize(
    ("to", "named", "configured"),
    [
        ("ISO-8859-1", "iso-8859-1", None),
        ("UTF-8", "utf-8", None),
        ("ASCII", "us-ascii", None),
        # a Content-Type configured with a charset of its own: the body's replaces it
        ("ISO-8859-1", "iso-8859-1", "application/hl7-v2; charset=utf-8; x=1"),
    ],
)
@pytest.mark.parametrize("lanes", [1, 2])
async def test_an_http_receiver_is_told_the_charset_a_profile_converted_to(
    fresh_db: str, to: str, named: str, configured: str | None, lanes: int
) -> None:
    """The Content-Type names the charset the body is in once the profile converted it; the
    receiver decodes the body by that name and a real peer library reads the patient."""
    await enqueue(fresh_db, [message(1), message(2)])
    spec = {"charset": {"to": to, "unmappable": "transliterate"}}
    headers = {"Content-Type": configured} if configured else {}
    async with HttpReceiver() as rx:
        cfg = shaped_config(HttpSenderConfig(rx.url, headers=headers), spec, lanes=lanes)
        async with worker(cfg, fresh_db):
            await until(lambda: [r["state"] for r in rows(fresh_db, DEST)] == ["delivered"] * 2)
    assert len(rx.received) == 2
    for body, got in zip(rx.received, rx.headers, strict=True):
        assert body_charset(got) == named
        assert got["Content-Type"].startswith("application/hl7-v2")
        if configured:
            assert "x=1" in got["Content-Type"]
        patient = str(hl7.parse(body.decode(named)).segment("PID")[5])
        assert patient == ("MULLER^JORG" if to == "ASCII" else "MÜLLER^JÖRG")


async def test_without_a_charset_rule_the_content_type_is_as_configured(fresh_db: str) -> None:
    await enqueue(fresh_db, [message(1)])
    async with HttpReceiver() as rx:
        cfg = shaped_config(HttpSenderConfig(rx.url), {"set": {"MSH-5": "LIS"}})
        async with worker(cfg, fresh_db):
            await until(lambda: [r["state"] for r in rows(fresh_db, DEST)] == ["delivered"])
    assert rx.headers[0]["Content-Type"] == "application/hl7-v2"
    assert body_charset(rx.headers[0]) is None


async def test_with_ack_policy_retry_a_refusal_follows_the_retry_policy(
    fresh_db: str,
) -> None:
    holding = {"maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}, "otherwise": "hold"}]}
    await enqueue(fresh_db, [message(1, code="XYZ"), message(2)])
    async with MllpReceiver() as rx:
        # pending while attempts remain: nothing reaches the receiver, nothing overtakes it
        cfg = shaped_config(rx.port, holding, ack_policy=RETRY_REFUSALS)
        async with worker(cfg, fresh_db):
            await until(lambda: rows(fresh_db, DEST)[0]["attempts"] >= 2)
        first, second = rows(fresh_db, DEST)
        assert first["state"] == "pending" and second["state"] == "pending"
        assert first["last_error"] == (
            "profile: OBX-3.1 'XYZ': has no entry in the map (otherwise: hold)"
        )
        assert rx.received == []
        # a corrected profile lets it go, in order
        fixed = {"maps": [{**holding["maps"][0], "otherwise": "keep"}]}
        async with worker(shaped_config(rx.port, fixed), fresh_db):
            await rx.wait_for(2)
        assert [field(m, "MSH", 10) for m in rx.received] == ["C0001", "C0002"]
        assert field(rx.received[0], "OBX", 3) == "XYZ^Glucose"


async def test_with_ack_policy_retry_a_refusal_is_given_up_after_max_attempts(
    fresh_db: str,
) -> None:
    refusing = {"charset": {"to": "ASCII", "unmappable": "refuse"}}
    await enqueue(fresh_db, [message(1), message(2, name="SMITH^JO")])
    retry = dataclasses.replace(FAST_RETRY, max_attempts=2)
    cfg = shaped_config(0, refusing, retry=retry, ack_policy=RETRY_REFUSALS)
    async with MllpReceiver() as rx, worker(_to(cfg, rx.port), fresh_db):
        await rx.wait_for(1)
        await until(lambda: rows(fresh_db, DEST)[1]["state"] == "delivered")
    first, _ = rows(fresh_db, DEST)
    assert (first["state"], first["attempts"]) == ("failed", 2)
    assert first["last_error"] == (
        "profile: PID-5 'Ü': (U+00DC) has no place in ASCII (unmappable: refuse)"
    )
    assert [field(m, "MSH", 10) for m in rx.received] == ["C0002"]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT queue, state FROM inturn_worklist_item WHERE record_key = %s",
            (str(first["id"]),),
        )
        assert await cur.fetchall() == [("delivery-failed", "pending")]


async def test_with_payload_keys_a_refusal_withholds_the_value(fresh_db: str) -> None:
    from inturn.worker.drain.shaping import for_receiver

    profile = compile_profile({"charset": {"to": "ASCII"}})
    assert profile is not None

    async def never() -> int | None:
        raise AssertionError("a refused message reserves no number")

    got = await for_receiver(message(1), profile, never, reveal=False)
    assert got == (
        "profile",
        "PID-5 (value withheld): (U+00DC) has no place in ASCII (unmappable: refuse)",
    )


async def numbers(dsn: str) -> dict[int, int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT item_id, number FROM inturn_sequence_number")
        return {int(i): int(n) for i, n in await cur.fetchall()}


def msh13(msgs: list[bytes]) -> list[str]:
    return [field(m, "MSH", 13, "utf-8") for m in msgs]


async def test_sequence_numbers_survive_a_retry_a_restart_and_a_takeover(fresh_db: str) -> None:
    spec = {"sequenceNumbers": True}
    ids = await enqueue(fresh_db, [message(n) for n in range(1, 4)])
    async with MllpReceiver(ack_code="AE") as rx:
        # the first holder: its first message refused by the receiver twice (AE), same number
        async with worker(shaped_config(rx.port, spec), fresh_db):
            await rx.wait_for(2)
        assert msh13(rx.received[:2]) == ["1", "1"]
        assert await numbers(fresh_db) == {ids[0]: 1}
        # another holder (a restart, a new lease epoch) sends it with its number, then 2, 3
        rx.ack_code = "AA"
        before = len(rx.received)
        async with worker(shaped_config(rx.port, spec), fresh_db):
            await until(lambda: [r["state"] for r in rows(fresh_db, DEST)] == ["delivered"] * 3)
        assert msh13(rx.received[before:]) == ["1", "2", "3"]
        # one more, after a third holder: the counter went on with the queue
        (later,) = await enqueue(fresh_db, [message(4)])
        async with worker(shaped_config(rx.port, spec), fresh_db):
            await until(lambda: rows(fresh_db, DEST)[3]["state"] == "delivered")
    assert msh13(rx.received[-1:]) == ["4"]
    assert await numbers(fresh_db) == dict(zip([*ids, later], [1, 2, 3, 4], strict=True))


async def test_a_refused_message_spends_no_number(fresh_db: str) -> None:
    spec = {"sequenceNumbers": True, "charset": {"to": "ASCII", "unmappable": "refuse"}}
    retry = dataclasses.replace(FAST_RETRY, max_attempts=1)
    await enqueue(fresh_db, [message(1, name="A^B"), message(2), message(3, name="C^D")])
    cfg = shaped_config(0, spec, retry=retry)
    async with MllpReceiver() as rx, worker(_to(cfg, rx.port), fresh_db):
        await rx.wait_for(2)
        await until(lambda: rows(fresh_db, DEST)[2]["state"] == "delivered")
    assert [r["state"] for r in rows(fresh_db, DEST)] == ["delivered", "failed", "delivered"]
    assert msh13(rx.received) == ["1", "2"]


async def test_lanes_never_repeat_or_skip_a_number(fresh_db: str) -> None:
    spec = {"sequenceNumbers": True, "set": {"MSH-5": "LANES"}}
    total = 24
    await enqueue(fresh_db, [message(n, patient=100 + n % 6) for n in range(1, total + 1)])
    async with HttpReceiver() as rx:
        cfg = shaped_config(HttpSenderConfig(rx.url), spec, lanes=3)
        async with worker(cfg, fresh_db):
            await until(lambda: len(rx.received) >= total)
            await until(lambda: [r["state"] for r in rows(fresh_db, DEST)] == ["delivered"] * total)
    assert sorted(int(n) for n in msh13(rx.received)) == list(range(1, total + 1))
    assert {field(m, "MSH", 5) for m in rx.received} == {"LANES"}


async def test_queue_show_and_payload_as_sent_show_what_the_receiver_got(fresh_db: str) -> None:
    """inturn queue show names the profile and MSH-13; payload --as-sent prints the bytes the
    receiver got, payload the stored ones; a refusal exits 1 naming field and value."""
    spec = {**PROFILE, "sequenceNumbers": True}
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        # as the operator registers a Destination (spec.profile as written)
        assert await registry.register(
            conn,
            destination=DEST,
            namespace="ward",
            name="shaped",
            channel="c",
            message_types=(),
            generation=1,
            suspended=False,
            profile=spec,
        )
        (found,) = [r for r in await registry.list_all(conn) if r.destination == DEST]
        assert found.profile == spec
    stored = message(1)
    (item,) = await enqueue(fresh_db, [stored])
    async with MllpReceiver() as rx, worker(shaped_config(rx.port, spec), fresh_db):
        await rx.wait_for(1)
        await until(lambda: rows(fresh_db, DEST)[0]["state"] == "delivered")
    shown = (await asyncio.to_thread(cli, fresh_db, "queue", "show", str(item))).stdout.decode()
    assert "sequence:      1 (MSH-13 as sent)" in shown
    assert f"inturn queue payload {item} --as-sent" in shown
    why = ("--why", "ticket 5")
    printed = await asyncio.to_thread(
        cli, fresh_db, "queue", "payload", str(item), "--as-sent", *why
    )
    assert printed.stdout == rx.received[0]
    plain = await asyncio.to_thread(cli, fresh_db, "queue", "payload", str(item), *why)
    assert plain.stdout == stored
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_destination SET profile = %s::jsonb WHERE destination = %s",
            (json.dumps({"charset": {"to": "ASCII"}}), DEST),
        )
    refused = await asyncio.to_thread(
        cli, fresh_db, "queue", "payload", str(item), "--as-sent", *why, check=False
    )
    assert refused.returncode == 1 and refused.stdout == b""
    assert "PID-5 'Ü': (U+00DC) has no place in ASCII" in refused.stderr.decode()


def fields_of(msg: bytes, codec: str = "utf-8") -> dict[tuple[str, int], str]:
    """Every field of a message by (segment ID and its occurrence, field number), MSH-n as in
    the standard."""
    out: dict[tuple[str, int], str] = {}
    seen: dict[str, int] = {}
    for segment in msg.decode(codec).split("\r"):
        if not segment:
            continue
        sid = segment[:3]
        seen[sid] = seen.get(sid, 0) + 1
        key = f"{sid}{seen[sid]}"
        for n, value in enumerate(segment.split("|")):
            out[(key, n + 1 if sid == "MSH" and n else n)] = value
    return out


#: One rule kind at a time: the spec, and the fields it changes (segment occurrence, field).
KINDS: dict[str, tuple[dict[str, Any], set[tuple[str, int]]]] = {
    "set": ({"set": {"MSH-5": "NORTH"}}, {("MSH1", 5)}),
    "copy": ({"copy": {"MSH-6": "MSH-4"}}, {("MSH1", 6)}),
    "removeSegments": ({"removeSegments": ["Z*"]}, {("ZXT1", n) for n in range(3)}),
    "clear": ({"clear": ["PID-13"]}, {("PID1", 13)}),
    "truncate": ({"truncate": {"OBX-3.2": 3}}, {("OBX1", 3)}),
    "maps": ({"maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}}]}, {("OBX1", 3)}),
    "sequenceNumbers": ({"sequenceNumbers": True}, {("MSH1", 13)}),
    "charset": ({"charset": {"to": "ISO-8859-1"}}, {("MSH1", 18)}),
}


@pytest.mark.parametrize("transport", ["mllp", "http"])
@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_one_rule_kind_changes_its_fields_and_not_one_other(
    fresh_db: str, kind: str, transport: str
) -> None:
    """End to end per rule kind: the receiver's message, field by field, equals the stored one
    but for the fields the rule names (with charset: the same text in ISO-8859-1)."""
    spec, changed = KINDS[kind]
    stored = message(1)
    await enqueue(fresh_db, [stored])
    async with MllpReceiver() as mllp_rx, HttpReceiver() as http_rx:
        sender = (
            MllpSenderConfig("127.0.0.1", mllp_rx.port)
            if transport == "mllp"
            else HttpSenderConfig(http_rx.url)
        )
        async with worker(shaped_config(sender, spec), fresh_db):
            await until(lambda: rows(fresh_db, DEST)[0]["state"] == "delivered")
    (got,) = mllp_rx.received if transport == "mllp" else http_rx.received
    codec = "latin-1" if kind == "charset" else "utf-8"
    before, after = fields_of(stored), fields_of(got, codec)
    differ = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert differ == changed
    # a real peer library reads what was sent, in the charset MSH-18 now names
    parsed = hl7.parse(got.decode(codec))
    assert str(parsed.segment("PID")[5]) == "MÜLLER^JÖRG"
    assert str(parsed.segment("MSH")[10]) == "C0001"
    assert bytes(rows(fresh_db, DEST)[0]["payload"]) == stored


async def test_on_lanes_a_retried_refusal_holds_its_patient_and_the_others_go(
    fresh_db: str,
) -> None:
    """With ``ackPolicy.profile: retry`` the lanes record a refusal as that lane's answer: its
    patient's later messages wait behind it, other patients' messages go; nothing of it reaches
    the receiver."""
    holding = {"maps": [{"field": "OBX-3.1", "table": {"GLU": "GLU"}, "otherwise": "hold"}]}
    await enqueue(
        fresh_db,
        [
            message(1, code="XYZ", patient=7),  # refused
            message(2, patient=7),  # same patient: waits behind it
            message(3, patient=8),
            message(4, patient=9),
        ],
    )
    async with MllpReceiver() as rx:
        cfg = shaped_config(rx.port, holding, lanes=3, ack_policy=RETRY_REFUSALS)
        async with worker(cfg, fresh_db):
            await rx.wait_for(2)
            await until(lambda: rows(fresh_db, DEST)[0]["attempts"] >= 2)
        assert sorted(field(m, "MSH", 10) for m in rx.received) == ["C0003", "C0004"]
        states = [(r["state"], r["last_error"]) for r in rows(fresh_db, DEST)]
        assert states[0] == (
            "pending",
            "profile: OBX-3.1 'XYZ': has no entry in the map (otherwise: hold)",
        )
        assert [s for s, _ in states[1:]] == ["pending", "delivered", "delivered"]


async def failed_items(dsn: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The ``delivery-failed`` work items: (record key, reason, details), oldest first."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT record_key, reason, details FROM inturn_worklist_item"
            " WHERE queue = 'delivery-failed' ORDER BY id"
        )
        return [(str(k), str(r), dict(d)) for k, r, d in await cur.fetchall()]


LATIN1_REFUSING = {"charset": {"to": "ISO-8859-1", "unmappable": "refuse"}}
POLISH_REFUSAL = "profile: PID-5 'Ł': (U+0141) has no place in ISO-8859-1 (unmappable: refuse)"


async def test_a_refusal_retrying_for_ever_holds_the_head(fresh_db: str) -> None:
    """A new user's trial: ``unmappable: refuse`` (or a map's ``otherwise: hold``) and
    ``maxAttempts: 0``; the refused A01 was given up and its A03 delivered. With maxAttempts 0
    and ``ackPolicy.profile`` unset, the refused message stays at the head, naming the
    refusal, and nothing overtakes it (a person corrects the profile or skips it)."""
    assert FAST_RETRY.max_attempts == 0
    stored = [message(1, name="ŁUKASZ^JAN"), message(2), message(3)]
    await enqueue(fresh_db, stored)
    async with MllpReceiver() as rx, worker(shaped_config(rx.port, LATIN1_REFUSING), fresh_db):
        await until(lambda: rows(fresh_db, DEST)[0]["attempts"] >= 2)
        assert rx.received == []
    got = rows(fresh_db, DEST)
    assert [r["state"] for r in got] == ["pending", "pending", "pending"]
    assert got[0]["last_error"] == POLISH_REFUSAL
    assert await failed_items(fresh_db) == []


async def test_a_refusal_is_given_up_at_once_when_messages_may_leave_the_stream(
    fresh_db: str,
) -> None:
    """The same refusal with ``maxAttempts`` above 0: it refuses at every attempt, so it goes
    onto ``delivery-failed`` at its first (not its fifth), naming the refusal, and the messages
    behind it go in order."""
    stored = [message(1, name="ŁUKASZ^JAN"), message(2), message(3), message(4)]
    await enqueue(fresh_db, stored)
    retry = dataclasses.replace(FAST_RETRY, max_attempts=5)
    cfg = shaped_config(0, LATIN1_REFUSING, retry=retry)
    async with MllpReceiver() as rx, worker(_to(cfg, rx.port), fresh_db):
        await rx.wait_for(3)
        await until(lambda: rows(fresh_db, DEST)[3]["state"] == "delivered")
    first = rows(fresh_db, DEST)[0]
    assert (first["state"], first["attempts"], first["last_error"]) == (
        "failed",
        1,
        POLISH_REFUSAL,
    )
    assert [field(m, "MSH", 10) for m in rx.received] == ["C0002", "C0003", "C0004"]
    ((key, reason, details),) = await failed_items(fresh_db)
    assert (key, reason) == (str(first["id"]), "profile")
    assert (details["outcome"], details["attempts"], details["cause"]) == (
        "profile",
        1,
        POLISH_REFUSAL,
    )


async def test_on_lanes_a_refusal_given_up_lets_its_patient_go_on_in_order(
    fresh_db: str,
) -> None:
    """With lanes (and maxAttempts above 0) a refused message is given up at once too; its
    patient's later messages go after it (a message given up holds nothing), in their order;
    other patients never wait."""
    await enqueue(
        fresh_db,
        [
            message(1, name="ŁUKASZ^JAN", patient=7),  # refused
            message(2, patient=7),
            message(3, patient=7),
            message(4, patient=8),
        ],
    )
    retry = dataclasses.replace(FAST_RETRY, max_attempts=3)
    cfg = shaped_config(0, LATIN1_REFUSING, lanes=3, retry=retry)
    async with MllpReceiver() as rx, worker(_to(cfg, rx.port), fresh_db):
        await rx.wait_for(3)
        await until(lambda: all(r["state"] != "pending" for r in rows(fresh_db, DEST)))
    got = rows(fresh_db, DEST)
    assert [(r["state"], r["attempts"]) for r in got] == [
        ("failed", 1),
        ("delivered", 1),
        ("delivered", 1),
        ("delivered", 1),
    ]
    sent = [field(m, "MSH", 10) for m in rx.received]
    assert sorted(sent) == ["C0002", "C0003", "C0004"]
    assert sent.index("C0002") < sent.index("C0003")  # patient 7's order kept
    # the give-up was recorded before its patient's next message was sent
    assert got[0]["finished_at"] <= got[1]["last_attempt"]
    assert [(k, r) for k, r, _ in await failed_items(fresh_db)] == [(str(got[0]["id"]), "profile")]


@pytest.mark.parametrize("unmappable", ["refuse", "replace", "transliterate"])
async def test_text_that_is_not_in_its_declared_charset_is_refused_in_every_mode(
    fresh_db: str, unmappable: str
) -> None:
    """Latin-1 MÜLLER in a message declaring UNICODE UTF-8: no mode sends ``M?LLER``; the
    message is refused naming the field and the byte, and given up at once (maxAttempts above
    0)."""
    latin = message(1, name="MÜLLER^JÖRG").replace("MÜLLER^JÖRG".encode(), b"M\xdcLLER^J\xd6RG")
    await enqueue(fresh_db, [latin, message(2)])
    spec = {"charset": {"to": "ISO-8859-1", "unmappable": unmappable}}
    retry = dataclasses.replace(FAST_RETRY, max_attempts=3)
    cfg = shaped_config(0, spec, retry=retry)
    async with MllpReceiver() as rx, worker(_to(cfg, rx.port), fresh_db):
        await rx.wait_for(1)
        await until(lambda: rows(fresh_db, DEST)[1]["state"] == "delivered")
    first = rows(fresh_db, DEST)[0]
    assert (first["state"], first["attempts"]) == ("failed", 1)
    assert first["last_error"] == (
        "profile: PID-5 '0xDC': does not decode as UNICODE UTF-8: the message is not in the"
        " character set it declares (refused whatever unmappable says)"
    )
    assert [field(m, "MSH", 10) for m in rx.received] == ["C0002"]
    assert not any(b"M?LLER" in m for m in rx.received)
