"""The destination registry SQL (worker/store/registry.py) against the real schema."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
import pytest

from inturn.worker.store import registry


async def test_register_is_idempotent_and_routes_by_channel(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        args = {
            "namespace": "ward",
            "channel": "adt",
            "message_types": ["ADT^A0*"],
            "generation": 1,
            "suspended": False,
        }
        assert await registry.register(conn, destination="ward/a", name="a", **args)
        assert not await registry.register(conn, destination="ward/a", name="a", **args)
        assert await registry.register(conn, destination="ward/b", name="b", **args)
        await registry.register(conn, destination="ward/c", name="c", **{**args, "channel": "lab"})
        routed = await registry.active_for_channel(conn, "adt")
        assert [r.destination for r in routed] == ["ward/a", "ward/b"]
        assert routed[0].message_types == ("ADT^A0*",) and not routed[0].deleted

        assert await registry.mark_deleted(conn, "ward/a")
        assert not await registry.mark_deleted(conn, "ward/a")
        assert [r.destination for r in await registry.active_for_channel(conn, "adt")] == ["ward/b"]
        # applying it again brings it back
        assert await registry.register(conn, destination="ward/a", name="a", **args)
        rows = {r.destination: r for r in await registry.list_all(conn)}
        assert not rows["ward/a"].deleted and rows["ward/c"].channel == "lab"


async def test_status_depth_is_one_grouped_query(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
            " size, attempts, last_error, enqueued_at) VALUES"
            " ('ns/a', 'adt', '1', 'ADT^A01', 'p', 1, 2, 'timeout: 30s', '2026-01-01T00:00:00Z'),"
            " ('ns/a', 'adt', '2', 'ADT^A01', 'p', 1, 0, NULL, '2026-01-01T00:01:00Z'),"
            " ('ns/b', 'adt', '3', 'ADT^A01', 'p', 1, 0, NULL, now())"
        )
        await conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
            " size, state, finished_at) VALUES"
            " ('ns/a', 'adt', '0', 'ADT^A01', 'p', 1, 'failed', now()),"
            " ('ns/c', 'adt', '9', 'ADT^A01', 'p', 1, 'delivered', now())"
        )
        depth = await registry.status_depth(conn)
    assert set(depth) == {"ns/a", "ns/b"}
    a = depth["ns/a"]
    assert (a.pending, a.failed, a.max_attempts, a.head_attempts) == (2, 1, 2, 2)
    assert a.head_error == "timeout: 30s"
    assert a.oldest == datetime(2026, 1, 1, tzinfo=UTC)
    assert depth["ns/b"].head_attempts == 0 and depth["ns/b"].head_error is None


async def test_at_most_one_live_destination_serves_a_carrier(fresh_db: str) -> None:
    args = {
        "namespace": "ward",
        "channel": "res",
        "message_types": [],
        "generation": 1,
        "suspended": False,
    }
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await registry.register(
            conn, destination="ward/a", name="a", carriers=["LH", "OS"], **args
        )
        assert not await registry.register(
            conn, destination="ward/a", name="a", carriers=["OS", "LH"], **args
        )
        with pytest.raises(registry.CarrierTaken) as taken:
            await registry.register(
                conn, destination="ward/b", name="b", carriers=["UA", "LH"], **args
            )
        assert str(taken.value) == "spec.carriers: LH is already served by ward/a"
        rows = {r.destination: r for r in await registry.list_all(conn)}
        assert set(rows) == {"ward/a"}  # nothing of b was written
        assert rows["ward/a"].carriers == ("LH", "OS")

        # a drops LH: b may take it; a deleted Destination releases what it served
        assert await registry.register(
            conn, destination="ward/a", name="a", carriers=["OS"], **args
        )
        assert await registry.register(
            conn, destination="ward/b", name="b", carriers=["UA", "LH"], **args
        )
        assert await registry.mark_deleted(conn, "ward/a")
        assert await registry.register(
            conn, destination="ward/c", name="c", carriers=["OS"], **args
        )
        rows = {r.destination: r for r in await registry.list_all(conn)}
        assert rows["ward/a"].carriers == () and rows["ward/b"].carriers == ("LH", "UA")


async def test_two_registrations_racing_for_a_carrier_one_wins(fresh_db: str) -> None:
    args = {"namespace": "ward", "channel": "res", "message_types": [], "generation": 1}

    async def claim(name: str) -> bool:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            try:
                await registry.register(
                    conn,
                    destination=f"ward/{name}",
                    name=name,
                    suspended=False,
                    carriers=["LH"],
                    **args,
                )
            except registry.CarrierTaken:
                return False
            return True

    results = await asyncio.gather(*(claim(f"d{i}") for i in range(8)))
    assert sorted(results) == [False] * 7 + [True]
