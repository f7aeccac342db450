"""A partner's answer becomes work: apply_status with its placement, late replies, answers
clearing "unanswered" items."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from inturn.worker.reservations import bookings
from inturn.worker.reservations.bookings import SegmentNotFound, apply_status
from tests.support.booking_data import LH400, UA960, booking, segment

BOOKING = booking("ABC123", LH400, segment(UA960, status="HN"))


@pytest.fixture
async def conn(fresh_db: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as c:
        await bookings.import_document(c, [copy.deepcopy(BOOKING)])
        yield c


async def items(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT queue, record_kind, record_key, reason, state, cleared_by, note"
        " FROM inturn_worklist_item ORDER BY id"
    )
    return await cur.fetchall()


async def status(conn: psycopg.AsyncConnection[Any], number: int) -> str:
    cur = await conn.execute(
        "SELECT status FROM inturn_segment WHERE locator = 'ABC123' AND number = %s", (number,)
    )
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def test_a_confirmation_folds_and_is_passed_on(conn: psycopg.AsyncConnection[Any]) -> None:
    done = await apply_status(conn, "ABC123", 1, "KK")
    assert (done.outcome, done.previous, done.status) == ("applied", "HN", "HK")
    assert done.placement is not None and done.placement.created
    assert await status(conn, 1) == "HK"
    assert await items(conn) == [
        ("office-fra1a0", "segment", "ABC123/1", "confirmed", "pending", None, None)
    ]
    again = await apply_status(conn, "ABC123", 1, "KK")
    assert again.placement is not None and not again.placement.created
    found = await bookings.show(conn, "ABC123")
    assert found is not None
    assert [(e.code, e.previous, e.result, e.outcome) for e in found[1]] == [
        ("KK", "HN", "HK", "applied"),
        ("KK", "HK", "HK", "applied"),
    ]


@pytest.mark.parametrize(
    ("code", "held", "reason"),
    [
        ("US", "HL", "waitlisted"),
        ("UC", "UC", "refused"),
        ("TK", "HK", "schedule-change"),
        ("TN", "HN", "schedule-change"),
        ("HK", "HK", None),
        ("Q7", "Q7", "review"),
    ],
)
async def test_codes_fold_and_place(
    conn: psycopg.AsyncConnection[Any], code: str, held: str, reason: str | None
) -> None:
    done = await apply_status(conn, "ABC123", 2, code)
    assert await status(conn, 2) == held
    got = [(i[2], i[3]) for i in await items(conn)]
    assert got == ([("ABC123/2", reason)] if reason else [])
    assert (done.placement is None) == (reason is None)


async def test_a_reply_clears_its_unanswered_item(conn: psycopg.AsyncConnection[Any]) -> None:
    from inturn.worker.worklist import place

    await place(
        conn,
        queue="office-fra1a0",
        record_kind="segment",
        record_key="ABC123/1",
        reason="unanswered",
        placed_by="sweeper",
    )
    done = await apply_status(conn, "ABC123", 1, "UC")
    assert [i.reason for i in done.answered] == ["unanswered"]
    assert await items(conn) == [
        ("office-fra1a0", "segment", "ABC123/1", "unanswered", "cleared", "system", "answered"),
        ("office-fra1a0", "segment", "ABC123/1", "refused", "pending", None, None),
    ]


async def test_a_late_reply_is_recorded_and_raised_never_resurrecting(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    await apply_status(conn, "ABC123", 1, "XK")  # we cancelled it, no message
    done = await apply_status(conn, "ABC123", 1, "KK")
    assert (done.outcome, done.status) == ("late", "XK")
    assert await status(conn, 1) == "XK"
    assert [(i[2], i[3]) for i in await items(conn)] == [("ABC123/1", "late-reply")]
    found = await bookings.show(conn, "ABC123")
    assert found is not None
    assert [(e.code, e.outcome) for e in found[1]] == [("XK", "applied"), ("KK", "late")]


async def test_bad_input(conn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(SegmentNotFound):
        await apply_status(conn, "ABC123", 9, "KK")
    with pytest.raises(SegmentNotFound):
        await apply_status(conn, "NOPE00", 1, "KK")
    with pytest.raises(ValueError):
        await apply_status(conn, "ABC123", 1, "kk")
    assert await items(conn) == []
