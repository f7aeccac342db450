"""The sweeper's delivery rules against a real Postgres, in database time.

Thresholds are checked one second before, at and after, inside one transaction: there
``now()`` stands still, so "at" means exactly at.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker import worklist
from inturn.worker.operations.packs import select
from inturn.worker.store import locks, registry
from inturn.worker.worklist.delivery_rules import (
    delivery_expired,
    destination_stuck,
    orphaned_queue,
)
from inturn.worker.worklist.rules import Rule, RuleOutcome
from inturn.worker.worklist.sweep import sweep
from tests.support.db import register

pytestmark = pytest.mark.store

DEST = "ward/lab"


async def insert(
    conn: AsyncConnection[Any], ages: list[float], destination: str = DEST
) -> list[int]:
    """Pending messages enqueued ``age`` seconds before now() (this transaction's)."""
    cur = await conn.execute(
        "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
        " size, enqueued_at)"
        " SELECT %s, 'adt', 'M' || n, 'ADT^A01', '\\x4d5348'::bytea, 3,"
        "        now() - make_interval(secs => a)"
        "   FROM unnest(%s::float8[]) WITH ORDINALITY AS t(a, n) ORDER BY n RETURNING id",
        (destination, ages),
    )
    return [r[0] for r in await cur.fetchall()]


def counts(o: RuleOutcome) -> tuple[int, int, int]:
    return o.placed, o.already, o.cleared


async def pending_items(conn: AsyncConnection[Any], queue: str) -> list[worklist.WorklistItem]:
    return (await worklist.list_items(conn, queue=queue)).items


@pytest.mark.parametrize(
    ("age", "due"), [(899.0, False), (900.0, True), (901.0, True)], ids=["before", "at", "after"]
)
async def test_destination_stuck_threshold(
    conn: AsyncConnection[Any], age: float, due: bool
) -> None:
    await register(conn, DEST)
    async with conn.transaction():
        await insert(conn, [age, 10.0])
        outcome = await destination_stuck(conn, limit=10, dry_run=False)
        items = await pending_items(conn, "delivery-stuck")
    assert counts(outcome) == ((1, 0, 0) if due else (0, 0, 0))
    assert [(i.record_key, i.reason, i.placed_by) for i in items] == (
        [(DEST, "destination-stuck", "sweeper")] if due else []
    )


async def test_stuck_is_cleared_by_system_when_the_head_moves(conn: AsyncConnection[Any]) -> None:
    await register(conn, DEST, stuck_after_seconds=60)
    [head, _] = await insert(conn, [120.0, 5.0])
    assert counts(await destination_stuck(conn, limit=10, dry_run=False)) == (1, 0, 0)
    assert counts(await destination_stuck(conn, limit=10, dry_run=False)) == (0, 1, 0)
    await conn.execute(
        "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() WHERE id = %s",
        (head,),
    )
    assert counts(await destination_stuck(conn, limit=10, dry_run=False)) == (0, 0, 1)
    [item] = (await worklist.list_items(conn, state="cleared")).items
    assert item.cleared_by == "system" and item.note is not None and "no longer stuck" in item.note
    cur = await conn.execute("SELECT who, action, item_ids FROM inturn_audit")
    assert await cur.fetchall() == [("system", "worklist-clear", [item.id])]


async def test_orphaned_queue_placed_and_cleared(conn: AsyncConnection[Any]) -> None:
    await insert(conn, [30.0], destination="gone/lab")
    await register(conn, DEST)
    await insert(conn, [30.0])
    assert counts(await orphaned_queue(conn, limit=10, dry_run=False)) == (1, 0, 0)
    [item] = await pending_items(conn, "delivery-stuck")
    assert (item.record_key, item.reason) == ("gone/lab", "orphaned-queue")
    # A deleted Destination's queue is orphaned too.
    await registry.mark_deleted(conn, DEST)
    assert counts(await orphaned_queue(conn, limit=10, dry_run=False)) == (1, 1, 0)
    # Applied again: no longer orphaned.
    await register(conn, "gone/lab")
    assert counts(await orphaned_queue(conn, limit=10, dry_run=False)) == (0, 1, 1)
    assert [i.record_key for i in await pending_items(conn, "delivery-stuck")] == [DEST]


@pytest.mark.parametrize(
    ("age", "due"), [(59.0, False), (60.0, True), (61.0, True)], ids=["before", "at", "after"]
)
async def test_delivery_expired_threshold(
    conn: AsyncConnection[Any], age: float, due: bool
) -> None:
    await register(conn, DEST, expire_after_seconds=60)
    async with conn.transaction():
        [first, second] = await insert(conn, [age, 1.0])
        outcome = await delivery_expired(conn, limit=10, dry_run=False)
    assert counts(outcome) == ((1, 0, 0) if due else (0, 0, 0))
    cur = await conn.execute("SELECT id, state, decided_by FROM inturn_delivery ORDER BY id")
    assert await cur.fetchall() == [
        (first, "skipped", "sweeper") if due else (first, "pending", None),
        (second, "pending", None),
    ]
    items = await pending_items(conn, "delivery-expired")
    assert [(i.record_key, i.reason) for i in items] == ([(str(first), "expired")] if due else [])
    cur = await conn.execute("SELECT who, action, destination, item_ids FROM inturn_audit")
    assert await cur.fetchall() == ([("sweeper", "skip", DEST, [first])] if due else [])


async def test_nothing_expires_unless_the_destination_asks(conn: AsyncConnection[Any]) -> None:
    await register(conn, DEST)
    await insert(conn, [10 * 86400.0])
    assert counts(await delivery_expired(conn, limit=10, dry_run=False)) == (0, 0, 0)
    cur = await conn.execute("SELECT state FROM inturn_delivery")
    assert await cur.fetchall() == [("pending",)]


async def test_limit_takes_the_most_overdue_first(conn: AsyncConnection[Any]) -> None:
    rng = random.Random(7)
    thresholds = {"a/one": 60, "b/two": 600, "c/three": 3600, "d/four": 120}
    overdue: dict[int, float] = {}
    for destination, expire in thresholds.items():
        await register(conn, destination, expire_after_seconds=expire)
        # 500 due per destination, in enqueue order (oldest first), plus 5 not yet due.
        lateness = sorted((rng.uniform(1, 86400) for _ in range(500)), reverse=True)
        ids = await insert(conn, [expire + x for x in lateness] + [1.0] * 5, destination)
        overdue.update(zip(ids, lateness, strict=False))
    outcome = await delivery_expired(conn, limit=500, dry_run=False)
    assert counts(outcome) == (500, 0, 0)
    cur = await conn.execute("SELECT id FROM inturn_delivery WHERE state = 'skipped'")
    skipped = {r[0] for r in await cur.fetchall()}
    most_overdue = set(sorted(overdue, key=lambda i: overdue[i], reverse=True)[:500])
    assert skipped == most_overdue
    # The next runs take the rest, and nothing that is not due.
    total = 500
    while (o := await delivery_expired(conn, limit=500, dry_run=False)).placed:
        total += o.placed
    assert total == 2000
    cur = await conn.execute("SELECT count(*) FROM inturn_delivery WHERE state = 'pending'")
    assert await cur.fetchone() == (20,)


async def test_a_sweep_killed_half_way_is_consistent_and_the_next_finishes(
    fresh_db: str, conn: AsyncConnection[Any]
) -> None:
    await register(conn, DEST, expire_after_seconds=60)
    ids = await insert(conn, [3600.0 - n for n in range(250)])
    # Hold a row of the second batch so that the sweep stops there, then kill its session.
    holder = await AsyncConnection.connect(fresh_db)
    await holder.execute("SELECT 1 FROM inturn_delivery WHERE id = %s FOR UPDATE", (ids[150],))
    sweeper = await AsyncConnection.connect(fresh_db, autocommit=True)
    pid = sweeper.info.backend_pid
    task = asyncio.create_task(sweep(sweeper, select(("delivery",)), limit=500))
    async with asyncio.timeout(20):
        while True:
            cur = await conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cur.fetchone()
            if row is not None and row[0] == "Lock":
                break
            await asyncio.sleep(0.02)
    await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        await task
    await sweeper.close()
    await holder.rollback()
    await holder.close()

    async def consistent() -> int:
        cur = await conn.execute(
            "SELECT count(*),"
            " count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM inturn_worklist_item w"
            "   WHERE w.record_key = d.id::text AND w.queue = 'delivery-expired'))"
            " FROM inturn_delivery d WHERE state = 'skipped'"
        )
        row = await cur.fetchone()
        assert row is not None and row[1] == 0  # no skip without its work item
        cur = await conn.execute(
            "SELECT count(*) FROM inturn_worklist_item WHERE queue = 'delivery-expired'"
        )
        items = await cur.fetchone()
        assert items == (row[0],)  # and no work item without its skip
        return int(row[0])

    assert await consistent() == 100  # the first batch, whole
    report = await sweep(conn, select(("delivery",)), limit=500)
    assert report.ok
    assert await consistent() == 250


async def test_a_second_sweep_does_nothing_while_one_runs(
    fresh_db: str, conn: AsyncConnection[Any]
) -> None:
    await register(conn, DEST, stuck_after_seconds=1)
    await insert(conn, [10.0])
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as other:
        running = await locks.take_singleton(other, "sweep", "another-sweep")
        assert running is not None
        report = await sweep(conn, select(), limit=10)
        assert not report.locked and report.results == []
        await locks.release_singleton(other, running)
    report = await sweep(conn, select(), limit=10)
    assert report.locked and report.ok
    assert [r.summary(False) for r in report.results][:3] == [
        "destination-stuck: placed 1, already there 0, cleared 0",
        "orphaned-queue: placed 0, already there 0, cleared 0",
        "delivery-expired: placed 0, already there 0, cleared 0",
    ]


async def test_dry_run_changes_nothing(conn: AsyncConnection[Any]) -> None:
    await register(conn, DEST, stuck_after_seconds=1, expire_after_seconds=60)
    await insert(conn, [120.0, 90.0, 30.0])
    await insert(conn, [10.0], destination="gone/lab")
    report = await sweep(conn, select(("delivery",)), limit=10, dry_run=True)
    assert [r.summary(True) for r in report.results] == [
        "destination-stuck: would place 1, already there 0, would clear 0",
        "orphaned-queue: would place 1, already there 0, would clear 0",
        "delivery-expired: would place 2, already there 0, would clear 0",
        "resent-delivered: would place 0, already there 0, would clear 0",
    ]
    cur = await conn.execute(
        "SELECT (SELECT count(*) FROM inturn_worklist_item),"
        " (SELECT count(*) FROM inturn_delivery WHERE state = 'pending')"
    )
    assert await cur.fetchone() == (0, 4)


async def test_a_failing_rule_is_reported_and_the_others_run(conn: AsyncConnection[Any]) -> None:
    async def broken(c: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
        raise RuntimeError("rule bug\nsecond line")

    await register(conn, DEST, stuck_after_seconds=1)
    await insert(conn, [10.0])
    rules = [Rule("broken", "test", broken), *select(("delivery",))]
    report = await sweep(conn, rules, limit=10)
    assert not report.ok
    assert report.results[0].summary(False) == "broken: failed: rule bug"
    assert report.results[1].outcome.placed == 1


def test_unknown_group_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown rule pack nope"):
        select(("nope",))
