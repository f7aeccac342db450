"""The bookings Python API: import, show, and apply a partner's status to a segment.

Each function takes an open async connection (autocommit or not) and runs its writes in one
transaction of its own (a savepoint when the caller already has one open).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from psycopg import AsyncConnection

from inturn.worker.errors import NotFound
from inturn.worker.reservations.codes import (
    CANCELLED_STATES,
    SEGMENT_KIND,
    fold,
    for_status,
    is_status_code,
    office_queue,
    segment_key,
)
from inturn.worker.reservations.records import Booking, BookingFileError, parse_bookings
from inturn.worker.spec.documents import MAX_DOCUMENT_BYTES, DocumentError, load_json
from inturn.worker.store import bookings as store
from inturn.worker.store.bookings import SegmentEvent
from inturn.worker.worklist import Placement, WorklistItem, clear_where, place


@dataclass(frozen=True)
class ImportSummary:
    """What an import did: how many bookings were new, changed, or already so."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0

    def __str__(self) -> str:
        total = self.created + self.updated + self.unchanged
        return (
            f"{total} booking{'s' if total != 1 else ''}: {self.created} new,"
            f" {self.updated} updated, {self.unchanged} unchanged"
        )


def read_file(path: str | Path) -> list[Booking]:
    """Read and check an import file (a JSON list of bookings).

    Raises:
        BookingFileError: not JSON, or an entry is malformed (index and field in the message).
        OSError: the file cannot be read.
    """
    with Path(path).open("rb") as f:
        data = f.read(MAX_DOCUMENT_BYTES + 1)
    try:  # bounded: bytes, depth, values, each member once
        doc = load_json(data)
    except DocumentError as exc:
        raise BookingFileError([str(exc)]) from None
    return parse_bookings(doc)


async def import_bookings(conn: AsyncConnection[Any], entries: Sequence[Booking]) -> ImportSummary:
    """Write bookings in one transaction: all of them or, on error, none.

    Importing a locator again updates it to what the entry says (idempotent: the same entry
    twice changes nothing the second time).

    Raises:
        psycopg.Error: the database failed; nothing was written.
    """
    counts = {"created": 0, "updated": 0, "unchanged": 0}
    async with conn.transaction():
        for booking in entries:
            counts[await store.upsert(conn, booking)] += 1
    return ImportSummary(**counts)


async def import_document(conn: AsyncConnection[Any], doc: Any) -> ImportSummary:
    """Check a parsed import file (see :func:`~inturn.worker.reservations.records.parse_bookings`)
    and write it in one transaction.

    Raises:
        BookingFileError: an entry is malformed; nothing of the file is written.
        psycopg.Error: the database failed; nothing was written.
    """
    return await import_bookings(conn, parse_bookings(doc))


async def show(
    conn: AsyncConnection[Any], locator: str
) -> tuple[Booking, list[SegmentEvent]] | None:
    """Return a booking and its status history (oldest first), or None if unknown."""
    booking = await store.get(conn, locator)
    if booking is None:
        return None
    return booking, await store.events(conn, locator)


class SegmentNotFound(NotFound):
    """No such booking, or no segment of that number in it."""


@dataclass(frozen=True)
class Applied:
    """What :func:`apply_status` did.

    Attributes:
        outcome: ``applied``, or ``late`` when the segment (or its booking) was already
            cancelled: the code is recorded in the history and raised, the segment unchanged.
        previous, status: the segment's status before and after (equal when late).
        placement: the worklist item the code caused (``late-reply`` when late), or None.
        answered: the ``unanswered`` items this reply cleared.
    """

    locator: str
    segment: int
    code: str
    outcome: Literal["applied", "late"]
    previous: str
    status: str
    placement: Placement | None = None
    answered: list[WorklistItem] = field(default_factory=list)


async def apply_status(
    conn: AsyncConnection[Any],
    locator: str,
    segment: int,
    code: str,
    received_at: datetime | None = None,
    *,
    placed_by: str = "bookings",
) -> Applied:
    """Apply a partner's reply (or schedule change) to a segment, in one transaction with the
    worklist placement it causes.

    The booking and segment rows are locked; the code is recorded in the segment's history;
    the segment takes the holding code the reply folds into (:func:`~.codes.fold`: KK to HK,
    US to HL...; refusals keep their code); :func:`~.codes.for_status` of the code as received
    decides the item placed on the owner's queue (``confirmed``, ``refused``, ``waitlisted``,
    ``schedule-change``, ``review``) for the record ``segment`` ``<locator>/<number>``. A
    pending ``unanswered`` item of the segment is cleared by ``system`` with the note
    "answered". A reply for a segment already cancelled (XX, XK, XL, or a cancelled booking)
    is recorded and placed as ``late-reply``, and never resurrects the segment.

    Announce ``placement`` (if created) after this returns: it has committed then.

    Args:
        code: the two-character AIRIMP code as received (upper case).
        received_at: when the partner's message arrived (aware); None is database now.
        placed_by: who applies it, recorded on the item.

    Raises:
        ValueError: ``code`` is not two upper-case letters or digits.
        SegmentNotFound: no such booking or segment.
        psycopg.Error: the database failed; nothing changed.
    """
    if not is_status_code(code):
        raise ValueError(f"{code!r} is not a status code (two upper-case letters or digits)")
    key = segment_key(locator, segment)
    async with conn.transaction():
        locked = await store.lock_segment(conn, locator, segment)
        if locked is None:
            if await store.get(conn, locator) is None:
                raise SegmentNotFound(f"no booking {locator}")
            raise SegmentNotFound(f"no segment {segment} in booking {locator}")
        late = locked.cancelled_at is not None or locked.status in CANCELLED_STATES
        status = locked.status if late else fold(code)
        outcome: Literal["applied", "late"] = "late" if late else "applied"
        if not late:
            await store.set_status(conn, locator, segment, status, received_at)
        await store.record_event(
            conn,
            locator=locator,
            number=segment,
            code=code,
            previous=locked.status,
            result=status,
            outcome=outcome,
            received_at=received_at,
        )
        reason = "late-reply" if late else None
        if not late:
            attention = for_status(code, locked.owner)
            reason = attention.reason if attention is not None else None
        placement = None
        if reason is not None:
            placement = await place(
                conn,
                queue=office_queue(locked.owner),
                record_kind=SEGMENT_KIND,
                record_key=key,
                reason=reason,
                details={
                    "code": code,
                    "previous": locked.status,
                    "status": status,
                    "carrier": locked.carrier,
                },
                placed_by=placed_by,
            )
        answered = await clear_where(
            conn, record_kind=SEGMENT_KIND, record_keys=[key], reason="unanswered", note="answered"
        )
    return Applied(locator, segment, code, outcome, locked.status, status, placement, answered)
