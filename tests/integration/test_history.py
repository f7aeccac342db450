"""History that leaves by the partition (issue 37, migration 0034): finished rows move from the
hot table to ``inturn_history`` after the hot window, with their attempts; the epoch turns and
its partitions are made ahead; a day past the retention is dropped whole after what a person
still needs is out of it (pending rows keep their payload and its binding, a destination behind
in it is pulled first, a finished row a pending worklist item names goes back to the hot table).
The maintenance runs as the purge role, through its functions."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.hl7.pid import index_keys
from inturn.worker.ingest import history_metrics
from inturn.worker.store import delivery, history, worklist
from inturn.worker.store import lease as leases
from tests.support.channel_log import append
from tests.support.pipeline import INTURN

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

A = "ward/a"
B = "ward/b"
CHANNEL = "adt"
WIDTH = 1 << 40
PID_42 = b"MSH|^~\\&|A|B|C|D|2026||ADT^A01|X|P|2.5\rPID|1||MRN-42^^^HOSP^MR||DOE\r"
PID_7 = b"MSH|^~\\&|A|B|C|D|2026||ADT^A01|Y|P|2.5\rPID|1||MRN-7^^^HOSP^MR||ROE\r"


async def pulled(conn: AsyncConnection[Any], destination: str) -> None:
    """The destination's worker pulls everything routed to it."""
    held = await leases.acquire(conn, destination, f"w-{destination}", 60)
    while (await delivery.pull(conn, destination, CHANNEL, lease=held)).more:
        pass


def never_stop() -> Callable[[], Awaitable[bool]]:
    async def renew() -> bool:
        return True

    return renew


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def finish(dsn: str, state: str, ids: list[int], ago: str = "1 hour") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = %s, attempts = 2,"
            f" finished_at = now() - interval '{ago}' WHERE id = ANY(%s)",
            (state, ids),
        )


def queued(dsn: str, destination: str) -> list[int]:
    return [
        r[0]
        for r in rows(
            dsn, "SELECT id FROM inturn_delivery WHERE destination = %s ORDER BY id", destination
        )
    ]


async def test_finished_rows_move_to_history_after_the_hot_window_with_their_attempts(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [A], 6)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await pulled(conn, A)
    ids = queued(fresh_db, A)
    delivered, failed, kept, recent, skipped, pending = ids
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        for attempt in (1, 2):
            sync.execute(
                "INSERT INTO inturn_attempt (item_id, attempt, outcome, error)"
                " VALUES (%s, %s, 'retry', 'refused')",
                (failed, attempt),
            )
        # a row stored before the channel log: its payload in the row, no message
        [(legacy,)] = sync.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, finished_at) VALUES (%s, %s, 'OLD1', 'ADT^A01',"
            " 'MSH|legacy', 10, 'delivered', now() - interval '2 hours') RETURNING id",
            (A, CHANNEL),
        ).fetchall()
    finish(fresh_db, "delivered", [delivered, kept])
    finish(fresh_db, "failed", [failed])
    finish(fresh_db, "skipped", [skipped])
    finish(fresh_db, "delivered", [recent], ago="1 minute")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await worklist.place(
            conn,
            queue="delivery-failed",
            record_kind="delivery",
            record_key=str(kept),
            reason="gave-up",
            placed_by="worker",
        )
    settings = history.Settings(retention_seconds=86400 * 7, hot_seconds=600, batch=2)
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        assert await history.movable(conn, 600) == 4
        assert await history.move(conn, settings, never_stop()) == 4
    assert queued(fresh_db, A) == [kept, recent, pending]
    moved = rows(
        fresh_db,
        "SELECT id, message_id, state, payload, attempt_log FROM inturn_history ORDER BY id",
    )
    assert [(r[0], r[2]) for r in moved] == [
        (delivered, "delivered"),
        (failed, "failed"),
        (skipped, "skipped"),
        (legacy, "delivered"),
    ]
    by_id = {r[0]: r for r in moved}
    # a slim row keeps its message; the legacy row keeps its payload, placed in the open epoch
    [(delivered_message,)] = rows(
        fresh_db, "SELECT message_id FROM inturn_history WHERE id = %s", delivered
    )
    assert by_id[delivered][3] is None and delivered_message is not None
    assert bytes(by_id[legacy][3]) == b"MSH|legacy" and 1 <= by_id[legacy][1] < WIDTH
    assert [(a["attempt"], a["outcome"], a["error"]) for a in by_id[failed][4]] == [
        (1, "retry", "refused"),
        (2, "retry", "refused"),
    ]
    assert rows(fresh_db, "SELECT count(*) FROM inturn_attempt") == [(0,)]
    # nothing in history was left behind in the hot table's indexes: no dead-tuple backlog
    # comes from retention beyond the rows moved (the hot table is the same size after)


async def test_the_epoch_turns_with_its_partitions_made_ahead(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    settings = history.Settings(retention_seconds=86400 * 7, epoch_seconds=3600)
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        done = history.Upkeep()
        await history.turn(conn, settings, done)
        assert (done.prepared, done.turned) == ([2], None)
        await history.turn(conn, settings, done)  # prepared already, not due
        assert (done.prepared, done.turned) == ([2], None)
    parts = rows(
        fresh_db,
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent IN ('inturn_message'::regclass, 'inturn_history'::regclass)"
        " ORDER BY 1",
    )
    assert parts == [
        ("inturn_history_e1", "FOR VALUES FROM ('1') TO ('1099511627776')"),
        ("inturn_history_e2", "FOR VALUES FROM ('1099511627776') TO ('2199023255552')"),
        ("inturn_message_e1", "FOR VALUES FROM ('1') TO ('1099511627776')"),
        ("inturn_message_e2", "FOR VALUES FROM ('1099511627776') TO ('2199023255552')"),
    ]
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        before = append(sync, [A], 1)
        sync.execute("UPDATE inturn_epoch SET opened_at = now() - interval '2 hours' WHERE n = 1")
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        done = history.Upkeep()
        await history.turn(conn, settings, done)
        assert (done.prepared, done.turned) == ([3], 2)
        held = await history.epochs(conn)
    assert [(e.n, e.opened_at is not None, e.closed_at is not None) for e in held] == [
        (1, True, True),
        (2, True, False),
        (3, False, False),
    ]
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        after = append(sync, [A], 1)
        # each partition has the log's indexes
        indexes = sync.execute(
            "SELECT tablename, count(*) FROM pg_indexes"
            " WHERE tablename IN ('inturn_message_e1', 'inturn_message_e3',"
            "                     'inturn_history_e1', 'inturn_history_e3')"
            " GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert before[0] < WIDTH and after[0] == WIDTH
    assert indexes == [
        ("inturn_history_e1", 4),
        ("inturn_history_e3", 4),
        ("inturn_message_e1", 4),
        ("inturn_message_e3", 4),
    ]


async def dropped_day(fresh_db: str, role_dsns: dict[str, str]) -> dict[str, Any]:
    """A day of the log with everything a drop must take care of, turned and closed long ago;
    the ids of each case."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        both = append(sync, [A, B], 4, tag="E1-")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await pulled(conn, A)  # B's worker never ran: its cursor is behind in the day
    delivered, failed, still, kept_copy = queued(fresh_db, A)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute(
            "INSERT INTO inturn_attempt (item_id, attempt, outcome, error)"
            " VALUES (%s, 1, 'failed', 'AR')",
            (failed,),
        )
    finish(fresh_db, "delivered", [delivered, kept_copy])
    finish(fresh_db, "failed", [failed])
    settings = history.Settings(retention_seconds=3600, epoch_seconds=60, hot_seconds=60)
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        assert await history.move(conn, settings, never_stop()) == 3
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        # placed after the move: the given-up message is in history when its day goes
        await worklist.place(
            conn,
            queue="delivery-failed",
            record_kind="delivery",
            record_key=str(failed),
            reason="gave-up",
            placed_by="worker",
        )
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute("UPDATE inturn_epoch SET opened_at = now() - interval '3 days' WHERE n = 1")
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        await history.turn(conn, settings, history.Upkeep())
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute("UPDATE inturn_epoch SET closed_at = now() - interval '2 days' WHERE n = 1")
        later = append(sync, [A], 1, tag="E2-")
    return {
        "log": both,
        "delivered": delivered,
        "failed": failed,
        "pending": still,
        "delivered_too": kept_copy,
        "later": later,
        "settings": settings,
    }


async def test_a_day_past_the_retention_is_dropped_whole_and_keeps_what_is_needed(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    day = await dropped_day(fresh_db, role_dsns)
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        done = history.Upkeep()
        await history.drop_due(conn, day["settings"], done, never_stop(), "purge")
    assert done.waiting == []
    [dropped] = done.dropped
    assert (dropped.epoch.n, dropped.log_rows, dropped.history_rows) == (1, 4, 2)
    assert (dropped.pulled, dropped.copied, dropped.kept) == (4, 5, 1)
    assert dropped.bytes > 0
    assert rows(
        fresh_db, "SELECT to_regclass('inturn_message_e1'), to_regclass('inturn_history_e1')"
    ) == [(None, None)]
    assert rows(fresh_db, "SELECT n FROM inturn_epoch WHERE dropped_at IS NOT NULL") == [(1,)]
    # pending never dropped: A's queued message and all four of B's, each with its payload
    # and the binding it was sealed under (the log row's id and channel)
    hot = rows(
        fresh_db,
        "SELECT id, destination, state, message_id, convert_from(payload, 'UTF8'), seal_id,"
        " seal_scope FROM inturn_delivery WHERE message_id < %s ORDER BY destination, id",
        WIDTH,
    )
    by_dest = {(r[1], r[2]) for r in hot}
    assert by_dest == {(A, "pending"), (A, "failed"), (B, "pending")}
    for r in hot:
        assert r[4].startswith("MSH|") and (r[5], r[6]) == (r[3], "channel:adt")
    assert [r[3] for r in hot if r[1] == B] == day["log"]
    # the given-up message a pending worklist item names is back, with its attempt
    assert rows(
        fresh_db,
        "SELECT attempt, outcome, error FROM inturn_attempt WHERE item_id = %s",
        day["failed"],
    ) == [(1, "failed", "AR")]
    assert rows(fresh_db, "SELECT count(*) FROM inturn_history") == [(0,)]
    # the worker sends the pending one: its head reads the payload kept in the row
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        held = await leases.acquire(conn, B, "w-b2", 60)
        head, _ = await delivery.next_head(conn, B, lease=held)
        assert head is not None and head.item.control_id == "E1-0"
        assert head.binding == (day["log"][0], "channel:adt")
    # the next day is untouched
    assert rows(fresh_db, "SELECT id FROM inturn_message") == [(day["later"][0],)]
    # the drop's record
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        again = history.Upkeep()
        await history.drop_due(conn, day["settings"], again, never_stop(), "purge")
        assert again.dropped == [] and again.waiting == []


def inturn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INTURN, *args], capture_output=True, text=True, timeout=120)


async def test_erasure_by_patient_reaches_history_and_a_day_detached_not_dropped(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """The patient's messages: one delivered and moved to history in a day that is detached
    (its drop not done yet), one moved to history in the open day, one still pending; another
    patient's message in each place stays."""
    mine = "{" + ",".join(index_keys(PID_42)) + "}"
    theirs = "{" + ",".join(index_keys(PID_7)) + "}"

    def put(keys: str, tag: str) -> None:
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            [log_id] = append(sync, [A], 1, tag=tag)
            sync.execute(
                "UPDATE inturn_message SET patient_keys = %s WHERE id = %s", (keys, log_id)
            )

    async def deliver_and_move() -> None:
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await pulled(conn, A)
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            sync.execute(
                "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() - interval"
                " '1 hour' WHERE state = 'pending'"
            )
        async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
            await history.move(conn, settings, never_stop())

    settings = history.Settings(retention_seconds=3600, epoch_seconds=60, hot_seconds=60)
    put(mine, "OLD-MINE-")
    put(theirs, "OLD-THEIRS-")
    await deliver_and_move()
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute("UPDATE inturn_epoch SET opened_at = now() - interval '1 day' WHERE n = 1")
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        await history.turn(conn, settings, history.Upkeep())
    put(mine, "NEW-MINE-")
    put(theirs, "NEW-THEIRS-")
    await deliver_and_move()
    put(mine, "PENDING-MINE-")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await pulled(conn, A)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        # epoch 1's drop stopped between its DETACH and its DROP
        sync.execute("SELECT inturn_epoch_detach(1, 500)")
        assert sync.execute(
            "SELECT (SELECT count(*) FROM inturn_history_e1), (SELECT count(*) FROM"
            " inturn_message_e1), (SELECT count(*) FROM inturn_history)"
        ).fetchone() == (2, 2, 2)

    done = inturn(
        "queue", "erase", "--patient-id", "MRN-42", "--who", "dpo", "--why", "request 9",
        "--dsn", role_dsns["admin"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "erased 2" in done.stdout  # the one in the open day's history, the pending one
    with psycopg.connect(fresh_db) as sync:
        left = sync.execute(
            "SELECT 'hot', control_id FROM inturn_delivery UNION ALL"
            " SELECT 'history', control_id FROM inturn_history UNION ALL"
            " SELECT 'detached history', control_id FROM inturn_history_e1 UNION ALL"
            " SELECT 'detached log', control_id FROM inturn_message_e1 ORDER BY 1, 2"
        ).fetchall()
    assert left == [
        ("detached history", "OLD-THEIRS-0"),
        ("detached log", "OLD-THEIRS-0"),
        ("history", "NEW-THEIRS-0"),
    ]


async def test_depth_and_metrics_show_the_history_and_what_is_overdue(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    never = inturn("queue", "depth", "--dsn", role_dsns["reader"])
    assert never.returncode == 0, never.stderr
    assert never.stdout.splitlines()[-1].endswith("; inturn purge has never run")
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [A], 3)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await pulled(conn, A)
    finish(fresh_db, "delivered", queued(fresh_db, A))
    ran = inturn("purge", "--older-than", "7d", "--dsn", role_dsns["purge"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[1:] == [
        "moved 3 finished item(s) to history",
        "partitions made ahead for epoch 2",
    ]
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        # the job stopped two days ago, in a day that should have lasted one
        sync.execute(
            "UPDATE inturn_epoch SET opened_at = now() - interval '3 days' WHERE n = 1;"
            " UPDATE inturn_maintenance SET ran_at = now() - interval '2 days'"
        )
    # before any ANALYZE (the planner's estimate is 0) people read the counts themselves
    shown = inturn("queue", "depth", "--dsn", role_dsns["reader"])
    line = shown.stdout.splitlines()[-1]
    assert line.startswith("history: 3 finished item(s), ") and " in 1 day(s), " in line
    assert "; hot table: 0 row(s), " in line
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute("ANALYZE inturn_history_e1")  # /metrics reads the estimate
    assert line.endswith("; inturn purge ran 2d ago; the day is 2d late to turn"), line
    async with await AsyncConnection.connect(role_dsns["reader"], autocommit=True) as conn:
        status = await history.status(conn)
        # past the cap of a count, the days' counters (migration 0052) keep it exact: a new
        # user's trial read "about 0" right after a move, before ANALYZE
        counted = await history.status(conn, count_up_to=2)
    assert (counted.history_rows, counted.history_exact) == (3, True)
    assert (counted.log_rows, counted.log_exact) == (3, True)
    now = datetime.now(UTC)
    history_metrics.set_from(status, now)
    sample = REGISTRY.get_sample_value
    assert sample("inturn_history_rows", {"part": "history"}) == 3
    assert (sample("inturn_history_bytes", {"part": "history"}) or 0) > 0
    assert sample("inturn_history_days") == 1
    overdue = sample("inturn_history_epoch_overdue_seconds") or 0
    assert 2 * 86400 < overdue < 2 * 86400 + 600
    assert sample("inturn_history_drop_overdue_seconds") == 0
    # a day closed 8 days ago with a retention of 7: one day overdue
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute(
            "UPDATE inturn_epoch SET opened_at = now() - interval '9 days',"
            " closed_at = now() - interval '8 days' WHERE n = 1;"
            " UPDATE inturn_epoch SET opened_at = now() - interval '8 days' WHERE n = 2"
        )
    async with await AsyncConnection.connect(role_dsns["reader"], autocommit=True) as conn:
        status = await history.status(conn)
    assert 86400 - 600 < status.drop_overdue_seconds(datetime.now(UTC)) < 86400 + 600
    assert "a drop is 24h overdue" in status.describe(datetime.now(UTC))
