"""Order expectations (``spec.replies``) in the store: what the sweeper's orders pack writes.

The worker records expectations in its delivered mark (:func:`inturn.worker.store.queue.
succeeded_next`) and ingest answers them in its store statement; the rule's reads are in
``sql/order_rules.sql`` and run from here (the rule is :mod:`inturn.worker.orders.rules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store.queries import fetch_all, load

Q = load("order_rules.sql")

Row = dict[str, Any]


async def mark_raised(conn: AsyncConnection[Any], ids: Sequence[int]) -> None:
    """Record that these expectations were placed on a worklist (in the caller's transaction):
    the due scan skips them from now on."""
    await conn.execute(Q["mark_raised"], {"ids": list(ids)})


async def _rows(
    conn: AsyncConnection[Any], query: LiteralString, params: dict[str, Any]
) -> list[Row]:
    return await fetch_all(conn, query, params, row=dict_row)


async def unanswered_due(conn: AsyncConnection[Any], *, limit: int) -> list[Row]:
    """Expectations whose reply is past due and not yet raised."""
    return await _rows(conn, Q["unanswered_due"], {"limit": limit})


async def unanswered_stale(conn: AsyncConnection[Any], *, limit: int) -> list[Row]:
    """Pending ``unanswered-order`` items whose order was answered (or is gone), with ``why``."""
    return await _rows(conn, Q["unanswered_stale"], {"limit": limit})


async def pending_count(conn: AsyncConnection[Any]) -> int:
    """How many ``unanswered-order`` items are pending."""
    [row] = await _rows(conn, Q["pending_count"], {})
    return int(row["n"])
