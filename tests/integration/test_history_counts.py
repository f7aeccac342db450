"""A day's rows counted as they are written (issue 37, migration 0052): a drop audits the rows
its log and history partitions held from ``inturn_epoch_rows``, not by scanning them, and the
counts are the rows that were there: after ingest on two channels, the move, an erasure by
patient (in an attached day and in a detached one), a resend from history and a row kept back
in the hot table. A day that held rows before the counters existed is counted at its drop."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.hl7.pid import index_keys
from inturn.worker.store import delivery, history, worklist
from inturn.worker.store import lease as leases
from inturn.worker.store.migrate import migrate
from tests.support.channel_log import append, never_stop
from tests.support.db import migrate_below
from tests.support.pipeline import INTURN

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

A = "ward/a"
L = "lab/l"
PID_42 = b"MSH|^~\\&|A|B|C|D|2026||ADT^A01|X|P|2.5\rPID|1||MRN-42^^^HOSP^MR||DOE\r"
SETTINGS = history.Settings(retention_seconds=3600, epoch_seconds=60, hot_seconds=60)


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def inturn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INTURN, *args], capture_output=True, text=True, timeout=120)


async def deliver_all(dsn: str, purge_dsn: str, destination: str, channel: str) -> None:
    """The destination pulls what is routed to it, every pending row is delivered an hour
    ago, and the maintenance moves the finished rows to history."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        held = await leases.acquire(conn, destination, f"w-{destination}", 60)
        while (await delivery.pull(conn, destination, channel, lease=held)).more:
            pass
    with psycopg.connect(dsn, autocommit=True) as sync:
        sync.execute(
            "UPDATE inturn_delivery SET state = 'delivered', attempts = 1,"
            " finished_at = now() - interval '1 hour' WHERE state = 'pending'"
        )
    async with await AsyncConnection.connect(purge_dsn, autocommit=True) as conn:
        await history.move(conn, SETTINGS, never_stop)


def held(dsn: str, epoch: int) -> tuple[int, int]:
    """The rows the epoch's log and history partitions hold, counted (the truth)."""
    [(log, hist)] = rows(
        dsn, f"SELECT (SELECT count(*) FROM inturn_message_e{epoch}),"
        f" (SELECT count(*) FROM inturn_history_e{epoch})"
    )  # fmt: skip
    return int(log), int(hist)


def counters(dsn: str, epoch: int) -> tuple[int, int]:
    """The epoch's sums in inturn_epoch_rows (what the drop audits)."""
    [(log, hist)] = rows(
        dsn,
        "SELECT coalesce(sum(rows) FILTER (WHERE part = 'log'), 0),"
        " coalesce(sum(rows) FILTER (WHERE part = 'history'), 0)"
        " FROM inturn_epoch_rows WHERE epoch = %s",
        epoch,
    )
    return int(log), int(hist)


def close_epoch_one(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as sync:
        sync.execute("UPDATE inturn_epoch SET opened_at = now() - interval '3 days' WHERE n = 1")


async def turn(purge_dsn: str) -> None:
    async with await AsyncConnection.connect(purge_dsn, autocommit=True) as conn:
        await history.turn(conn, SETTINGS, history.Upkeep())


async def drop_one(dsn: str, purge_dsn: str) -> history.Dropped:
    with psycopg.connect(dsn, autocommit=True) as sync:
        sync.execute("UPDATE inturn_epoch SET closed_at = now() - interval '2 days' WHERE n = 1")
    async with await AsyncConnection.connect(purge_dsn, autocommit=True) as conn:
        done = history.Upkeep()
        await history.drop_due(conn, SETTINGS, done, never_stop, "purge")
    assert done.waiting == []
    [dropped] = done.dropped
    return dropped


async def test_a_drop_audits_the_rows_its_day_held_counted_as_they_were_written(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    purge = role_dsns["purge"]
    mine = "{" + ",".join(index_keys(PID_42)) + "}"
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        adt = append(sync, [A], 6, tag="ADT-")
        lab = append(sync, [L], 3, tag="LAB-", channel="lab")
        sync.execute(
            "UPDATE inturn_message SET patient_keys = %s WHERE id = ANY(%s)",
            (mine, [adt[0], lab[0]]),
        )
    await deliver_all(fresh_db, purge, A, "adt")
    await deliver_all(fresh_db, purge, L, "lab")
    assert held(fresh_db, 1) == counters(fresh_db, 1) == (9, 9)
    # ingest writes one counter row per channel; the move and the rest the shared one
    assert rows(
        fresh_db, "SELECT part, shard, rows FROM inturn_epoch_rows WHERE epoch = 1 ORDER BY 1, 2"
    ) == [("history", "", 9), ("log", "adt", 6), ("log", "lab", 3)]

    # erasure by patient in the attached day: a log row and a history row of each channel
    done = inturn(
        "queue", "erase", "--patient-id", "MRN-42", "--who", "dpo", "--why", "request 9",
        "--dsn", role_dsns["admin"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert held(fresh_db, 1) == counters(fresh_db, 1) == (7, 7)

    # a resend of a moved message: its copy is delivered and moved too (same day)
    [(moved_id,)] = rows(
        fresh_db, "SELECT id FROM inturn_history WHERE control_id = 'ADT-1' AND destination = %s", A
    )
    done = inturn(
        "queue", "resend", str(moved_id), "--include-delivered", "--who", "ops", "--why", "lost",
        "--dsn", role_dsns["admin"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    await deliver_all(fresh_db, purge, A, "adt")
    assert held(fresh_db, 1) == counters(fresh_db, 1)

    # a history row a pending worklist item names goes back to the hot table at the drop
    [(kept_id,)] = rows(fresh_db, "SELECT id FROM inturn_history WHERE control_id = 'ADT-2'")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await worklist.place(
            conn,
            queue="delivery-failed",
            record_kind="delivery",
            record_key=str(kept_id),
            reason="gave-up",
            placed_by="worker",
        )
    close_epoch_one(fresh_db)
    await turn(purge)
    truth = held(fresh_db, 1)
    dropped = await drop_one(fresh_db, purge)
    # the kept row left history before the drop: the drop dropped one history row fewer
    assert (dropped.log_rows, dropped.history_rows) == (truth[0], truth[1] - 1)
    assert dropped.kept == 1
    assert rows(fresh_db, "SELECT count(*) FROM inturn_epoch_rows WHERE epoch = 1") == [(0,)]
    [(why,)] = rows(
        fresh_db, "SELECT why FROM inturn_audit WHERE action = 'drop-day' ORDER BY id DESC LIMIT 1"
    )
    assert f"log {truth[0]}, history {truth[1] - 1}," in why


async def test_an_erasure_in_a_detached_day_is_taken_off_its_counts(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    purge = role_dsns["purge"]
    mine = "{" + ",".join(index_keys(PID_42)) + "}"
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        ids = append(sync, [A], 4, tag="OLD-")
        sync.execute(
            "UPDATE inturn_message SET patient_keys = %s WHERE id = ANY(%s)", (mine, ids[:2])
        )
    await deliver_all(fresh_db, purge, A, "adt")
    close_epoch_one(fresh_db)
    await turn(purge)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        # the drop stopped between its DETACH and its DROP
        sync.execute("SELECT inturn_epoch_detach(1, 500)")
    done = inturn(
        "queue", "erase", "--patient-id", "MRN-42", "--who", "dpo", "--why", "request 10",
        "--dsn", role_dsns["admin"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert held(fresh_db, 1) == counters(fresh_db, 1) == (2, 2)
    dropped = await drop_one(fresh_db, purge)
    assert (dropped.log_rows, dropped.history_rows) == (2, 2)


def test_a_day_held_before_the_counters_is_counted_at_its_drop(empty_db: str) -> None:
    """Rows stored under the schema before 0052: their epoch is not counted (its drop counts
    its partitions, as before); the next epoch, empty when 0052 ran, is."""
    migrate_below(empty_db, 52)
    with psycopg.connect(empty_db, autocommit=True) as sync:
        append(sync, [A], 3, tag="BEFORE-")
        sync.execute("SELECT inturn_epoch_prepare(500)")  # epoch 2 prepared ahead, empty
    migrate(empty_db)
    assert rows(empty_db, "SELECT n, counted FROM inturn_epoch ORDER BY n") == [
        (1, False),
        (2, True),
    ]
    with psycopg.connect(empty_db, autocommit=True) as sync:
        append(sync, [A], 2, tag="AFTER-")
        sync.execute("UPDATE inturn_epoch SET opened_at = now() - interval '3 days' WHERE n = 1")
        sync.execute("SELECT inturn_epoch_turn(60)")
        append(sync, [A], 4, tag="NEXT-")
        sync.execute("UPDATE inturn_epoch SET closed_at = now() - interval '2 days' WHERE n = 1")
        sync.execute("SELECT inturn_epoch_detach(1, 500)")
        # the log's partition of epoch 1: 3 rows before 0052 and 2 after (counter: 2 only)
        assert sync.execute("SELECT * FROM inturn_epoch_drop(1, 500)").fetchone()[:2] == (5, 0)
    assert counters(empty_db, 2) == (4, 0)
