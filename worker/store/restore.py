"""A database that went back in time (issue 39, part 1; docs/howto/backups.md).

The queue database carries a clock (``inturn_clock``, migration 0039) that the operator moves
on once a minute and records, with what each destination had accepted and delivered, in the
Destination's status, outside the database. A restore (a dump, a base backup, point-in-time
recovery, a failover to a replica that had not received the last ticks) brings back an older
tick: the operator then says, per destination, how many messages may be sent twice and from
when, what was lost, and holds delivery until a person decides (``spec.afterRestore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store import audit, notify
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("restore.sql")


@dataclass(frozen=True)
class Seen:
    """What a destination's rows say now (None: it has none).

    Attributes:
        delivered_through, delivered_at: its last delivered row's id and finish time.
        accepted_through, accepted_at: its last row's id and enqueue time.
    """

    delivered_through: int | None
    delivered_at: datetime | None
    accepted_through: int | None
    accepted_at: datetime | None


async def tick(conn: AsyncConnection[Any]) -> tuple[int, int]:
    """Move the database's clock on: ``(the tick it held, the tick it holds now)``."""
    row = await fetch_one(conn, Q["tick"], row=dict_row)
    assert row is not None  # migration 0039 made its one row
    return int(row["before"]), int(row["now"])


async def clock(conn: AsyncConnection[Any]) -> int:
    """The database's tick now; 0 when it has no clock yet (a schema before migration 0039,
    while an upgrade's migrations run beside the new workers: nothing to compare with)."""
    try:
        row = await fetch_one(conn, Q["clock"], row=dict_row)
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row["tick"]) if row else 0


async def witness(conn: AsyncConnection[Any]) -> dict[str, Seen]:
    """Per live destination, its last delivered row and its last row (hot table or history)."""
    return {
        str(r["destination"]): Seen(
            r["delivered_through"], r["delivered_at"], r["accepted_through"], r["accepted_at"]
        )
        for r in await fetch_all(conn, Q["witness"], row=dict_row)
    }


async def exposure(conn: AsyncConnection[Any], destination: str, through: int) -> int:
    """Pending rows of ``destination`` with an id up to ``through``: delivered before a
    restore brought them back, they would be sent twice."""
    params = {"destination": destination, "through": through}
    row = await fetch_one(conn, Q["exposure"], params, row=dict_row)
    return int(row["again"]) if row else 0


async def mark_delivered(
    conn: AsyncConnection[Any],
    destination: str,
    through: int,
    *,
    who: str,
    why: str | None = None,
) -> Sequence[int]:
    """Mark ``destination``'s pending rows with an id up to ``through`` delivered (they were
    delivered before the database was restored); audited (``mark-delivered``) with the ids.
    The worker is woken. Returns the ids."""
    async with conn.transaction():
        params = {"destination": destination, "through": through, "who": who}
        ids = sorted(
            int(r["id"]) for r in await fetch_all(conn, Q["mark_delivered"], params, row=dict_row)
        )
        if ids:
            await audit.record(
                conn, who=who, action="mark-delivered", destination=destination, ids=ids, why=why
            )
            await notify.wake(conn, [destination])
    return ids
