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

from inturn.worker.store import actions, audit, notify
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("restore.sql")


@dataclass(frozen=True)
class Seen:
    """What a destination's rows say now (None: it has none).

    Attributes:
        delivered_through, delivered_at: its last delivered row's id (but below its first
            waiting row: lanes deliver out of order) and that row's finish time.
        accepted_through, accepted_at: its last row's id and enqueue time.
        delivered_message: the same bound as ``delivered_through`` in the channel log's ids,
            over its slim rows in the hot table (None: it has none there).
        channel_through, channel_at: its channel log's last message (any route) and when it
            was accepted (None: the log has none).
    """

    delivered_through: int | None
    delivered_at: datetime | None
    accepted_through: int | None
    accepted_at: datetime | None
    delivered_message: int | None = None
    channel_through: int | None = None
    channel_at: datetime | None = None


@dataclass(frozen=True)
class RestoreFinding:
    """A restore the operator found for one destination, kept in the restored database until a
    person decides (``inturn_restore``, migration 0042): the bounds ``mark-delivered`` uses.

    Attributes:
        tick: the tick the witness had recorded.
        delivered_through: the last delivered row's id the witness saw (rows that carry their
            own payload keep their ids across a restore).
        delivered_message: the same in the channel log's ids (slim rows get new ids when
            pulled again after a restore; their log message keeps its id).
        delivered_at: when that last delivery was made: a message accepted later was accepted
            after the restore, whatever id it was given.
        accepted_through, channel_through: the last row's id and the channel log's last id the
            witness saw (None: not recorded): :func:`record_finding` moves the id sequences past
            them, so no message accepted from then on takes a lost message's id.
    """

    tick: int
    delivered_through: int | None
    delivered_message: int | None
    delivered_at: datetime | None
    accepted_through: int | None = None
    channel_through: int | None = None


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


async def database_id(conn: AsyncConnection[Any]) -> str | None:
    """The database's identity (migration 0055), a UUID as text: the same in a database
    restored from its backups, new in one made anew; None before its clock exists."""
    row = await fetch_one(conn, Q["database_id"], row=dict_row)
    return str(row["database_id"]) if row else None


async def witness(conn: AsyncConnection[Any]) -> dict[str, Seen]:
    """Per live destination, its last delivered row and its last row (hot table or history)."""
    return {
        str(r["destination"]): Seen(
            r["delivered_through"],
            r["delivered_at"],
            r["accepted_through"],
            r["accepted_at"],
            r["delivered_message"],
            r["channel_through"],
            r["channel_at"],
        )
        for r in await fetch_all(conn, Q["witness"], row=dict_row)
    }


async def exposure(conn: AsyncConnection[Any], destination: str) -> int:
    """Messages of ``destination`` delivered before a restore and waiting again (they would be
    sent twice), within its recorded finding (:func:`record_finding`): its pending rows and
    the channel log's rows it has not pulled again yet. 0 without a finding."""
    params = {"destination": destination, "through": None}
    row = await fetch_one(conn, Q["exposure"], params, row=dict_row)
    return int(row["again"]) if row else 0


async def kept(
    conn: AsyncConnection[Any], destination: str, before: datetime
) -> tuple[int | None, datetime | None]:
    """After a restore: the last message of ``destination``'s channel log accepted no later
    than ``before`` (the last one the witness saw), ``(log id, accepted at)``; ``(None, None)``
    when the restored log holds none. A lower id than the witness's: the messages between were
    lost."""
    row = await fetch_one(
        conn, Q["kept"], {"destination": destination, "before": before}, row=dict_row
    )
    return (int(row["id"]), row["enqueued_at"]) if row else (None, None)


async def record_finding(
    conn: AsyncConnection[Any], destination: str, finding: RestoreFinding
) -> None:
    """Keep the operator's finding for ``destination`` in the restored database (one row,
    replaced by a later finding) until :func:`forget_finding`, and move the id sequences past
    the largest ids the finding's witness saw (``inturn_ids_past``, migration 0050; only
    forward): the restore took them back, and the messages accepted after it would take the
    lost messages' ids again. Those accepted between the restore and this finding keep the ids
    they were given (``delivered_at`` tells them apart).

    Raises:
        psycopg.Error: the database failed (the finding is not kept; the caller looks again).
    """
    params = {
        "destination": destination,
        "tick": finding.tick,
        "delivered_through": finding.delivered_through,
        "delivered_message": finding.delivered_message,
        "delivered_at": finding.delivered_at,
    }
    await conn.execute(Q["record_finding"], params)
    delivery_id = _largest(finding.delivered_through, finding.accepted_through)
    message_id = _largest(finding.delivered_message, finding.channel_through)
    if delivery_id is None and message_id is None:
        return
    try:
        async with conn.transaction():  # a savepoint: a database before 0050 goes on without
            await conn.execute(Q["ids_past"], {"delivery": delivery_id, "message": message_id})
    except psycopg.errors.UndefinedFunction:
        pass  # an upgrade in place whose migrations have not reached 0050 yet


def _largest(*ids: int | None) -> int | None:
    known = [i for i in ids if i is not None]
    return max(known) if known else None


async def forget_finding(conn: AsyncConnection[Any], destination: str) -> None:
    """Remove ``destination``'s finding (the restore was decided)."""
    await conn.execute(Q["forget_finding"], {"destination": destination})


async def finding(conn: AsyncConnection[Any], destination: str) -> RestoreFinding | None:
    """``destination``'s recorded finding, or None."""
    row = await fetch_one(conn, Q["finding"], {"destination": destination}, row=dict_row)
    if row is None:
        return None
    return RestoreFinding(
        int(row["tick"]), row["delivered_through"], row["delivered_message"], row["delivered_at"]
    )


async def mark_delivered(
    conn: AsyncConnection[Any],
    destination: str,
    through: int | None,
    *,
    who: str,
    why: str | None = None,
) -> Sequence[int]:
    """Mark pending rows of ``destination`` delivered (they were delivered before the database
    was restored); audited (``mark-delivered``) with the ids, the worker woken.

    Which: with ``through``, the rows with an id up to it (as the restored database lists
    them); without, the recorded finding's bounds (rows carrying their own payload by id, slim
    rows by their log message). Whenever a finding is recorded, only messages accepted no later
    than the last delivery it saw: a message accepted after the restore may have been given an
    id used before it (the restore took the sequences back too), and is never marked. The
    channel log's rows not pulled yet are pulled first (:func:`actions.pull_all`), in the same
    transaction. Returns the ids (empty: none, or neither ``through`` nor a finding).
    """
    async with conn.transaction():
        await actions.pull_all(conn, destination)
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
