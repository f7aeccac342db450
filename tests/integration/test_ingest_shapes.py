"""The worst message shapes through a real ingest: a message with 12,000 PID-3 repetitions (the
one that froze every channel and /healthz for 16-25 s, then got AE) is accepted with its
identifiers capped, and meanwhile /healthz and the other channel keep answering."""

from __future__ import annotations

import asyncio

import aiohttp
import psycopg
import pytest

from inturn.worker.hl7.pid import CAPPED_KEY, lookup_key
from inturn.worker.ingest.service import Ingest
from inturn.worker.testing import SHAPE_MSH, worst_shapes
from tests.support.ingest import HOST, Client, config, msg
from tests.support.pipeline import register

pytestmark = pytest.mark.store


def twelve_thousand() -> bytes:
    reps = "~".join(f"MRN{i}^^^HOSP" for i in range(12_000))
    return SHAPE_MSH + f"PID|1||{reps}||DOE^JANE\r".encode()


def stored_keys(dsn: str, control_id: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT patient_keys FROM inturn_message WHERE control_id = %s", (control_id,)
        ).fetchone()
    assert row is not None
    return list(row[0])


async def test_healthz_and_other_channels_answer_while_a_huge_repetition_list_is_stored(
    fresh_db: str,
) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    register(fresh_db, "hospital/lab-out", "lab")
    big = twelve_thousand()
    assert len(big) > 150_000
    async with Ingest(config(max_indexed_identifiers=50), dsn=fresh_db) as ingest:
        ops = f"http://{HOST}:{ingest.ops_port}/healthz"
        senders = [await Client.connect(ingest.mllp_ports["adt"]) for _ in range(3)]
        lab = await Client.connect(ingest.mllp_ports["lab"])

        async def probes(http: aiohttp.ClientSession) -> list[int]:
            statuses = []
            for _ in range(20):
                async with http.get(ops) as response:
                    statuses.append(response.status)
                await asyncio.sleep(0)
            return statuses

        async def small() -> list[str]:
            return [(await lab.send(msg(f"LAB{n}"))).code for n in range(20)]

        async with aiohttp.ClientSession() as http:
            big_acks, statuses, lab_codes = await asyncio.gather(
                asyncio.gather(*(c.send(big.replace(b"|SHAPE|", b"|BIG%d|" % n))
                                 for n, c in enumerate(senders))),
                probes(http),
                small(),
            )  # fmt: skip
        for c in (*senders, lab):
            await c.close()
    assert [a.code for a in big_acks] == ["AA", "AA", "AA"]
    assert statuses == [200] * 20
    assert lab_codes == ["AA"] * 20
    keys = stored_keys(fresh_db, "BIG0")
    # 50 identifiers, each alone and with its authority, and the capped mark (a lane barrier)
    assert len(keys) == 101 and CAPPED_KEY in keys
    assert lookup_key("MRN49", "HOSP") in keys
    assert lookup_key("MRN50") not in keys


@pytest.mark.parametrize("name", sorted(worst_shapes(1024)))
async def test_every_worst_shape_is_accepted(fresh_db: str, name: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    payload = worst_shapes(1 << 20)[name]
    async with Ingest(config(), dsn=fresh_db) as ingest:
        c = await Client.connect(ingest.mllp_ports["adt"])
        ack = await c.send(payload)
        await c.close()
    assert (ack.code, ack.control_id) == ("AA", "SHAPE")
    assert len(stored_keys(fresh_db, "SHAPE")) <= 300
