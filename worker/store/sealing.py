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

from inturn.worker.errors import Invalid
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


async def plaintext_log_batch(
    conn: AsyncConnection[Any], *, after: int, limit: int
) -> list[tuple[int, str, bytes]]:
    """Up to ``limit`` messages of the channel log in clear with an id above ``after``:
    ``(log id, "channel:<name>", payload)``, the binding each is sealed under."""
    params = {"after": after, "limit": limit}
    rows = await fetch_all(conn, Q["plaintext_batch_message"], params, row=dict_row)
    return [(int(r["id"]), str(r["destination"]), bytes(r["payload"])) for r in rows]


async def seal_log_rows(conn: AsyncConnection[Any], rows: Sequence[tuple[int, bytes, str]]) -> int:
    """:func:`seal_rows` for the channel log: each ``(log id, envelope, keys)``, skipping
    messages sealed meanwhile (or erased); how many were sealed by this call."""
    params = {
        "ids": [r[0] for r in rows],
        "payloads": [r[1] for r in rows],
        "keys": [r[2] for r in rows],
    }
    cur = await conn.execute(Q["seal_rows_message"], params)
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


#: The tables ``inturn keys rotate-index`` re-indexes, in order (the log before the slim rows
#: that copy its keys).
INDEXED_TABLES = ("delivery", "history", "message")
QUERIES_BY_TABLE = {
    "delivery": Q["index_batch_delivery"],
    "history": Q["index_batch_history"],
    "message": Q["index_batch_message"],
}


async def index_batch(
    conn: AsyncConnection[Any], table: str, *, after: int, limit: int
) -> list[tuple[int, int, str, bytes, str]]:
    """Rows of ``table`` (one of :data:`INDEXED_TABLES`) whose payload is an envelope of their
    own, by id after ``after``: ``(id, seal id, seal scope, envelope, keys)``, at most
    ``limit``.

    Raises:
        Invalid: an unknown table.
    """
    if table not in INDEXED_TABLES:
        raise Invalid(f"not an indexed table: {table!r}")
    rows = await fetch_all(
        conn, QUERIES_BY_TABLE[table], {"after": after, "limit": limit}, row=dict_row
    )
    return [
        (
            int(r["id"]),
            int(r["seal_id"]),
            str(r["seal_scope"]),
            bytes(r["payload"]),
            r["keys"] or "",
        )
        for r in rows
    ]


async def set_table_keys(
    conn: AsyncConnection[Any], table: str, rows: Sequence[tuple[int, str]]
) -> int:
    """Set ``patient_keys`` of ``(id, comma-separated keys)`` rows of ``table``; the count.

    Raises:
        Invalid: an unknown table.
    """
    if table == "delivery":
        return await set_keys(conn, rows)
    if table not in INDEXED_TABLES:
        raise Invalid(f"not an indexed table: {table!r}")
    if not rows:
        return 0
    params = {"ids": [r[0] for r in rows], "keys": [r[1] for r in rows]}
    cur = await conn.execute(
        Q["set_keys_history" if table == "history" else "set_keys_message"], params
    )
    return max(cur.rowcount, 0)


async def copy_slim_keys(conn: AsyncConnection[Any]) -> int:
    """Slim rows take their log row's index keys; how many changed."""
    row = await fetch_one(conn, Q["slim_keys"], row=dict_row)
    return int(row["changed"]) if row else 0


async def open_orders_before(conn: AsyncConnection[Any], settled: str) -> int:
    """Expected order replies still open that were recorded before ``settled``."""
    row = await fetch_one(conn, Q["open_orders_before"], {"settled": settled}, row=dict_row)
    return int(row["open"]) if row else 0
