"""The worklist store: place, clear, list, count and show items, and purge cleared ones.

Every function takes an open ``psycopg.AsyncConnection`` and runs in the caller's transaction
when there is one, so a caller can place work atomically with its own writes (the worker marks
a message failed and places it on ``delivery-failed`` in one transaction). On an autocommit
connection a clear (the item and its audit entry) is a transaction of its own, and a placement
is one statement. Publishers are not told here: a caller announces the placements it created
with :func:`inturn.worker.worklist.publish.announce` after its COMMIT has returned.

Rows are read by column name. Times come from the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row

from inturn.worker.errors import Conflict, Invalid, NotFound
from inturn.worker.store import audit
from inturn.worker.store.queries import fetch_all, fetch_one, load
from inturn.worker.store.worklist_model import (
    ITEM_STATES,
    CountRow,
    Page,
    Placement,
    Shown,
    WorklistItem,
    check_clear,
    check_code,
    check_record_key,
    encode_details,
)

Q = load("worklist.sql")

#: Largest page :func:`list_items` returns, whatever the caller asks for.
LIST_LIMIT_MAX = 1000
#: Page size when the caller does not say.
LIST_LIMIT_DEFAULT = 100
#: Rows deleted per purge transaction, at most.
PURGE_BATCH_MAX = 5000
#: How long cleared items are kept before purge deletes them (90 days), seconds.
RETENTION_SECONDS = 90 * 86400
#: Audit action of a clear.
CLEAR_ACTION = "worklist-clear"
#: Who clears items whose condition no longer holds.
SYSTEM = "system"


class ItemNotFound(NotFound):
    """No worklist item has that id."""


class AlreadyCleared(Conflict, ValueError):
    """The item was cleared before (by someone, at some time): clearing it again is refused."""


async def _one(
    conn: AsyncConnection[Any], query: LiteralString, params: dict[str, Any]
) -> WorklistItem | None:
    return await fetch_one(conn, query, params, row=class_row(WorklistItem))


async def _many(
    conn: AsyncConnection[Any],
    query: LiteralString,
    params: dict[str, Any],
    *,
    prepare: bool | None = None,
) -> list[WorklistItem]:
    return await fetch_all(conn, query, params, row=class_row(WorklistItem), prepare=prepare)


async def place(
    conn: AsyncConnection[Any],
    *,
    queue: str,
    record_kind: str,
    record_key: str,
    reason: str,
    details: dict[str, Any] | None = None,
    placed_by: str,
) -> Placement:
    """Put a record on a queue for a reason, unless the same item is already pending.

    Idempotent per (queue, record_kind, record_key, reason) while pending: concurrent
    placements of the same item create exactly one (a partial unique index arbitrates). Runs in
    the caller's transaction when there is one. Announce ``created`` placements after COMMIT.

    Args:
        queue, record_kind, reason: lowercase codes (see :data:`model.CODE`).
        record_key: what the record is called within its kind (1..256 characters).
        details: a small JSON object (at most 4,096 bytes); never a payload.
        placed_by: who or what placed it (``sweeper``, ``worker``, a person).

    Returns:
        The pending item and whether this call created it.

    Raises:
        Invalid: a bad code, key or details (nothing is written).
        psycopg.Error: the database refused; in a caller's transaction, that transaction fails.
    """
    params = {
        "queue": check_code("queue", queue),
        "record_kind": check_code("record kind", record_kind),
        "record_key": check_record_key(record_key),
        "reason": check_code("reason", reason),
        "details": encode_details(details or {}),
        "placed_by": placed_by,
    }
    # No savepoint is needed: a conflict is not an error, it returns no row. The item found in
    # conflict can be cleared before the SELECT reads it; then place again.
    while True:
        created = await _one(conn, Q["place"], params)
        if created is not None:
            return Placement(created, True)
        existing = await _one(conn, Q["pending_one"], params)
        if existing is not None:
            return Placement(existing, False)


@dataclass(frozen=True)
class NewPlacement:
    """One item for :func:`place_many`: the arguments of :func:`place`."""

    queue: str
    record_kind: str
    record_key: str
    reason: str
    placed_by: str
    details: dict[str, Any] = field(default_factory=dict)


async def place_many(conn: AsyncConnection[Any], items: Sequence[NewPlacement]) -> list[Placement]:
    """:func:`place` for many items in one statement (a sweep placing thousands).

    Same idempotency and the same transaction rules as :func:`place`. The same item twice in
    ``items`` is placed once (both report the one item; the first ``created`` if new).

    Returns:
        One placement per item, in the order given.

    Raises:
        Invalid: a bad code, key or details in any item (nothing is written).
    """
    if not items:
        return []
    for i in items:
        check_code("queue", i.queue)
        check_code("record kind", i.record_kind)
        check_record_key(i.record_key)
        check_code("reason", i.reason)
    params = {
        "queues": [i.queue for i in items],
        "record_kinds": [i.record_kind for i in items],
        "record_keys": [i.record_key for i in items],
        "reasons": [i.reason for i in items],
        "details": [encode_details(i.details) for i in items],
        "placed_by": [i.placed_by for i in items],
    }

    def key(i: WorklistItem | NewPlacement) -> tuple[str, str, str, str]:
        return (i.queue, i.record_kind, i.record_key, i.reason)

    created = {key(i): i for i in await _many(conn, Q["place_many"], params)}
    missing = [i for i in items if key(i) not in created]
    existing: dict[tuple[str, str, str, str], WorklistItem] = {}
    if missing:
        found = await _many(conn, Q["pending_many"], params)
        existing = {key(i): i for i in found}
    out: list[Placement] = []
    announced: set[tuple[str, str, str, str]] = set()
    for i in items:
        k = key(i)
        if k in created and k not in announced:
            announced.add(k)
            out.append(Placement(created[k], True))
        elif k in created:
            out.append(Placement(created[k], False))
        elif k in existing:
            out.append(Placement(existing[k], False))
        else:  # cleared between the two statements: place it on its own
            out.append(await place(conn, **asdict(i)))
    return out


async def get(conn: AsyncConnection[Any], item_id: int) -> WorklistItem | None:
    """One item by id, or None."""
    return await _one(conn, Q["get"], {"id": item_id})


async def clear(conn: AsyncConnection[Any], item_id: int, *, who: str, note: str) -> WorklistItem:
    """Clear one pending item: who cleared it, when (database time) and why. Audited.

    Runs in the caller's transaction when there is one.

    Returns:
        The item as cleared.

    Raises:
        Invalid: ``who`` or ``note`` blank.
        ItemNotFound: no item has this id.
        AlreadyCleared: it was cleared before; the message says by whom and when.
    """
    check_clear(who, note)
    async with conn.transaction():
        item = await _one(conn, Q["clear"], {"id": item_id, "who": who, "note": note})
        if item is None:
            before = await get(conn, item_id)
            if before is None:
                raise ItemNotFound(f"no worklist item {item_id}")
            when = before.cleared_at.isoformat() if before.cleared_at else "?"
            raise AlreadyCleared(
                f"worklist item {item_id} was already cleared by {before.cleared_by} at {when}"
            )
        await _audit(conn, who, [item], note)
    return item


async def clear_where(
    conn: AsyncConnection[Any],
    *,
    record_kind: str,
    record_keys: Sequence[str],
    who: str = SYSTEM,
    note: str,
    queue: str | None = None,
    reason: str | None = None,
) -> list[WorklistItem]:
    """Clear the pending items of some records (optionally only one queue or reason). Audited.

    For system clears: a condition that no longer holds (the stuck destination drained), a
    booking that was cancelled. Runs in the caller's transaction when there is one.

    Returns:
        The items cleared (none is not an error).

    Raises:
        Invalid: ``who`` or ``note`` blank.
    """
    check_clear(who, note)
    if not record_keys:
        return []
    async with conn.transaction():
        items = await _many(
            conn,
            Q["clear_where"],
            {
                "record_kind": record_kind,
                "record_keys": list(record_keys),
                "queue": queue,
                "reason": reason,
                "who": who,
                "note": note,
            },
        )
        if items:
            await _audit(conn, who, items, note)
    return items


async def _audit(
    conn: AsyncConnection[Any], who: str, items: Sequence[WorklistItem], note: str
) -> None:
    destinations = {i.record_key for i in items if i.record_kind == "destination"}
    await audit.record(
        conn,
        who=who,
        action=CLEAR_ACTION,
        destination=destinations.pop() if len(destinations) == 1 else None,
        ids=sorted(i.id for i in items),
        why=note,
    )


async def list_items(
    conn: AsyncConnection[Any],
    *,
    queue: str | None = None,
    reason: str | None = None,
    state: str | None = "pending",
    record_kind: str | None = None,
    record_key: str | None = None,
    placed_from: datetime | None = None,
    placed_to: datetime | None = None,
    newest_first: bool = False,
    limit: int = LIST_LIMIT_DEFAULT,
    cursor: int | None = None,
) -> Page:
    """One page of items matching every filter given, in placement order.

    Args:
        state: ``pending`` (default), ``cleared``, or None for both.
        placed_from, placed_to: placed at or after ``placed_from`` and before ``placed_to``.
        newest_first: newest placements first (default oldest first: the longest waiting).
        limit: page size, 1..1,000 (larger asks are capped at 1,000).
        cursor: ``next_cursor`` of the previous page; None for the first page.

    Returns:
        The page; its ``next_cursor`` is None when nothing follows.

    Raises:
        Invalid: unknown state, or a limit below 1.
    """
    if state is not None and state not in ITEM_STATES:
        raise Invalid(f"unknown state {state!r}; expected one of {', '.join(ITEM_STATES)}")
    if limit < 1:
        raise Invalid("limit must be at least 1")
    limit = min(limit, LIST_LIMIT_MAX)
    params = {
        "queue": queue,
        "reason": reason,
        "state": state,
        "record_kind": record_kind,
        "record_key": record_key,
        "placed_from": placed_from,
        "placed_to": placed_to,
        "cursor": cursor,
        "limit": limit + 1,
    }
    # Optional filters: planned with the values given each time (see fetch_one's prepare).
    query = Q["list_newest" if newest_first else "list_oldest"]
    items = await _many(conn, query, params, prepare=False)
    if len(items) > limit:
        items = items[:limit]
        return Page(items, items[-1].id)
    return Page(items, None)


async def count(
    conn: AsyncConnection[Any], *, state: str = "pending", queue: str | None = None
) -> list[CountRow]:
    """Items per queue and reason in ``state`` (default pending), sorted by queue and reason.

    Raises:
        Invalid: unknown state.
    """
    if state not in ITEM_STATES:
        raise Invalid(f"unknown state {state!r}; expected one of {', '.join(ITEM_STATES)}")
    return await fetch_all(
        conn, Q["count"], {"state": state, "queue": queue}, row=class_row(CountRow)
    )


async def show(conn: AsyncConnection[Any], item_id: int) -> Shown:
    """One item with its record's history (every item for the same record, oldest first).

    Raises:
        ItemNotFound: no item has this id.
    """
    item = await get(conn, item_id)
    if item is None:
        raise ItemNotFound(f"no worklist item {item_id}")
    history = await _many(
        conn,
        Q["record_history"],
        {"record_kind": item.record_kind, "record_key": item.record_key},
    )
    return Shown(item, history)


async def purge(
    conn: AsyncConnection[Any],
    older_than_seconds: float = RETENTION_SECONDS,
    *,
    batch: int = PURGE_BATCH_MAX,
) -> int:
    """Delete items cleared more than ``older_than_seconds`` ago (database time), ``batch``
    rows per transaction, oldest first.

    Pending items are never deleted, whatever their age. Safe to run concurrently with another
    purge (both delete the same rows; each is counted once).

    Returns:
        The number of items deleted.

    Raises:
        Invalid: ``batch`` outside 1..5,000.
    """
    if not 1 <= batch <= PURGE_BATCH_MAX:
        raise Invalid(f"batch must be 1..{PURGE_BATCH_MAX}, got {batch}")
    deleted = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                Q["purge_batch"], {"older_than_seconds": older_than_seconds, "batch": batch}
            )
        deleted += cur.rowcount
        if cur.rowcount < batch:
            return deleted


async def purge_count(conn: AsyncConnection[Any], older_than_seconds: float) -> int:
    """How many items :func:`purge` would delete with ``older_than_seconds``, deleting nothing."""
    row = await fetch_one(
        conn, Q["purge_count"], {"older_than_seconds": older_than_seconds}, row=dict_row
    )
    return int(row["n"]) if row else 0


async def announce(conn: AsyncConnection[Any], channel: str, payload: str) -> None:
    """NOTIFY ``payload`` (a new item's JSON, never a message payload) on ``channel``; on an
    autocommit connection it is delivered at once."""
    await conn.execute(Q["announce"], {"channel": channel, "payload": payload})


async def now(conn: AsyncConnection[Any]) -> datetime:
    """The database's clock (what placement and clear times are in)."""
    cur = await conn.execute(Q["now"])
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]
