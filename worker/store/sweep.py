"""The delivery rules' queries (``sql/sweep.sql``): what is stuck, orphaned or expired.

The due queries return the most overdue first, at most ``limit`` rows, with their due-date
conditions in the SQL (database time); the stale queries return the pending worklist items
whose condition no longer holds. Rows are dicts read by column name. The rules themselves
(what to place, what to clear) are :mod:`inturn.worker.worklist.delivery_rules`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store import actions, audit, notify
from inturn.worker.store.queries import fetch_all, load

Q = load("sweep.sql")

Row = dict[str, Any]


async def _rows(
    conn: AsyncConnection[Any], query: LiteralString, params: Mapping[str, Any]
) -> list[Row]:
    return await fetch_all(conn, query, dict(params), row=dict_row)


async def now(conn: AsyncConnection[Any]) -> datetime:
    """The database's clock (the due-date conditions use it)."""
    [row] = await _rows(conn, Q["now"], {})
    return row["now"]  # type: ignore[no-any-return]


async def schedules(conn: AsyncConnection[Any]) -> list[Any]:
    """Every distinct ``spec.schedule`` of a registered destination (JSON documents)."""
    return [r["schedule"] for r in await _rows(conn, Q["schedules"], {})]


async def stuck_due(
    conn: AsyncConnection[Any], *, limit: int, windows: Mapping[str, Any]
) -> list[Row]:
    """Live destinations whose head waited its ``stuckAfterSeconds`` inside its window
    (``windows``: the open schedules and since when, see ``worklist.windows.open_windows``)."""
    return await _rows(conn, Q["stuck_due"], {"limit": limit, **windows})


async def stuck_stale(
    conn: AsyncConnection[Any], *, queue: str, reason: str, limit: int, windows: Mapping[str, Any]
) -> list[Row]:
    """Pending ``reason`` items on ``queue`` whose destination is no longer stuck."""
    params = {"queue": queue, "reason": reason, "limit": limit, **windows}
    return await _rows(conn, Q["stuck_stale"], params)


async def orphaned_due(conn: AsyncConnection[Any], *, limit: int) -> list[Row]:
    """Destinations with pending messages that are not registered (or deleted)."""
    return await _rows(conn, Q["orphaned_due"], {"limit": limit})


async def orphaned_stale(
    conn: AsyncConnection[Any], *, queue: str, reason: str, limit: int
) -> list[Row]:
    """Pending ``reason`` items on ``queue`` whose destination is registered again or empty."""
    return await _rows(
        conn, Q["orphaned_stale"], {"queue": queue, "reason": reason, "limit": limit}
    )


async def expired_due(conn: AsyncConnection[Any], *, limit: int) -> list[Row]:
    """Pending messages older than their destination's ``expireAfterSeconds``, oldest first."""
    return await _rows(conn, Q["expired_due"], {"limit": limit})


async def pending_keys(
    conn: AsyncConnection[Any], *, queue: str, reason: str, record_kind: str, keys: Sequence[str]
) -> set[str]:
    """Which of ``keys`` already have a pending ``reason`` item on ``queue``."""
    params = {
        "queue": queue,
        "reason": reason,
        "record_kind": record_kind,
        "record_keys": list(keys),
    }
    return {r["record_key"] for r in await _rows(conn, Q["pending_keys"], params)}


#: Seconds a message may wait in the channel log, not pulled by a destination, before the
#: sweeper pulls it for that destination (a live worker pulls at every wake-up, within
#: milliseconds; one stopped or missing does not).
PULL_AFTER_SECONDS = 30.0

#: Rows the sweeper pulls for one destination per run, at most (whole batches).
PULL_AT_MOST = 50_000


async def pull_behind(
    conn: AsyncConnection[Any], *, limit: int, after_seconds: float = PULL_AFTER_SECONDS
) -> dict[str, int]:
    """Pull, for each destination (at most ``limit``, oldest first) with a message of its
    channel's log not pulled for ``after_seconds``, what it has not pulled (up to
    :data:`PULL_AT_MOST` rows), one transaction each, and wake its worker: the rules that
    follow (stuck, orphaned, expired) see every message accepted for it as a row. Returns
    ``{destination: rows pulled}``."""
    rows = await _rows(conn, Q["behind"], {"seconds": after_seconds, "limit": limit})
    pulled: dict[str, int] = {}
    for row in rows:
        destination = str(row["destination"])
        async with conn.transaction():
            pulled[destination] = await actions.pull_all(conn, destination, at_most=PULL_AT_MOST)
            await notify.wake(conn, [destination])
    return pulled


async def skip_expired(
    conn: AsyncConnection[Any], ids: Iterable[int], *, who: str, why: str
) -> list[Row]:
    """Skip the still pending messages among ``ids`` as ``who``, in the caller's transaction:
    one audit entry per destination (``skip``, with ``why``), and each destination's worker
    woken at COMMIT so that it moves on to its new head. Returns the skipped rows."""
    skipped = await _rows(conn, Q["expire_skip"], {"ids": list(ids), "who": who})
    by_destination: dict[str, list[int]] = {}
    for row in skipped:
        by_destination.setdefault(row["destination"], []).append(row["id"])
    for destination, done in sorted(by_destination.items()):
        await audit.record(
            conn, who=who, action="skip", destination=destination, ids=sorted(done), why=why
        )
    await notify.wake(conn, by_destination)
    return skipped
