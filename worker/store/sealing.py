"""Rows stored in clear before payload keys were given, and their sealing (``sql/sealing.sql``).

The store reads and writes bytes: the caller (``inturn keys encrypt-existing``,
:func:`inturn.worker.operations.payload_keys.encrypt_existing`) opens and seals with the codec.
A row's payload is changed only here, once, from clear to its envelope: the statements skip a
row another run sealed first, so two runs, or a run beside ingest and workers, never seal twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("sealing.sql")

#: Seconds between two looks of ingest (with payload keys) at whether pending rows in clear
#: remain, and so whether it writes both index forms or the blind one alone.
INDEX_FORM_EVERY_SECONDS = 5.0


async def plaintext_batch(
    conn: AsyncConnection[Any], *, after: int, limit: int
) -> list[tuple[int, str, bytes]]:
    """Up to ``limit`` rows in clear with an id above ``after``: ``(id, destination, payload)``."""
    rows = await fetch_all(
        conn, Q["plaintext_batch"], {"after": after, "limit": limit}, row=dict_row
    )
    return [(int(r["id"]), str(r["destination"]), bytes(r["payload"])) for r in rows]


async def seal_rows(conn: AsyncConnection[Any], rows: Sequence[tuple[int, bytes, str]]) -> int:
    """Store each ``(id, envelope, index keys comma-separated)``, skipping rows sealed
    meanwhile (or erased); returns how many were sealed by this call."""
    params = {
        "ids": [r[0] for r in rows],
        "payloads": [r[1] for r in rows],
        "keys": [r[2] for r in rows],
    }
    cur = await conn.execute(Q["seal_rows"], params)
    return max(cur.rowcount, 0)


async def sealed_batch(
    conn: AsyncConnection[Any], *, after: int, limit: int
) -> list[tuple[int, str, bytes, str]]:
    """Up to ``limit`` sealed rows above ``after``: ``(id, destination, envelope, keys)``."""
    rows = await fetch_all(conn, Q["sealed_batch"], {"after": after, "limit": limit}, row=dict_row)
    return [
        (int(r["id"]), str(r["destination"]), bytes(r["payload"]), str(r["keys"] or ""))
        for r in rows
    ]


async def set_keys(conn: AsyncConnection[Any], rows: Sequence[tuple[int, str]]) -> int:
    """Replace the index keys of each ``(id, keys comma-separated)``; returns the count."""
    cur = await conn.execute(
        Q["set_keys"], {"ids": [r[0] for r in rows], "keys": [r[1] for r in rows]}
    )
    return max(cur.rowcount, 0)


async def plaintext_pending(conn: AsyncConnection[Any]) -> bool:
    """Whether a pending row still holds its payload in clear (and its plain index keys)."""
    row = await fetch_one(conn, Q["plaintext_pending"], row=dict_row)
    return bool(row and row["found"])


async def mark_in_use(conn: AsyncConnection[Any]) -> None:
    """Record that this database holds sealed payloads (``inturn_payload_keys``, migration
    0021): done once by every process that seals (ingest with payload keys, ``inturn keys
    encrypt-existing``) before it seals anything; idempotent.

    Raises:
        psycopg.Error: e.g. the role lacks INSERT on the table (``inturn migrate
            --create-roles`` grants it to ingest and admin).
    """
    await conn.execute(Q["mark_in_use"])


async def in_use(conn: AsyncConnection[Any]) -> bool:
    """Whether payloads were ever sealed in this database (then patient lookups need the blind
    index, and so the payload keys). One index probe of a table of at most one row."""
    row = await fetch_one(conn, Q["in_use"], row=dict_row)
    return bool(row and row["found"])
