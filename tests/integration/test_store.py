"""The delivery queue store against a real Postgres: every operation."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.errors import Conflict
from inturn.worker.store import actions, delivery, locks, notify, queue, reads
from inturn.worker.store import lease as leases
from inturn.worker.store.connect import Pools
from inturn.worker.store.lease import Lease
from inturn.worker.store.model import NewItem

pytestmark = pytest.mark.store

DEST = "hospital/lab"


async def held(conn: AsyncConnection[Any], destination: str = DEST) -> Lease:
    """The test's lease of ``destination`` (the same holder takes its own again at once)."""
    got = await leases.acquire(conn, destination, "test", 600)
    assert got is not None
    return got


def item(n: int, destination: str = DEST, payload: bytes | None = None) -> NewItem:
    return NewItem(
        destination=destination,
        channel="adt",
        control_id=f"CTRL{n}",
        message_type="ADT^A01",
        payload=payload
        if payload is not None
        else f"MSH|^~\\&|A|B|C|D|||ADT^A01|CTRL{n}|P|2.5\r".encode(),
    )


async def test_enqueue_returns_ids_in_order_and_keeps_bytes(conn: AsyncConnection[Any]) -> None:
    raw = "MSH|^~\\&|É|x\nPID|1\r\n".encode()
    ids = await queue.enqueue(conn, [item(1, payload=raw), item(2)])
    assert ids == sorted(ids) and len(ids) == 2
    assert await reads.payload(conn, ids[0]) == raw
    got = await reads.get_item(conn, ids[0])
    assert got is not None
    assert (got.state, got.attempts, got.size, got.control_id) == ("pending", 0, len(raw), "CTRL1")


async def test_head_that_backs_off_blocks_later_items(conn: AsyncConnection[Any]) -> None:
    """The ordering pitfall: a later message must never overtake a failed head."""
    [first] = await queue.enqueue(conn, [item(1)])
    head, wait = await delivery.next_head(conn, DEST, lease=await held(conn))
    assert head is not None and head.item.id == first
    await delivery.retry(conn, first, 1, 30.0, "connection: refused", lease=await held(conn))
    [second] = await queue.enqueue(conn, [item(2)])
    head, wait = await delivery.next_head(conn, DEST, lease=await held(conn))
    assert head is None
    assert wait is not None and 25 < wait <= 30
    assert await queue.blocked(conn, DEST) is True
    # Once due, the first one (not the second) is the head.
    await actions.retry_now(conn, who="ops", item_id=first)
    head, wait = await delivery.next_head(conn, DEST, lease=await held(conn))
    assert head is not None and head.item.id == first and head.item.attempts == 0
    assert second > first


async def test_empty_queue_has_no_head_and_no_wait(conn: AsyncConnection[Any]) -> None:
    assert await delivery.next_head(conn, DEST, lease=await held(conn)) == (None, None)
    assert await queue.blocked(conn, DEST) is False


async def test_retry_keeps_first_reason(conn: AsyncConnection[Any]) -> None:
    [i] = await queue.enqueue(conn, [item(1)])
    await delivery.retry(conn, i, 1, 0, "connection: refused", lease=await held(conn))
    await delivery.retry(conn, i, 2, 0, "AE: database locked", lease=await held(conn))
    got = await reads.get_item(conn, i)
    assert got is not None
    assert (got.attempts, got.reason, got.last_error) == (
        2,
        "connection: refused",
        "AE: database locked",
    )


async def test_succeeded_and_gave_up_let_the_next_head_go(conn: AsyncConnection[Any]) -> None:
    a, b, c = await queue.enqueue(conn, [item(1), item(2), item(3)])
    waited = await delivery.succeeded(conn, a, 1, lease=await held(conn))
    assert waited is not None and waited >= 0
    assert await delivery.gave_up(conn, b, 5, "AR: unknown patient", lease=await held(conn))
    head, _ = await delivery.next_head(conn, DEST, lease=await held(conn))
    assert head is not None and head.item.id == c
    failed = await reads.get_item(conn, b)
    assert failed is not None
    assert (failed.state, failed.attempts, failed.reason) == ("failed", 5, "AR: unknown patient")
    assert failed.finished_at is not None
    # A mark on an item that failed meanwhile changes nothing.
    assert await delivery.succeeded(conn, b, 6, lease=await held(conn)) is None


async def test_retry_now_for_a_destination_resets_every_pending_item(
    conn: AsyncConnection[Any],
) -> None:
    ids = await queue.enqueue(conn, [item(1), item(2)])
    for i in ids:
        await delivery.retry(conn, i, 7, 3600, "timeout", lease=await held(conn))
    changed = await actions.retry_now(conn, who="nurse.it", destination=DEST, why="receiver fixed")
    assert changed == ids
    items, _ = await reads.list_items(conn, destination=DEST)
    assert {(x.attempts, x.state) for x in items} == {(0, "pending")}
    with pytest.raises(ValueError):
        await actions.retry_now(conn, who="x")


async def test_skip_and_drain_are_audited_with_who(conn: AsyncConnection[Any]) -> None:
    a, b, c = await queue.enqueue(conn, [item(1), item(2), item(3)])
    assert await actions.skip(conn, a, who="alice", why="duplicate") is True
    assert await actions.skip(conn, a, who="alice") is False  # no longer pending
    assert await actions.drain(conn, DEST, who="bob", why="stale backlog") == [b, c]
    skipped = await reads.get_item(conn, a)
    assert skipped is not None and (skipped.state, skipped.decided_by) == ("skipped", "alice")
    cur = await conn.execute(
        "SELECT who, action, destination, item_ids, why FROM inturn_audit ORDER BY id"
    )
    assert await cur.fetchall() == [
        ("alice", "skip", DEST, [a], "duplicate"),
        ("bob", "drain", DEST, [b, c], "stale backlog"),
    ]


async def test_remove_touches_finished_items_only(conn: AsyncConnection[Any]) -> None:
    a, b = await queue.enqueue(conn, [item(1), item(2)])
    await delivery.succeeded(conn, a, 1, lease=await held(conn))
    assert await actions.remove(conn, [a, b], who="ops") == [a]
    assert await reads.get_item(conn, b) is not None


async def test_purge_never_touches_pending_and_batches(conn: AsyncConnection[Any]) -> None:
    ids = await queue.enqueue(conn, [item(n) for n in range(12)])
    for i in ids[:10]:
        await delivery.succeeded(conn, i, 1, lease=await held(conn))
    await delivery.gave_up(conn, ids[10], 3, "AR", lease=await held(conn))
    future = datetime.now(UTC) + timedelta(seconds=5)
    counts = await actions.purge(conn, {"delivered": future, "failed": future}, batch=3)
    assert counts == {"delivered": 10, "failed": 1}
    remaining, total = await reads.list_items(conn, destination=DEST)
    assert total == 1 and remaining[0].id == ids[11] and remaining[0].state == "pending"
    with pytest.raises(ValueError):
        await actions.purge(conn, {"pending": future})
    with pytest.raises(ValueError):
        await actions.purge(conn, {"delivered": future}, batch=5001)


async def test_purge_keeps_recent_finished_items(conn: AsyncConnection[Any]) -> None:
    [a] = await queue.enqueue(conn, [item(1)])
    await delivery.succeeded(conn, a, 1, lease=await held(conn))
    past = datetime.now(UTC) - timedelta(days=7)
    assert await actions.purge(conn, {"delivered": past}) == {"delivered": 0}


async def test_purge_is_a_singleton(conn: AsyncConnection[Any], fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as other:
        running = await locks.take_singleton(other, "purge", "another-purge")
        assert running is not None
        assert await actions.purge(conn, {"delivered": datetime.now(UTC)}) is None
        await locks.release_singleton(other, running)
    assert await actions.purge(conn, {"delivered": datetime.now(UTC)}) == {"delivered": 0}
    # the purge released it: another takes it at once
    assert await locks.take_singleton(conn, "purge", "next") is not None


async def test_list_is_newest_first_capped_and_has_no_payload(conn: AsyncConnection[Any]) -> None:
    ids = await queue.enqueue(conn, [item(n) for n in range(5)])
    items, total = await reads.list_items(conn, destination=DEST, limit=2)
    assert total == 5 and [x.id for x in items] == ids[::-1][:2]
    assert "payload" not in items[0].to_json() and not hasattr(items[0], "payload")
    items, total = await reads.list_items(conn, limit=5000)
    assert total == 5 and len(items) == 5
    assert reads.LIST_LIMIT_MAX == 1000
    with pytest.raises(ValueError):
        await reads.list_items(conn, state="stuck")


async def test_depth_reports_pending_failed_oldest_and_attempts(conn: AsyncConnection[Any]) -> None:
    a, b, _ = await queue.enqueue(conn, [item(1), item(2), item(3)])
    await queue.enqueue(conn, [item(9, destination="hospital/pharmacy")])
    await delivery.gave_up(conn, a, 2, "AR", lease=await held(conn))
    await delivery.retry(conn, b, 4, 60, "timeout", lease=await held(conn))
    rows = {r.destination: r for r in await reads.depth(conn)}
    lab = rows[DEST]
    assert (lab.pending, lab.failed, lab.max_attempts, lab.channel) == (2, 1, 4, "adt")
    assert lab.oldest is not None and lab.oldest_seconds >= 0
    assert rows["hospital/pharmacy"].pending == 1
    assert [r.destination for r in await reads.depth(conn, DEST)] == [DEST]
    assert await reads.pending_destinations(conn) == ["hospital/lab", "hospital/pharmacy"]


async def test_erase_removes_any_state_and_is_audited(conn: AsyncConnection[Any]) -> None:
    a, b = await queue.enqueue(conn, [item(1), item(2)])
    await delivery.succeeded(conn, a, 1, lease=await held(conn))
    assert sorted(await actions.erase(conn, [a, b], who="dpo", why="GDPR art. 17")) == [a, b]
    cur = await conn.execute("SELECT action, item_ids, who FROM inturn_audit")
    assert await cur.fetchall() == [("erase", [a, b], "dpo")]


async def test_resend_puts_a_copy_at_the_tail(conn: AsyncConnection[Any]) -> None:
    a, b = await queue.enqueue(conn, [item(1), item(2)])
    await delivery.gave_up(conn, a, 3, "AR", lease=await held(conn))
    new = await actions.resend(conn, a, who="ops")
    assert new is not None and new > b
    copy = await reads.get_item(conn, new)
    original = await reads.get_item(conn, a)
    assert copy is not None and original is not None
    assert (copy.state, copy.control_id, original.state) == ("pending", "CTRL1", "failed")
    assert await reads.payload(conn, new) == await reads.payload(conn, a)
    with pytest.raises(Conflict, match="still pending"):
        await actions.resend(conn, b, who="ops")
    assert await actions.resend(conn, 999_999, who="ops") is None


async def test_scan_payloads_reads_every_held_item(conn: AsyncConnection[Any]) -> None:
    ids = await queue.enqueue(conn, [item(n) for n in range(7)])
    seen = [s.id async for s in reads.scan_payloads(conn, batch=3)]
    assert seen == ids


async def test_fan_out_is_one_transaction_with_one_notify_per_destination(
    conn: AsyncConnection[Any], fresh_db: str
) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as listener:
        await listener.execute(f"LISTEN {notify.notify_channel('a/x')}")
        await listener.execute(f"LISTEN {notify.notify_channel('b/y')}")
        await queue.enqueue(conn, [item(1, "b/y"), item(1, "a/x"), item(2, "a/x")])
        got = [n.payload async for n in listener.notifies(timeout=2, stop_after=2)]
    assert sorted(got) == ["a/x", "b/y"]


async def test_concurrent_enqueues_commit_in_id_order(fresh_db: str) -> None:
    """Ids are allocated at INSERT: the enqueue lock makes id order equal commit order."""
    async with (
        await AsyncConnection.connect(fresh_db, autocommit=True) as t1,
        await AsyncConnection.connect(fresh_db, autocommit=True) as t2,
        await AsyncConnection.connect(fresh_db, autocommit=True) as watcher,
    ):
        tx = t1.transaction()
        await tx.__aenter__()
        [first] = await queue.enqueue_in_transaction(t1, [item(1)])
        second_task = asyncio.create_task(queue.enqueue(t2, [item(2)]))
        pid = t2.info.backend_pid
        for _ in range(200):  # until t2 is seen waiting on the advisory lock
            cur = await watcher.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cur.fetchone()
            if row and row[0] == "Lock":
                break
            await asyncio.sleep(0.02)
        assert row is not None and row[0] == "Lock"
        assert not second_task.done()
        await tx.__aexit__(None, None, None)
        [second] = await second_task
        assert second > first


async def test_store_pools_read_only_and_write(fresh_db: str) -> None:
    async with await Pools.open(fresh_db) as pools:
        async with pools.write.connection() as conn:
            [i] = await queue.enqueue(conn, [item(1)])
        async with pools.read.connection() as conn:
            items, total = await reads.list_items(conn, destination=DEST)
            assert total == 1 and items[0].id == i
            assert [r.pending for r in await reads.depth(conn)] == [1]
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                await conn.execute("DELETE FROM inturn_delivery")


async def test_every_connection_we_open_commits_synchronously(fresh_db: str) -> None:
    """Delivered marks rely on it: an asynchronous one lost in a crash would reorder."""
    from inturn.worker.store.connect import connect_worker

    async with await connect_worker(fresh_db) as conn:
        name = conn.info.dbname
        await conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    try:
        async with await connect_worker(fresh_db) as conn:
            cur = await conn.execute("SHOW synchronous_commit")
            assert await cur.fetchone() == ("on",)
        async with await Pools.open(fresh_db) as pools:
            for pool in (pools.write, pools.read):
                async with pool.connection() as c:
                    cur = await c.execute("SHOW synchronous_commit")
                    assert await cur.fetchone() == ("on",)
    finally:
        async with await connect_worker(fresh_db) as conn:
            await conn.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')


async def test_succeeded_next_marks_and_reads_the_next_head_at_once(
    conn: AsyncConnection[Any],
) -> None:
    a, b, c = await queue.enqueue(conn, [item(1), item(2), item(3)])
    head, _ = await delivery.next_head(conn, DEST, lease=await held(conn))
    assert head is not None and head.item.id == a
    waited, (following, wait) = await delivery.succeeded_next(
        conn, head.item, 1, lease=await held(conn)
    )
    assert waited is not None and following is not None and following.item.id == b
    assert wait is None and following.payload == await reads.payload(conn, b)
    await delivery.retry(conn, c, 1, 60, "timeout", lease=await held(conn))
    waited, (following, wait) = await delivery.succeeded_next(
        conn, following.item, 1, lease=await held(conn)
    )
    assert following is None and wait is not None and wait > 50  # c is backing off
    # A skip that raced with the send loses: the receiver has the message.
    assert await actions.skip(conn, c, who="ops")
    raced = await reads.get_item(conn, c)
    assert raced is not None
    waited, (following, wait) = await delivery.succeeded_next(
        conn, raced, 2, lease=await held(conn)
    )
    assert waited is not None and (following, wait) == (None, None)
    delivered = await reads.get_item(conn, c)
    assert delivered is not None and (delivered.state, delivered.decided_by) == ("delivered", "ops")
    # An erased head is simply gone.
    assert await actions.erase(conn, [c], who="dpo")
    waited, (following, wait) = await delivery.succeeded_next(
        conn, raced, 3, lease=await held(conn)
    )
    assert (waited, following, wait) == (None, None, None)


async def test_next_head_keyset_bound(conn: AsyncConnection[Any]) -> None:
    a, b = await queue.enqueue(conn, [item(1), item(2)])
    head, _ = await delivery.next_head(conn, DEST, after=a, lease=await held(conn))
    assert head is not None and head.item.id == b
    head, _ = await delivery.next_head(conn, DEST, after=0, lease=await held(conn))
    assert head is not None and head.item.id == a
