"""A destination's pull from its channel's log (issue 43, docs/explanation/storage-layout.md):
the log rows routed to it, past its cursor, become slim rows of its queue in log order; the
cursor never skips a row; the lease fences a puller that lost it; the statement plans on the
log's (channel, id) index."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import delivery
from inturn.worker.store import lease as leases
from inturn.worker.store.lease import LeaseLost
from inturn.worker.store.queries import load
from tests.support.channel_log import append, reset_epochs

pytestmark = pytest.mark.store

A = "ward/a"
B = "ward/b"
CHANNEL = "adt"


async def queued(conn: AsyncConnection, destination: str) -> list[tuple[int, str]]:
    cur = await conn.execute(
        "SELECT message_id, control_id FROM inturn_delivery d WHERE destination = %s"
        " AND payload IS NULL ORDER BY id",
        (destination,),
    )
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def test_a_pull_takes_its_routed_rows_in_log_order_and_moves_the_cursor(
    fresh_db: str,
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        both = append(sync, [A, B], 3)
        only_b = append(sync, [B], 2)
        both += append(sync, [A, B], 2)
        other = append(sync, [A], 2, channel="orm")  # another channel's log: not A's here
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease_a = await leases.acquire(conn, A, "w-a", 60)
        first = await delivery.pull(conn, A, CHANNEL, lease=lease_a, limit=2)
        assert (first.count, first.position, first.more) == (2, both[1], True)
        rest = await delivery.pull(conn, A, CHANNEL, lease=lease_a)
        # fewer than the limit: the cursor moves to the channel's highest id, past B's own rows
        assert (rest.count, rest.position, rest.more) == (3, both[-1], False)
        again = await delivery.pull(conn, A, CHANNEL, lease=lease_a)
        assert (again.count, again.position) == (0, both[-1])
        assert [m for m, _ in await queued(conn, A)] == both
        lease_b = await leases.acquire(conn, B, "w-b", 60)
        await delivery.pull(conn, B, CHANNEL, lease=lease_b)
        assert [m for m, _ in await queued(conn, B)] == sorted(both + only_b)
        # the head reads the payload and its binding through message_id
        head, _ = await delivery.next_head(conn, A, lease=lease_a)
        assert head is not None
        assert head.payload.startswith(b"MSH|") and head.binding == (both[0], "channel:adt")
        assert head.item.control_id == "C0"
    assert other


async def test_a_puller_whose_lease_was_taken_over_pulls_nothing(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [A], 2)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        old = await leases.acquire(conn, A, "w-old", 60)
        await conn.execute("UPDATE inturn_lease SET expires_at = now() - interval '1 s'")
        new = await leases.acquire(conn, A, "w-new", 60)
        assert new.epoch > old.epoch
        with pytest.raises(LeaseLost):
            await delivery.pull(conn, A, CHANNEL, lease=old)
        assert await queued(conn, A) == []
        cur = await conn.execute("SELECT count(*) FROM inturn_cursor")
        assert (await cur.fetchone()) == (0,)
        assert (await delivery.pull(conn, A, CHANNEL, lease=new)).count == 2


async def test_a_row_committed_after_the_pulls_snapshot_is_pulled_next_time(
    fresh_db: str,
) -> None:
    """The channel's enqueue lock orders the log's commits: a message whose transaction is open
    while the destination pulls is neither skipped nor pulled twice."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        first = append(sync, [A], 1)
        with psycopg.connect(fresh_db) as ingest:  # a transaction open across the pull
            late = append(ingest, [A], 1)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                lease = await leases.acquire(conn, A, "w-a", 60)
                pulled = await delivery.pull(conn, A, CHANNEL, lease=lease)
                assert (pulled.count, pulled.position) == (1, first[0])
                ingest.commit()
                pulled = await delivery.pull(conn, A, CHANNEL, lease=lease)
                assert (pulled.count, pulled.position) == (1, late[0])
                assert [m for m, _ in await queued(conn, A)] == first + late


def test_the_pull_plans_on_the_logs_channel_index(fresh_db: str) -> None:
    # one epoch, one partition of the log: the plan names its index (other tests of the same
    # database may have left more epochs, whose partitions the planner may read instead)
    reset_epochs(fresh_db)
    query = load("queue.sql")["pull"]
    params = {
        "destination": A, "holder": "w", "epoch": 1, "renew": True, "channel": CHANNEL,
        "limit": 500,
    }  # fmt: skip
    with psycopg.connect(fresh_db, autocommit=True) as conn, conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        [(plan,)] = conn.execute(f"EXPLAIN (FORMAT JSON) {query}", params).fetchall()
    text = json.dumps(plan)
    assert "inturn_message_e1_channel_id_idx" in text


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_a_worker_delivers_what_the_log_routes_to_it_and_nothing_else(
    fresh_db: str, lanes: int
) -> None:
    """A real worker, woken by nothing (its idle poll and its empty queue), pulls the log rows
    routed to it and sends them in log order; a message routed elsewhere never holds it up."""
    import asyncio

    from inturn.worker.testing import MllpReceiver
    from tests.support import pipeline
    from tests.support.pipeline import worker as run_worker

    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [A], 2)
        append(sync, [B], 3)  # not A's: it never waits behind them
        append(sync, [A, B], 2)
        expected = [
            bytes(r[0])
            for r in sync.execute(
                "SELECT m.payload FROM inturn_message m JOIN inturn_route r ON r.id = m.route"
                " WHERE %s = ANY(r.destinations) ORDER BY m.id",
                (A,),
            ).fetchall()
        ]
    async with MllpReceiver() as rx:
        config = pipeline.worker_config(A, rx.port, channel=CHANNEL, lanes=lanes)
        async with run_worker(config, fresh_db):
            await rx.wait_for(4)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                async with asyncio.timeout(10):
                    while True:
                        cur = await conn.execute(
                            "SELECT count(*) FROM inturn_delivery WHERE destination = %s"
                            " AND state = 'delivered'",
                            (A,),
                        )
                        if (await cur.fetchone()) == (4,):
                            break
                        await asyncio.sleep(0.05)
    assert sorted(rx.received) == sorted(expected)
    if lanes == 1:
        assert rx.received == expected


async def test_a_pooled_workers_poll_sees_a_routed_log_row_as_a_due_head(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w-a", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)  # its cursor, at 0
        assert await delivery.poll_head(conn, A) == (None, False)
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            append(sync, [B], 1)
            assert await delivery.poll_head(conn, A) == (None, False)  # not routed to A
            [mine] = append(sync, [A], 1)
        assert await delivery.poll_head(conn, A) == (mine, True)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        head_id, due = await delivery.poll_head(conn, A)
        assert due and head_id is not None and head_id != mine  # its slim row's own id


async def test_one_notify_per_channel_wakes_its_worker_at_once(fresh_db: str) -> None:
    """The worker LISTENs to its channel's wake-up name beside its own: a message appended to
    the log with one channel NOTIFY is sent long before its idle poll would have found it."""
    import asyncio

    from inturn.worker.store import notify
    from inturn.worker.testing import MllpReceiver
    from tests.support import pipeline
    from tests.support.pipeline import worker as run_worker

    async with MllpReceiver() as rx:
        config = pipeline.worker_config(A, rx.port, channel=CHANNEL, idle_seconds=3600)
        async with run_worker(config, fresh_db):
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                async with asyncio.timeout(10):  # the worker has pulled once: its cursor
                    while (
                        await (await conn.execute("SELECT count(*) FROM inturn_cursor")).fetchone()
                    ) != (1,):
                        await asyncio.sleep(0.05)
                with psycopg.connect(fresh_db, autocommit=True) as sync:
                    append(sync, [A], 1)
                await notify.wake_channels(conn, [CHANNEL])
            await rx.wait_for(1)  # bounded by the receiver's own wait, far below 3600 s
    assert len(rx.received) == 1
