"""Delivery windows and throttles (spec.schedule, spec.throttle) through the worker, the depth
query, the sweeper's destination-stuck rule and the Destination's status."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import AsyncConnection

from inturn.operator import status
from inturn.worker.spec.schedule import DAYS, parse
from inturn.worker.store import reads
from inturn.worker.testing import MllpReceiver
from inturn.worker.worklist.delivery_rules import destination_stuck
from tests.support.db import register
from tests.support.lab import DEST, config, enqueue, running, states
from tests.support.pipeline import control_ids, until

pytestmark = pytest.mark.store


def _hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")


def closed_now(now: datetime) -> dict[str, Any]:
    """A UTC schedule open only on the day after tomorrow: closed now, whatever the time."""
    day = DAYS[(now.weekday() + 2) % 7]
    return {"timeZone": "UTC", "windows": [{"days": [day], "start": "00:00", "end": "24:00"}]}


def opened_minutes_ago(now: datetime, minutes: int) -> dict[str, Any]:
    """A UTC schedule that opened ``minutes`` ago (to the minute) and stays open two hours."""
    start = (now - timedelta(minutes=minutes)).replace(second=0, microsecond=0)
    return {
        "timeZone": "UTC",
        "windows": [
            {"days": list(DAYS), "start": _hhmm(start), "end": _hhmm(start + timedelta(hours=2))}
        ],
    }


async def test_outside_its_window_the_worker_holds_without_spending_attempts(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    closed = parse(closed_now(now))
    caplog.set_level(logging.INFO, logger="inturn.drain")
    async with MllpReceiver() as rx:
        async with running(config(rx.port, schedule=closed), fresh_db) as r:
            await enqueue(fresh_db, [1, 2, 3])
            # the worker turns its loop (it looked at the gate and waited) without sending
            await until(_said(caplog, "holding the queue until"))
            assert r.state.lock_held
        assert rx.received == []
        assert [(s, a) for _, s, a in await states(fresh_db)] == [("pending", 0)] * 3
        expected = closed.state(now).until
        assert expected is not None
        assert any(expected.isoformat() in m for m in caplog.messages)
        # once the window is open (here: no schedule) everything goes, in order
        async with running(config(rx.port), fresh_db):
            await until(_delivered(fresh_db, 3))
    assert control_ids(rx.received) == ["MSG00001", "MSG00002", "MSG00003"]
    assert [a for _, _, a in await states(fresh_db)] == [1, 1, 1]


async def test_a_throttle_paces_without_changing_order(fresh_db: str) -> None:
    async with MllpReceiver() as rx, running(config(rx.port, messages_per_second=50), fresh_db):
        await enqueue(fresh_db, list(range(1, 11)))
        await until(_delivered(fresh_db, 10))
    assert control_ids(rx.received) == [f"MSG{n:05d}" for n in range(1, 11)]


async def test_queue_depth_says_until_when_it_is_held(fresh_db: str) -> None:
    now = datetime.now(UTC)
    spec = closed_now(now)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, schedule=spec, stuck_after_seconds=60)
        await enqueue(fresh_db, [1])
        [row] = await reads.depth(conn)
    assert row.schedule == spec
    assert row.held_until(now) == parse(spec).state(now).until
    assert row.to_json(now)["heldUntil"] == parse(spec).state(now).until.isoformat()  # type: ignore[union-attr]


async def test_the_sweeper_counts_only_time_inside_the_window(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute("SELECT now()")
        row = await cur.fetchone()
        assert row is not None
        now: datetime = row[0]
        # the head has waited an hour; the threshold is 5 minutes
        await conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, enqueued_at) VALUES (%s, 'adt', 'M1', 'ADT^A01', '\\x4d5348', 3,"
            " now() - interval '1 hour')",
            (DEST,),
        )
        # outside the window: not stuck, however long the head has waited
        await register(conn, DEST, schedule=closed_now(now), stuck_after_seconds=300)
        outcome = await destination_stuck(conn, limit=10, dry_run=False)
        assert outcome.placed == 0
        # the window opened 3 minutes ago: the wait counts from the opening, under 5 minutes
        await register(conn, DEST, schedule=opened_minutes_ago(now, 3), stuck_after_seconds=300)
        outcome = await destination_stuck(conn, limit=10, dry_run=False)
        assert outcome.placed == 0
        # opened 10 minutes ago: 10 minutes inside the window is over the threshold
        await register(conn, DEST, schedule=opened_minutes_ago(now, 10), stuck_after_seconds=300)
        outcome = await destination_stuck(conn, limit=10, dry_run=False)
        assert outcome.placed == 1
        # the window closes: the item is cleared by system (holding is deliberate now)
        await register(conn, DEST, schedule=closed_now(now), stuck_after_seconds=300)
        outcome = await destination_stuck(conn, limit=10, dry_run=False)
        assert (outcome.placed, outcome.cleared) == (0, 1)
        cur = await conn.execute(
            "SELECT cleared_by, note FROM inturn_worklist_item WHERE reason = 'destination-stuck'"
        )
        [(who, note)] = await cur.fetchall()
        assert who == "system" and "window" in note


def test_the_status_says_outside_window_until_when() -> None:
    until_ = datetime(2026, 12, 7, 5, 0, tzinfo=UTC)
    out = status.desired_status(
        generation=3,
        previous=None,
        worker=status.WorkerDeployment("lab-worker", exists=True, available=True),
        depth=status.QueueDepth(pending=4),
        suspended=False,
        sender="mllp://lab:2575",
        now=datetime(2026, 12, 4, 22, 0, tzinfo=UTC),
        held_until=until_,
    )
    assert out["heldUntil"] == "2026-12-07T05:00:00Z"
    delivering = next(c for c in out["conditions"] if c["type"] == status.DELIVERING)
    assert (delivering["status"], delivering["reason"]) == ("False", "OutsideWindow")
    assert "4 messages wait until 2026-12-07T05:00:00Z" in delivering["message"]
    opened = status.desired_status(
        generation=3,
        previous=out,
        worker=status.WorkerDeployment("lab-worker", exists=True, available=True),
        depth=status.QueueDepth(pending=4),
        suspended=False,
        sender="mllp://lab:2575",
        now=datetime(2026, 12, 7, 5, 1, tzinfo=UTC),
    )
    assert status.status_patch(out, opened) is not None
    assert "heldUntil" not in opened


def _said(caplog: pytest.LogCaptureFixture, text: str) -> Any:
    async def check() -> bool:
        return any(text in m for m in caplog.messages)

    return check


def _delivered(dsn: str, n: int) -> Any:
    async def check() -> bool:
        rows = await states(dsn)
        return len(rows) == n and all(r[1] == "delivered" for r in rows)

    return check
