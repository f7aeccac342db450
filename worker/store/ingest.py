"""Ingest's statements (``sql/ingest.sql``): the routing table, the one statement that stores
a transaction's messages, and the duplicate window's purge.

Ingest (:mod:`inturn.worker.ingest`) prepares the parameters and reads the results; the SQL
runs here. Rows are dicts read by column name.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper

from inturn.worker.store.queries import fetch_all, load

Q = load("ingest.sql")


async def routes(conn: AsyncConnection[Any]) -> list[dict[str, Any]]:
    """Every live destination with its channel, message-type filter and sender kind."""
    return await fetch_all(conn, Q["routes"], row=dict_row)


async def store_messages(conn: AsyncConnection[Any], params: dict[str, Any]) -> dict[str, Any]:
    """Run the store statement (see ``sql/ingest.sql``, ``store``) with ``params`` and return
    its one row: ``fresh`` (1-based positions stored), ``ids``, ``reused`` (positions whose
    control ID was seen with another payload). Arrays are sent in binary (the text form would
    hex-escape every payload in Python)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(Q["store"], params)
        row = await cur.fetchone()
    assert row is not None
    return row


async def forget_old(conn: AsyncConnection[Any], window_seconds: float, batch: int) -> int:
    """Delete at most ``batch`` duplicate-window rows older than ``window_seconds``; return how
    many (rows locked by another purge are skipped)."""
    cur = await conn.execute(
        Q["forget_old"], {"window_seconds": float(window_seconds), "batch": batch}
    )
    return max(cur.rowcount, 0)
