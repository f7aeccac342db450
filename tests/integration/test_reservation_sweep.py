"""The sweeper's reservation rules against the real store: thresholds by database time, time
zones, limits, concurrent sweeps and automatic cancellation."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from inturn.worker.reservations import bookings, sweep
from inturn.worker.reservations.cancel import cancel_expired
from tests.support import booking_data as data
from tests.support import db

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
HOURS6 = timedelta(hours=6)
DAY = timedelta(hours=24)


def booking(
    locator: str = "ABC123",
    *,
    deadline: str | None = "2026-12-01T18:00:00Z",
    airport: str | None = None,
    status: str = "HK",
    ticketed: bool = False,
) -> dict[str, Any]:
    doc = data.booking(
        locator, data.segment(data.LH400, status=status), data.UA960, data.LH401, ticketed=ticketed
    )
    doc.pop("ticketingDeadline")
    if deadline is not None:
        doc["ticketingDeadline"] = deadline
    if airport is not None:
        doc["ticketingDeadlineAirport"] = airport
    return doc


@pytest.fixture
async def conn(fresh_db: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        yield c


async def load(conn: psycopg.AsyncConnection[Any], *docs: dict[str, Any]) -> None:
    await bookings.import_document(conn, [copy.deepcopy(d) for d in docs])


async def pending(conn: psycopg.AsyncConnection[Any]) -> list[tuple[str, str]]:
    cur = await conn.execute(
        "SELECT record_key, reason FROM inturn_worklist_item WHERE state = 'pending' ORDER BY id"
    )
    return [(r[0], r[1]) for r in await cur.fetchall()]


@pytest.mark.parametrize(("offset", "placed"), [(-SECOND, 0), (timedelta(0), 1), (SECOND, 1)])
async def test_unanswered_threshold(
    conn: psycopg.AsyncConnection[Any], offset: timedelta, placed: int
) -> None:
    await load(conn, booking(status="HN"))
    out = await sweep.unanswered(conn, limit=500, at=T0 + HOURS6 + offset)
    assert out.placed == placed
    assert await pending(conn) == [("ABC123/1", "unanswered")] * placed


async def test_unanswered_is_not_placed_twice_or_after_a_clear_and_goes_on_answer(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    await load(conn, booking(status="HN"))
    at = T0 + DAY
    assert (await sweep.unanswered(conn, limit=500, at=at)).placed == 1
    again = await sweep.unanswered(conn, limit=500, at=at)
    assert (again.placed, again.already) == (0, 1)
    # a person clears it: the same request is not handed back
    # (placed and cleared at times of the test's own clock, not the machine's: a request
    # re-imported later is judged against them, and now() made this test fail from 2026-12-01)
    await conn.execute(
        "UPDATE inturn_worklist_item SET state = 'cleared', placed_at = %s, cleared_at = %s,"
        " cleared_by = 'ana', note = 'chased by phone'",
        (at - timedelta(hours=2), at - timedelta(hours=1)),
    )
    assert (await sweep.unanswered(conn, limit=500, at=at)).placed == 0
    # a new request (re-imported with a new request time) is new work
    doc = booking(status="HN")
    doc["segments"][0]["requestedAt"] = "2026-12-01T08:00:00Z"
    await load(conn, doc)
    assert (await sweep.unanswered(conn, limit=500, at=at + DAY)).placed == 1
    # the segment is confirmed by an import rather than a reply: the next sweep clears it
    await load(conn, booking(status="HK"))
    out = await sweep.unanswered(conn, limit=500, at=at + DAY)
    assert (out.placed, out.cleared) == (0, 1)
    assert await pending(conn) == []


DEADLINE = datetime(2026, 12, 1, 18, tzinfo=UTC)


@pytest.mark.parametrize(
    ("offset", "due", "expired"),
    [
        (-DAY - SECOND, 0, 0),
        (-DAY, 1, 0),
        (-DAY + SECOND, 1, 0),
        (-SECOND, 1, 0),
        (timedelta(0), 0, 1),
        (SECOND, 0, 1),
    ],
)
async def test_ticketing_thresholds(
    conn: psycopg.AsyncConnection[Any], offset: timedelta, due: int, expired: int
) -> None:
    await load(conn, booking())
    at = DEADLINE + offset
    assert (await sweep.ticketing_due(conn, limit=500, at=at)).placed == due
    assert (await sweep.ticketing_expired(conn, limit=500, at=at)).placed == expired


async def test_ticketing_items_move_on_and_go_when_ticketed(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    await load(conn, booking())
    await sweep.ticketing_due(conn, limit=500, at=DEADLINE - HOURS6)
    assert await pending(conn) == [("ABC123", "ticketing-due")]
    out = await sweep.ticketing_due(conn, limit=500, at=DEADLINE + SECOND)
    assert out.cleared == 1
    await sweep.ticketing_expired(conn, limit=500, at=DEADLINE + SECOND)
    assert await pending(conn) == [("ABC123", "ticketing-expired")]
    await load(conn, booking(ticketed=True))
    out = await sweep.ticketing_expired(conn, limit=500, at=DEADLINE + SECOND)
    assert (out.placed, out.cleared) == (0, 1)
    cur = await conn.execute("SELECT note FROM inturn_worklist_item ORDER BY id")
    assert [r[0] for r in await cur.fetchall()] == ["deadline passed", "ticketed"]


@pytest.mark.parametrize(
    ("deadline", "airport", "threshold"),
    [
        # given in UTC
        ("2026-10-25T17:00:00Z", None, datetime(2026, 10, 24, 17, tzinfo=UTC)),
        # local time at Frankfurt the day summer time ends (CET, UTC+1): 17:00Z
        ("2026-10-25T18:00", "FRA", datetime(2026, 10, 24, 17, tzinfo=UTC)),
        # local time at Frankfurt the day before (CEST, UTC+2): 16:00Z
        ("2026-10-24T18:00", "FRA", datetime(2026, 10, 23, 16, tzinfo=UTC)),
    ],
)
async def test_deadlines_in_utc_and_local_time_across_dst(
    conn: psycopg.AsyncConnection[Any], deadline: str, airport: str | None, threshold: datetime
) -> None:
    await load(conn, booking(deadline=deadline, airport=airport))
    assert (await sweep.ticketing_due(conn, limit=500, at=threshold - SECOND)).placed == 0
    assert (await sweep.ticketing_due(conn, limit=500, at=threshold)).placed == 1
    expired_at = threshold + DAY
    assert (await sweep.ticketing_expired(conn, limit=500, at=expired_at - SECOND)).placed == 0
    assert (await sweep.ticketing_expired(conn, limit=500, at=expired_at)).placed == 1


async def test_limit_takes_the_most_overdue(conn: psycopg.AsyncConnection[Any]) -> None:
    docs = []
    for i in range(1000):
        # deadlines in scrambled order, one minute apart (7919 is prime: a permutation)
        minute = (i * 7919) % 1000
        when = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=minute)
        docs.append(booking(f"L{i:05d}", deadline=when.isoformat()))
    await load(conn, *docs)
    out = await sweep.ticketing_expired(conn, limit=500, at=datetime(2026, 12, 1, tzinfo=UTC))
    assert out.placed == 500
    cur = await conn.execute(
        "SELECT max(b.ticketing_deadline) FROM inturn_worklist_item w"
        " JOIN inturn_booking b ON b.locator = w.record_key"
    )
    row = await cur.fetchone()
    assert row is not None
    assert row[0] == datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=499)
    nxt = await sweep.ticketing_expired(conn, limit=500, at=datetime(2026, 12, 1, tzinfo=UTC))
    assert (nxt.placed, nxt.already) == (500, 500)


async def test_two_concurrent_sweeps_place_each_booking_once(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        await load(c, *(booking(f"C{i:05d}", status="HN") for i in range(60)))

    async def run() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
            a = await sweep.unanswered(c, limit=500, at=T0 + DAY)
            b = await sweep.ticketing_expired(c, limit=500, at=DEADLINE + DAY)
            return a.placed, b.placed

    results = await asyncio.gather(run(), run())
    assert sum(r[0] for r in results) == 60 and sum(r[1] for r in results) == 60
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        cur = await c.execute(
            "SELECT reason, count(*), count(DISTINCT record_key) FROM inturn_worklist_item"
            " GROUP BY reason ORDER BY reason"
        )
        assert await cur.fetchall() == [("ticketing-expired", 60, 60), ("unanswered", 60, 60)]


async def register(conn: psycopg.AsyncConnection[Any], name: str, carriers: list[str]) -> None:
    await db.register(conn, f"airlines/{name}", "reservations", carriers=carriers)


async def notices(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT destination, channel, control_id, message_type, payload FROM inturn_delivery"
        " ORDER BY id"
    )
    return await cur.fetchall()


async def test_auto_cancel_notifies_carriers_and_reports_who_was_not_told(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    await register(conn, "lufthansa", ["LH"])
    await load(conn, booking())
    out = await sweep.ticketing_expired(conn, limit=500, auto_cancel=True, at=DEADLINE + SECOND)
    assert out.placed == 2
    found = await bookings.show(conn, "ABC123")
    assert found is not None
    b, history = found
    assert b.cancelled_at is not None and b.cancel_reason == "ticketing-expired"
    # live segments withdrawn; the refused one (UC) held nothing and stays
    assert [(s.number, s.status) for s in b.segments] == [(1, "XX"), (2, "XX"), (3, "UC")]
    assert [(e.number, e.previous, e.outcome) for e in history] == [
        (1, "HK", "withdrawn"),
        (2, "HK", "withdrawn"),
    ]
    [(dest, channel, control_id, mtype, payload)] = await notices(conn)
    assert (dest, channel, control_id, mtype) == (
        "airlines/lufthansa",
        "reservations",
        "XXABC123LH",
        "ZRC^Z01",
    )
    segs = bytes(payload).decode().split("\r")
    assert segs[0].startswith("MSH|^~\\&|INTURN|FRA1A0|LH|LH|")
    assert segs[0].endswith("||ZRC^Z01^ZRC_Z01|XXABC123LH|P|2.5")
    assert segs[1].startswith("ZRB|ABC123|FRA1A0|ticketing-expired|")
    assert segs[2:] == ["ZSG|1|LH|400|20261210|FRA|JFK|XX|HK", ""]
    cur = await conn.execute(
        "SELECT reason, details FROM inturn_worklist_item WHERE state = 'pending' ORDER BY id"
    )
    rows = await cur.fetchall()
    assert [r[0] for r in rows] == ["ticketing-expired", "cancel-not-delivered"]
    assert rows[0][1]["cancelled"] is True and rows[0][1]["told"] == ["LH"]
    assert rows[1][1] == {"carriers": ["UA"], "why": {"UA": "no Destination serves it"}}

    # a second run cancels nothing twice and places nothing twice
    again = await sweep.ticketing_expired(conn, limit=500, auto_cancel=True, at=DEADLINE + DAY)
    assert again.placed == 0
    assert len(await notices(conn)) == 1
    direct = await cancel_expired(conn, "ABC123", at=DEADLINE + DAY)
    assert not direct.cancelled and len(await notices(conn)) == 1


async def test_host_carriers_are_not_sent_a_notice(conn: psycopg.AsyncConnection[Any]) -> None:
    await register(conn, "united", ["UA"])
    await load(conn, booking())
    done = await cancel_expired(conn, "ABC123", host_carriers=["LH"], at=DEADLINE)
    assert done.cancelled and done.not_told == {} and list(done.told) == ["UA"]
    assert [p.item.reason for p in done.placements] == ["ticketing-expired"]


async def test_without_auto_cancel_nothing_is_cancelled(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    await register(conn, "lufthansa", ["LH"])
    await load(conn, booking())
    await sweep.ticketing_expired(conn, limit=500, at=DEADLINE + DAY)
    found = await bookings.show(conn, "ABC123")
    assert found is not None and found[0].cancelled_at is None
    assert await notices(conn) == []


async def lock_waiters(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_a_ticket_issued_during_an_auto_cancel_run_wins(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        await register(c, "lufthansa", ["LH"])
        await load(c, booking())
    ticketing = await psycopg.AsyncConnection.connect(fresh_db)
    sweeper = await psycopg.AsyncConnection.connect(fresh_db, autocommit=True)
    watcher = await psycopg.AsyncConnection.connect(fresh_db, autocommit=True)
    try:
        # a ticket is being issued: its transaction holds the booking row
        await ticketing.execute(
            "UPDATE inturn_booking SET ticketed = true, ticket_numbers = '{2201234567890}'"
            " WHERE locator = 'ABC123'"
        )
        run = asyncio.create_task(
            sweep.ticketing_expired(sweeper, limit=500, auto_cancel=True, at=DEADLINE + DAY)
        )
        deadline = time.monotonic() + 20
        while await lock_waiters(watcher) == 0:  # the sweep selected it and waits on the lock
            assert time.monotonic() < deadline, "the sweep never waited on the booking lock"
            assert not run.done(), run
            await asyncio.sleep(0.05)
        await ticketing.commit()
        out = await run
        assert out.placed == 0
        found = await bookings.show(watcher, "ABC123")
        assert found is not None
        b, history = found
        assert b.ticketed and b.cancelled_at is None
        assert [s.status for s in b.segments] == ["HK", "HK", "UC"] and history == []
        assert await notices(watcher) == []
    finally:
        for c in (ticketing, sweeper, watcher):
            await c.close()


async def test_concurrent_auto_cancels_cancel_once(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        await register(c, "lufthansa", ["LH"])
        await register(c, "united", ["UA"])
        await load(c, *(booking(f"K{i:05d}") for i in range(20)))

    async def run() -> int:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
            out = await sweep.ticketing_expired(c, limit=500, auto_cancel=True, at=DEADLINE + DAY)
            return out.placed

    placed = await asyncio.gather(run(), run(), run())
    assert sum(placed) == 20
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        cur = await c.execute("SELECT count(*), count(DISTINCT control_id) FROM inturn_delivery")
        assert await cur.fetchone() == (40, 40)
        cur = await c.execute(
            "SELECT count(*) FROM inturn_segment_event WHERE outcome = 'withdrawn'"
        )
        assert await cur.fetchone() == (40,)


async def test_without_a_pinned_instant_the_database_clock_decides(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    db_now: datetime = row[0]
    fresh = booking("FRESH1", status="HN")
    fresh["segments"][0]["requestedAt"] = (db_now - HOURS6 + timedelta(minutes=5)).isoformat()
    fresh["ticketingDeadline"] = (db_now + DAY + timedelta(minutes=5)).isoformat()
    overdue = booking("LATE01", status="HN")
    overdue["segments"][0]["requestedAt"] = (db_now - HOURS6 - SECOND).isoformat()
    overdue["ticketingDeadline"] = (db_now - SECOND).isoformat()
    await load(conn, fresh, overdue)
    assert (await sweep.unanswered(conn, limit=500)).placed == 1
    assert (await sweep.ticketing_due(conn, limit=500)).placed == 0
    assert (await sweep.ticketing_expired(conn, limit=500)).placed == 1
    assert await pending(conn) == [("LATE01/1", "unanswered"), ("LATE01", "ticketing-expired")]


async def test_a_failed_enqueue_is_reported_and_the_cancel_stands(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    await register(conn, "lufthansa", ["LH"])
    await register(conn, "united", ["UA"])
    await load(conn, booking())
    # the database refuses any row for the Lufthansa queue (a real error, from a trigger)
    await conn.execute(
        "CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'refused for test'; END $$"
    )
    await conn.execute(
        "CREATE TRIGGER refuse_lh BEFORE INSERT ON inturn_delivery FOR EACH ROW"
        " WHEN (NEW.destination = 'airlines/lufthansa') EXECUTE FUNCTION pg_temp.refuse()"
    )
    try:
        done = await cancel_expired(conn, "ABC123", at=DEADLINE)
    finally:
        await conn.execute("DROP TRIGGER refuse_lh ON inturn_delivery")
    assert done.cancelled and list(done.told) == ["UA"]
    assert done.not_told == {"LH": "enqueue on airlines/lufthansa failed: RaiseException"}
    assert [d[0] for d in await notices(conn)] == ["airlines/united"]
    cur = await conn.execute(
        "SELECT details FROM inturn_worklist_item WHERE reason = 'cancel-not-delivered'"
    )
    row = await cur.fetchone()
    assert row is not None and row[0]["carriers"] == ["LH"]
    found = await bookings.show(conn, "ABC123")
    assert found is not None and found[0].cancelled_at is not None
