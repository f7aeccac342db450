"""Readers and people's actions on the channel log (issue 43, migration 0038): a destination's
queue is its rows plus the log rows routed to it past its cursor; depth counts both, exactly
and per destination; drain, erasure, resend and the sweeper act on both."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import delivery, reads, registry
from inturn.worker.store import lease as leases
from tests.integration.test_channel_log_pull import CHANNEL, append

pytestmark = pytest.mark.store

A = "ward/a"
B = "ward/b"
C = "ward/c"


def register(conn: psycopg.Connection, *destinations: str, channel: str = CHANNEL) -> None:
    for d in destinations:
        ns, name = d.split("/")
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES (%s, %s, %s, %s)",
            (d, ns, name, channel),
        )


async def test_depth_counts_the_log_rows_each_destination_has_not_pulled(fresh_db: str) -> None:
    """A pulled some of its rows (a cursor), B never pulled (registered, no cursor), C takes
    none of them; an unrouted message waits for its channel's holder. Every reader of depth
    (queue depth, the operator's status, the list of destinations with work) counts exactly
    the rows each one has, pulled or not."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        both = append(sync, [A, B], 3)
        only_b = append(sync, [B], 2)
        append(sync, ["_unrouted/" + CHANNEL], 1)
        sync.execute("UPDATE inturn_message SET enqueued_at = now() - interval '1 hour'"
                     " WHERE id = %s", (both[0],))  # fmt: skip
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w-a", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease, limit=2)  # 2 pulled, 1 left
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            more = append(sync, [A], 2)
        rows = {r.destination: r for r in await reads.depth(conn)}
        assert {d: r.pending for d, r in rows.items()} == {
            A: 2 + 1 + len(more),
            B: len(both) + len(only_b),
            "_unrouted/" + CHANNEL: 1,
        }
        assert rows[A].channel == CHANNEL and rows[B].channel == CHANNEL
        assert rows[A].oldest_seconds >= 3600 and rows[B].oldest_seconds >= 3600
        assert rows[A].max_attempts == 0 and rows[B].failed == 0
        [only] = await reads.depth(conn, B)
        assert (only.destination, only.pending) == (B, 5)
        assert await reads.depth(conn, C) == []
        status = await registry.status_depth(conn)
        assert {d: s.pending for d, s in status.items()} == {d: r.pending for d, r in rows.items()}
        assert await reads.pending_destinations(conn) == sorted(rows)
        # once pulled, the same numbers from the rows alone
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        assert [r.pending for r in await reads.depth(conn, A)] == [5]
        cur = await conn.execute("SELECT count(*) FROM inturn_unpulled(%s)", (A,))
        assert await cur.fetchone() == (0,)


async def test_depth_of_two_hundred_destinations_finds_the_one_behind(fresh_db: str) -> None:
    """200 destinations on one channel, every cursor at the log's end but one: depth names
    that one with its exact count (with every worker live, each destination costs one probe
    of the log's (channel, id) index; bench/fanout.py prints the time)."""
    dests = [f"fan/d{i:03}" for i in range(200)]
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, *dests)
        ids = append(sync, dests, 20)
        sync.execute(
            "INSERT INTO inturn_cursor (destination, channel, position)"
            " SELECT d, %s, %s FROM unnest(%s::text[]) AS d",
            (CHANNEL, ids[-1], dests),
        )
        sync.execute("UPDATE inturn_cursor SET position = %s WHERE destination = %s",
                     (ids[4], dests[7]))  # fmt: skip
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        rows = await reads.depth(conn)
    assert [(r.destination, r.pending) for r in rows] == [(dests[7], 15)]
