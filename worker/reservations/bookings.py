"""The bookings Python API: import, show, and apply a partner's status to a segment.

Each function takes an open async connection (autocommit or not) and runs its writes in one
transaction of its own (a savepoint when the caller already has one open).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.reservations.records import Booking, BookingFileError, parse_bookings
from inturn.worker.store import bookings as store
from inturn.worker.store.bookings import SegmentEvent


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
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BookingFileError([f"byte {exc.start}: not UTF-8 text"]) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BookingFileError([f"line {exc.lineno} column {exc.colno}: {exc.msg}"]) from None
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
