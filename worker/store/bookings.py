"""Reservation records in Postgres: bookings, segments and the history of their statuses.

The records (:class:`~inturn.worker.store.model.Booking`, ``Segment``, ``Withdrawn``) are in
:mod:`inturn.worker.store.model`.

Every function takes an open async connection and runs in its current transaction (the
caller decides where a transaction begins and ends; an autocommit connection commits each
statement). Rows are read by column name. The queries are in ``sql/bookings.sql``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row

from inturn.worker.store import actions
from inturn.worker.store.model import Booking, Segment, Withdrawn
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("bookings.sql")


Written = Literal["created", "updated", "unchanged"]
Outcome = Literal["applied", "late", "withdrawn"]


@dataclass(frozen=True)
class SegmentEvent:
    """One status a partner sent for a segment (or a withdrawal of ours), as recorded.

    Attributes:
        number: the segment; code: the code as received.
        previous, result: the segment's status before and after (equal when ``late``).
        outcome: ``applied``; ``late`` (the segment was already cancelled: recorded, not
            applied); ``withdrawn`` (our cancellation).
        received_at: when the partner's message arrived; recorded_at: when it was stored.
    """

    id: int
    number: int
    code: str
    previous: str
    result: str
    outcome: Outcome
    received_at: datetime
    recorded_at: datetime

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (camelCase keys, ISO 8601 times)."""
        return {
            "segment": self.number,
            "code": self.code,
            "previous": self.previous,
            "result": self.result,
            "outcome": self.outcome,
            "receivedAt": self.received_at.isoformat(),
            "recordedAt": self.recorded_at.isoformat(),
        }


@dataclass(frozen=True)
class LockedSegment:
    """A segment locked for an update, with its booking's owner and cancellation."""

    owner: str
    cancelled_at: datetime | None
    status: str
    carrier: str


@dataclass(frozen=True)
class LockedBooking:
    """A booking locked for cancellation, with what the cancellation re-checks.

    ``expired`` is whether its ticketing deadline has passed (database time).
    """

    locator: str
    owner: str
    ticketed: bool
    cancelled_at: datetime | None
    ticketing_deadline: datetime | None
    expired: bool


@dataclass(frozen=True)
class CarrierDestination:
    """The live Destination that serves a carrier, and the channel it is registered on."""

    carrier: str
    destination: str
    channel: str


async def upsert(conn: AsyncConnection[Any], booking: Booking) -> Written:
    """Write one imported booking and its segments; segments it does not list are deleted.

    Idempotent: writing the same booking again changes nothing and returns ``unchanged``.
    The cancellation of a cancelled booking is kept. Run it inside a transaction, so that a
    booking is never half written.

    Returns:
        ``created``, ``updated`` (the booking or any segment changed) or ``unchanged``.
    """
    row = await fetch_one(
        conn,
        Q["upsert_booking"],
        {
            "locator": booking.locator,
            "owner": booking.owner,
            "created_at": booking.created_at,
            "ticketing_deadline": booking.ticketing_deadline,
            "ticketing_deadline_text": booking.ticketing_deadline_text,
            "ticketed": booking.ticketed,
            "ticket_numbers": list(booking.ticket_numbers),
        },
        row=dict_row,
    )
    changed = row is not None
    async with conn.cursor() as seg_cur:
        for seg in booking.segments:
            await seg_cur.execute(
                Q["upsert_segment"],
                {
                    "locator": booking.locator,
                    "number": seg.number,
                    "carrier": seg.carrier,
                    "flight": seg.flight,
                    "date": seg.date,
                    "origin": seg.origin,
                    "destination": seg.destination,
                    "status": seg.status,
                    "requested_at": seg.requested_at,
                },
            )
            changed = changed or await seg_cur.fetchone() is not None
        await seg_cur.execute(
            Q["delete_other_segments"],
            {"locator": booking.locator, "numbers": [s.number for s in booking.segments]},
        )
        changed = changed or bool(await seg_cur.fetchall())
    if row is not None and row["created"]:
        return "created"
    return "updated" if changed else "unchanged"


async def get(conn: AsyncConnection[Any], locator: str) -> Booking | None:
    """Return one booking with its segments, or None if there is no such locator."""
    b = await fetch_one(conn, Q["get_booking"], {"locator": locator}, row=dict_row)
    if b is None:
        return None
    segments = await fetch_all(
        conn, Q["get_segments"], {"locator": locator}, row=class_row(Segment)
    )
    return Booking(
        locator=b["locator"],
        owner=b["owner"],
        created_at=b["created_at"],
        segments=tuple(segments),
        ticketing_deadline=b["ticketing_deadline"],
        ticketing_deadline_text=b["ticketing_deadline_text"],
        ticketed=b["ticketed"],
        ticket_numbers=tuple(b["ticket_numbers"]),
        cancelled_at=b["cancelled_at"],
        cancel_reason=b["cancel_reason"],
    )


async def events(conn: AsyncConnection[Any], locator: str) -> list[SegmentEvent]:
    """Return a booking's status history, oldest first."""
    return await fetch_all(
        conn, Q["segment_events"], {"locator": locator}, row=class_row(SegmentEvent)
    )


async def lock_segment(
    conn: AsyncConnection[Any], locator: str, number: int
) -> LockedSegment | None:
    """Lock a booking and one of its segments until the transaction ends; None if absent."""
    return await fetch_one(
        conn,
        Q["lock_segment"],
        {"locator": locator, "number": number},
        row=class_row(LockedSegment),
    )


async def set_status(
    conn: AsyncConnection[Any],
    locator: str,
    number: int,
    status: str,
    received_at: datetime | None,
) -> None:
    """Set a segment's status; its change time is ``received_at`` (None: database now)."""
    await conn.execute(
        Q["set_segment_status"],
        {"locator": locator, "number": number, "status": status, "received_at": received_at},
    )


async def record_event(
    conn: AsyncConnection[Any],
    *,
    locator: str,
    number: int,
    code: str,
    previous: str,
    result: str,
    outcome: Outcome,
    received_at: datetime | None,
) -> None:
    """Add one entry to a segment's status history (``received_at`` None: database now)."""
    await conn.execute(
        Q["record_event"],
        {
            "locator": locator,
            "number": number,
            "code": code,
            "previous": previous,
            "result": result,
            "outcome": outcome,
            "received_at": received_at,
        },
    )


async def lock_booking(
    conn: AsyncConnection[Any], locator: str, *, at: datetime | None = None
) -> LockedBooking | None:
    """Lock one booking until the transaction ends and return what a cancellation re-checks.

    Args:
        at: the instant "expired" is judged at; None (production) is database now.
    """
    return await fetch_one(
        conn, Q["lock_booking"], {"locator": locator, "at": at}, row=class_row(LockedBooking)
    )


async def withdraw(
    conn: AsyncConnection[Any], locator: str, *, withdrawn: str, dead: Collection[str]
) -> list[Withdrawn]:
    """Set every live segment of a (locked) booking to ``withdrawn`` (XX) and record each in
    its history.

    Live: any status not in ``dead`` (cancelled, refused or superseded: the reservation rules'
    ``codes.DEAD_STATES``).

    Returns:
        The segments withdrawn, by number, with the status each held.
    """
    rows = await fetch_all(
        conn,
        Q["withdraw_segments"],
        {"locator": locator, "withdrawn": withdrawn, "dead": sorted(dead)},
        row=class_row(Withdrawn),
    )
    out = sorted(rows, key=lambda w: w.number)
    if out:
        await conn.execute(
            Q["record_withdrawals"],
            {
                "locator": locator,
                "withdrawn": withdrawn,
                "numbers": [w.number for w in out],
                "previous": [w.previous for w in out],
            },
        )
    return out


async def mark_cancelled(conn: AsyncConnection[Any], locator: str, reason: str) -> bool:
    """Mark a booking cancelled (now, database time); False if it already was."""
    row = await fetch_one(
        conn, Q["mark_cancelled"], {"locator": locator, "reason": reason}, row=dict_row
    )
    return row is not None


async def carrier_destinations(
    conn: AsyncConnection[Any], carriers: Sequence[str]
) -> dict[str, CarrierDestination]:
    """Return the live Destination of each carrier that has one (absent carriers: none)."""
    rows = await fetch_all(
        conn,
        Q["carrier_destinations"],
        {"carriers": list(carriers)},
        row=class_row(CarrierDestination),
    )
    return {r.carrier: r for r in rows}


async def enqueue_cancel_notice(
    conn: AsyncConnection[Any], locator: str, carrier: str
) -> tuple[int, str]:
    """Enqueue the cancellation notice of the cancelled booking ``locator`` to ``carrier`` on
    the live Destination that serves it, built by the database from the booking record
    (``inturn_enqueue_cancel_notice``, migration 0017; the bytes of
    :func:`inturn.worker.reservations.notice.build_notice`), in the caller's transaction, after
    the messages of the channel log accepted for that Destination and not pulled yet (pulled
    first, :func:`inturn.worker.store.actions.pull_all`). The caller wakes the destination's
    worker (:func:`inturn.worker.store.notify.wake`).

    Returns:
        ``(delivery id, destination)``; a notice already enqueued for the booking and carrier
        is returned, never made twice.

    Raises:
        psycopg.errors.NoDataFound: no such booking, or no live Destination serves ``carrier``.
        psycopg.errors.ObjectNotInPrerequisiteState: the booking is not cancelled, or has no
            withdrawn segment of ``carrier``.
        psycopg.errors.InvalidParameterValue: a value of the record is not ASCII letters,
            digits or '-' (a notice cannot carry it).
    """
    serving = await carrier_destinations(conn, [carrier])
    if carrier in serving:
        # the messages of the channel log accepted for it before the notice go first: pulled
        # under its enqueue lock, which the notice's insertion takes again (issue 43)
        await actions.pull_all(conn, serving[carrier].destination)
    row = await fetch_one(
        conn, Q["enqueue_cancel_notice"], {"locator": locator, "carrier": carrier}, row=dict_row
    )
    assert row is not None
    return int(row["id"]), str(row["destination"])
