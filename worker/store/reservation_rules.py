"""The reservation rules' queries (``sql/reservation_rules.sql``): requests left unanswered and
ticketing deadlines near or past.

Due queries return the most overdue first, at most ``limit`` rows, their due-date conditions in
the SQL; ``at`` is the instant judged at (None: database now). A record that already has an
item for the same trigger is not selected. Rows are dicts read by column name. The rules
themselves are :mod:`inturn.worker.reservations.sweep`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store.queries import fetch_all, load

Q = load("reservation_rules.sql")

Row = dict[str, Any]


async def _rows(
    conn: AsyncConnection[Any], query: LiteralString, params: dict[str, Any]
) -> list[Row]:
    return await fetch_all(conn, query, params, row=dict_row)


async def unanswered_due(
    conn: AsyncConnection[Any], *, pending_after: int, limit: int, at: datetime | None
) -> list[Row]:
    """Segments in a request state (HN, NN, PN) longer than ``pending_after`` seconds."""
    params = {"pending_after": pending_after, "limit": limit, "at": at}
    return await _rows(conn, Q["unanswered_due"], params)


async def unanswered_stale(conn: AsyncConnection[Any]) -> list[str]:
    """Record keys of pending ``unanswered`` items whose segment is no longer waiting."""
    return [r["record_key"] for r in await _rows(conn, Q["unanswered_stale"], {})]


async def ticketing_due(
    conn: AsyncConnection[Any], *, lead: int, limit: int, at: datetime | None
) -> list[Row]:
    """Open, unticketed bookings whose deadline is within ``lead`` seconds and not passed."""
    return await _rows(conn, Q["ticketing_due"], {"lead": lead, "limit": limit, "at": at})


async def ticketing_expired(
    conn: AsyncConnection[Any], *, limit: int, at: datetime | None
) -> list[Row]:
    """Open, unticketed bookings past their deadline."""
    return await _rows(conn, Q["ticketing_expired"], {"limit": limit, "at": at})


async def ticketing_stale(
    conn: AsyncConnection[Any], *, lead: int, at: datetime | None
) -> list[Row]:
    """Pending ticketing items whose condition no longer holds, each with ``reason`` and
    ``why`` (ticketed, cancelled, deadline passed or extended)."""
    return await _rows(conn, Q["ticketing_stale"], {"lead": lead, "at": at})


async def pending_count(conn: AsyncConnection[Any], *, record_kind: str, reason: str) -> int:
    """How many ``reason`` items about ``record_kind`` records are pending."""
    params = {"record_kind": record_kind, "reason": reason}
    [row] = await _rows(conn, Q["pending_count"], params)
    return int(row["n"])
