"""Filters on HL7 fields (spec.filter.fields) on a real Postgres: the registry keeps them, the
router reads them, and ingest stores a message only for the destinations whose conditions hold."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from inturn.worker.ingest.routing import Router
from inturn.worker.store import registry

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
    namespace, name = destination.split("/")
    return await registry.register(
        conn,
        destination=destination,
        namespace=namespace,
        name=name,
        channel=channel,
        message_types=message_types,
        generation=1,
        suspended=False,
        filter_fields=fields,
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
