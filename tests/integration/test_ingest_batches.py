"""HL7 batches (FHS/BHS ... BTS/FTS) through ingest over MLLP and HTTP, on a real Postgres:
stored whole and in order in one transaction, or refused whole with an ERR naming the
message."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import frame
from inturn.worker.ingest.service import Ingest
from tests.support.ingest import BHS, FHS, HOST, Client, acks, batch, config, msg, rows
from tests.support.pipeline import register

pytestmark = pytest.mark.store


@pytest.fixture
async def ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    register(fresh_db, "hospital/adt-out", "adt", ["ADT^*"])
    register(fresh_db, "hospital/archive", "adt")
    async with Ingest(config(max_batch_messages=5), dsn=fresh_db) as running:
        yield running


async def mllp(ingest: Ingest, payload: bytes) -> bytes:
    c = await Client.connect(ingest.mllp_ports["adt"])
    await c.write(frame(payload))
    answer = await c.reply()
    await c.close()
    return answer


async def test_a_batch_over_mllp_is_stored_in_order_and_answered_per_message(
    ingest: Ingest, fresh_db: str
) -> None:
    answer = await mllp(ingest, batch(msg("B1"), msg("B2", "ORU^R01"), msg("B3", "ADT^A03")))
    assert answer.startswith(b"FHS|") and b"\rBTS|3\rFTS|1\r" in answer
    bhs = answer.split(b"\r")[1].split(b"|")
    assert bhs[11] == b"B-7"  # BHS-12 references the batch
    assert acks(answer) == [
        ("AA", "B1", None, None),
        ("AA", "B2", None, None),
        ("AA", "B3", None, None),
    ]
    stored = rows(fresh_db)
    # each message once per destination that takes it, in batch order per destination
    by_destination: dict[str, list[str]] = {}
    for _, destination, _, control_id, _, _ in stored:
        by_destination.setdefault(destination, []).append(control_id)
    assert by_destination == {
        "hospital/adt-out": ["B1", "B3"],
        "hospital/archive": ["B1", "B2", "B3"],
    }
    assert bytes(stored[0][5]) == msg("B1")


async def test_one_refused_message_refuses_the_batch_whole(ingest: Ingest, fresh_db: str) -> None:
    too_long = msg("B" * 200)  # MSH-10 over its bound: refused alone, so the batch too
    answer = await mllp(ingest, batch(msg("B1"), too_long, msg("B3")))
    got = acks(answer)
    assert [(code, cid) for code, cid, _, _ in got] == [
        ("AR", "B1"),
        ("AR", "B" * 199),  # its MSA-2 echo cut to MSH-10's length
        ("AR", "B3"),
    ]
    assert got[1][2] == "104"  # the refused message's own ERR
    assert got[0][2] == "207" and "message 2 of the batch (MSH-10 BBB" in (got[0][3] or "")
    assert b"refused: message 2 of the batch" in answer
    no_id = b"MSH|^~\\&|A|B|C|D|||ADT^A01||P|2.5\r"
    got = acks(await mllp(ingest, batch(no_id, msg("B4"))))
    assert [a[:3] for a in got] == [("AR", "", "101"), ("AR", "B4", "207")]
    assert "message 1 of the batch was refused" in (got[1][3] or "")
    assert rows(fresh_db) == []


async def test_a_batch_over_the_bound_or_out_of_sequence_is_refused_before_storing(
    ingest: Ingest, fresh_db: str
) -> None:
    too_many = batch(*(msg(f"N{n}") for n in range(6)))
    ack = parse_ack(await mllp(ingest, too_many))
    assert (ack.code, ack.error_code) == ("AR", "104")
    lying = FHS + BHS + msg("L1") + b"BTS|2\rFTS|1\r"
    ack = parse_ack(await mllp(ingest, lying))
    assert (ack.code, ack.error_code) == ("AR", "100")
    assert "BTS-1 says 2 messages" in (ack.error_text or "")
    assert rows(fresh_db) == []


async def test_a_batch_over_http(ingest: Ingest, fresh_db: str) -> None:
    url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=batch(msg("H1"), msg("H2"), trailer=False)) as response:
            assert response.status == 200
            answer = await response.read()
        assert [a[:2] for a in acks(answer)] == [("AA", "H1"), ("AA", "H2")]
        refused = batch(msg("H3"), msg("H4", "ZZZ^Z01"))
        register(fresh_db, "hospital/archive", "adt", ["ADT^*"])
        await _routing_refreshed(ingest)
        async with http.post(url, data=refused) as response:
            assert response.status == 400
            got = acks(await response.read())
    assert [a[:3] for a in got] == [("AR", "H3", "207"), ("AR", "H4", "200")]
    assert sorted({r[3] for r in rows(fresh_db)}) == ["H1", "H2"]


async def _routing_refreshed(ingest: Ingest) -> None:
    import asyncio

    for _ in range(100):
        table = ingest.router.table
        if all(r.message_types for r in table.routes("adt")):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the routing table was not refreshed")
