"""Filters on HL7 fields (spec.filter.fields) on a real Postgres: the registry keeps them, the
router reads them, and ingest stores a message only for the destinations whose conditions hold."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import frame
from inturn.worker.ingest.routing import Router
from inturn.worker.ingest.service import Ingest
from inturn.worker.store import registry
from tests.support.db import register
from tests.support.ingest import Client, acks, batch, config, rows

pytestmark = pytest.mark.store

NORTH = [{"field": "MSH-4", "operator": "In", "values": ["NORTH"]}]
WARD_4W = [{"field": "PV1-3", "operator": "Matches", "values": ["4W*"]}]


def oru(control_id: str, facility: str) -> bytes:
    return (
        f"MSH|^~\\&|LAB|{facility}|LIS|{facility}|20261201||ORU^R01|{control_id}|P|2.5\r"
        f"PID|1||P1^^^{facility}^MR\rOBR|1|PL1||GLU\rOBX|1|NM|GLU||5.4\r"
    ).encode()


def adt(control_id: str, ward: str) -> bytes:
    return (
        f"MSH|^~\\&|PAS|NORTH|BB|NORTH|20261201||ADT^A02|{control_id}|P|2.5\r"
        f"PID|1||P2^^^NORTH^MR\rPV1|1|I|{ward}^101^A^NORTH\r"
    ).encode()


async def put(
    conn: AsyncConnection[Any],
    destination: str,
    channel: str,
    message_types: list[str],
    fields: list[dict[str, Any]] | None,
) -> bool:
    return await register(
        conn, destination, channel, message_types=message_types, filter_fields=fields
    )


async def test_the_registry_keeps_field_filters_and_the_router_reads_them(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await put(conn, "lab/lis-north", "lab", ["ORU^R01"], NORTH)
        assert not await put(conn, "lab/lis-north", "lab", ["ORU^R01"], NORTH)  # no change
        assert await put(conn, "lab/archive", "lab", [], None)
        [north] = [r for r in await registry.list_all(conn) if r.name == "lis-north"]
        assert north.filter_fields == NORTH
        async with AsyncConnectionPool(fresh_db, min_size=1, max_size=1, open=False) as pool:
            router = Router(pool)
            table = await router.refresh()
            assert table.route("lab", "ORU", "R01", oru("1", "NORTH")).destinations == (
                "lab/archive",
                "lab/lis-north",
            )
            assert table.route("lab", "ORU", "R01", oru("2", "SOUTH")).destinations == (
                "lab/archive",
            )
            # a changed filter is a change, and the next refresh routes by it
            assert await put(conn, "lab/lis-north", "lab", ["ORU^R01"], None)
            table = await router.refresh()
            assert table.route("lab", "ORU", "R01", oru("3", "SOUTH")).destinations == (
                "lab/archive",
                "lab/lis-north",
            )


async def test_ingest_stores_a_message_only_for_the_destinations_its_fields_pass(
    fresh_db: str,
) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await put(conn, "lab/lis-north", "lab", ["ORU^R01"], NORTH)
        await put(
            conn,
            "lab/lis-south",
            "lab",
            ["ORU^R01"],
            [{"field": "MSH-4", "operator": "In", "values": ["SOUTH"]}],
        )
        await put(conn, "ward/bed-board-4w", "adt", ["ADT^*"], WARD_4W)
    async with Ingest(config(), dsn=fresh_db) as ingest:
        lab = await Client.connect(ingest.mllp_ports["lab"])
        assert (await lab.send(oru("N1", "NORTH"))).code == "AA"
        assert (await lab.send(oru("S1", "SOUTH"))).code == "AA"
        east = await lab.send(oru("E1", "EAST"))  # no facility's LIS: refused, as a type is
        await lab.close()
        adt_client = await Client.connect(ingest.mllp_ports["adt"])
        assert (await adt_client.send(adt("W1", "4W"))).code == "AA"
        other_ward = await adt_client.send(adt("W2", "5E"))
        await adt_client.close()
    assert (east.code, east.error_code, other_ward.code) == ("AR", "200", "AR")
    assert east.error_text == "no destination of channel lab takes this message of type ORU^R01"
    assert [(r[1], r[3]) for r in rows(fresh_db)] == [
        ("lab/lis-north", "N1"),
        ("lab/lis-south", "S1"),
        ("ward/bed-board-4w", "W1"),
    ]


async def test_a_channel_that_accepts_unrouted_messages_answers_aa_and_counts_them(
    fresh_db: str,
) -> None:
    """Mirth's FILTERED: AA, nothing stored, counted; over MLLP, HTTP and in a batch (where
    the other messages are stored); a channel without the declaration still answers AR."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await put(conn, "lab/lis-north", "lab", ["ORU^R01"], NORTH)

    def dropped(channel: str, reason: str) -> float:
        labels = {"channel": channel, "reason": reason, "outcome": "dropped"}
        return REGISTRY.get_sample_value("inturn_ingest_unrouted_total", labels) or 0.0

    before = (dropped("lab", "filtered"), dropped("adt", "no_destinations"))
    cfg = config(accept_unrouted=frozenset({"lab", "adt"}))
    async with Ingest(cfg, dsn=fresh_db) as ingest:
        lab = await Client.connect(ingest.mllp_ports["lab"])
        south = await lab.send(oru("S1", "SOUTH"))
        assert (await lab.send(oru("N1", "NORTH"))).code == "AA"
        await lab.write(frame(batch(oru("N2", "NORTH"), oru("S2", "SOUTH"))))
        answered = await lab.reply()
        await lab.close()
        adt_client = await Client.connect(ingest.mllp_ports["adt"])
        nowhere = await adt_client.send(adt("W1", "4W"))
        await adt_client.close()
        url = f"http://127.0.0.1:{ingest.http_port}/channels/lab/messages"
        async with aiohttp.ClientSession() as http, http.post(url, data=oru("S3", "SOUTH")) as r:
            assert r.status == 200
            over_http = parse_ack(await r.read())
    assert (south.code, south.text) == (
        "AA",
        "accepted, not stored: no destination of channel lab takes it",
    )
    assert (nowhere.code, over_http.code) == ("AA", "AA")
    assert [a[:2] for a in acks(answered)] == [("AA", "N2"), ("AA", "S2")]
    assert [(r[1], r[3]) for r in rows(fresh_db)] == [
        ("lab/lis-north", "N1"),
        ("lab/lis-north", "N2"),
    ]
    after = (dropped("lab", "filtered"), dropped("adt", "no_destinations"))
    assert (after[0] - before[0], after[1] - before[1]) == (3, 1)
