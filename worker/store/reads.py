"""Reads of the delivery queue: listings, one item, its attempts, a payload view, depth, heads and
the audit trail.

Listings never carry payloads; :func:`view_payload` is the one audited way to read one. Each
function takes an open ``psycopg.AsyncConnection`` (a read pool's, for the console and the CLI);
statements are named queries of ``sql/queue.sql``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypedDict, Unpack

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row

from inturn.worker.errors import Invalid
from inturn.worker.store import audit
from inturn.worker.store.model import (
    STATES,
    Attempt,
    DepthRow,
    HeadInfo,
    Item,
    Pending,
    ScannedPayload,
)
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("queue.sql")

#: Largest page :func:`list_items` returns, whatever the caller asks for.
LIST_LIMIT_MAX = 1000
#: Page size when the caller does not say.
LIST_LIMIT_DEFAULT = 100


async def scan_payloads(
    conn: AsyncConnection[Any], *, batch: int = 500
) -> AsyncIterator[ScannedPayload]:
    """Yield every held item with its payload, in id order, reading ``batch`` rows at a time,
    then each message of the channel log some destination has not pulled yet (as
    :func:`get_item` shows it: minus its log id), in log order.

    For finding a data subject's messages, which have no index: the queue is short-lived, so
    reading it whole is acceptable. Uses keyset pagination, so no transaction stays open.
    """
    last = 0
    while True:
        params = {"after": last, "batch": batch}
        rows = await fetch_all(conn, Q["scan_payloads"], params, row=class_row(ScannedPayload))
        for held in rows:
            yield held
        if len(rows) < batch:
            break
        last = rows[-1].id
    # the channel log's messages some destination has not pulled yet (minus their log id)
    last = 0
    while True:
        params = {"after": last, "batch": batch}
        found = await fetch_all(conn, Q["scan_log_payloads"], params, row=dict_row)
        for r in found:
            yield ScannedPayload(
                int(r["id"]),
                str(r["destination"]),
                str(r["channel"]),
                "pending",
                str(r["message_type"]),
                bytes(r["payload"]),
                int(r["seal_id"]),
                str(r["seal_scope"]),
            )
        if len(found) < batch:
            return
        last = int(found[-1]["log_id"])


class PageFilters(TypedDict, total=False):
    """The filters of a page of items beside its patient and its size, as :func:`list_items`
    takes them (each optional, with its default there): what a search by patient
    (:func:`search_patient`, :func:`inturn.worker.operations.privacy.search_patient`) hands on
    unchanged."""

    destination: str | None
    channel: str | None
    state: str | None
    control_id: str | None
    offset: int
    before: int | None


async def list_items(
    conn: AsyncConnection[Any],
    *,
    destination: str | None = None,
    channel: str | None = None,
    state: str | None = None,
    control_id: str | None = None,
    patient_key: str | None = None,
    also: Sequence[int] = (),
    limit: int = LIST_LIMIT_DEFAULT,
    offset: int = 0,
    before: int | None = None,
) -> tuple[list[Item], int]:
    """Return matching items newest first (never payloads) and the total count of matches.

    ``control_id`` (MSH-10, exact) and ``patient_key`` (an identifier index key, from
    :func:`inturn.worker.hl7.pid.lookup_key`) are answered by their indexes, so such a listing
    costs what it finds whatever the table holds. Rows not indexed yet (see
    :mod:`inturn.worker.store.identifiers`) are not found by ``patient_key``; nor are rows
    naming the patient past ingest's cap on identifiers: with ``patient_key``, ``also`` adds
    the ids found by reading those rows' payloads
    (:func:`inturn.worker.store.identifiers.beyond_index`), under the same filters.

    ``limit`` defaults to 100 and is capped at 1,000: this feeds a page, and an unbounded query
    over a large backlog would be a denial of service on ourselves. ``before`` is a keyset
    cursor: only items with a smaller id (the last id of the previous page); it keeps a deep
    page as cheap as the first, where ``offset`` does not.

    Raises:
        Invalid: unknown ``state``, negative ``limit`` or ``offset``.
    """
    if state is not None and state not in STATES:
        raise Invalid(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
    if limit < 0 or offset < 0:
        raise Invalid("limit and offset must be >= 0")
    params = {
        "destination": destination,
        "channel": channel,
        "state": state,
        "control_id": control_id,
        "patient_key": patient_key,
        "also": list(also),
        "before": before,
        "limit": min(limit, LIST_LIMIT_MAX),
        "offset": offset,
    }
    # Only a patient search reads the patient keys (which the reader role may not read).
    by = "_by_patient" if patient_key is not None else ""
    items = await fetch_all(conn, Q["list_items" + by], params, row=class_row(Item), prepare=False)
    row = await fetch_one(conn, Q["count_items" + by], params, row=dict_row, prepare=False)
    return items, int(row["total"]) if row else 0


async def get_item(conn: AsyncConnection[Any], item_id: int) -> Item | None:
    """One item without its payload, or None."""
    return await fetch_one(conn, Q["get_item"], {"id": item_id}, row=class_row(Item))


async def payload(conn: AsyncConnection[Any], item_id: int) -> bytes | None:
    """The stored bytes of one item, for the inspector; None when it does not exist."""
    row = await fetch_one(conn, Q["payload"], {"id": item_id}, row=dict_row)
    return bytes(row["payload"]) if row else None


@dataclass(frozen=True)
class StoredPayload:
    """One item's stored bytes as a person asked to read them.

    Attributes:
        destination: the item's destination.
        payload: its stored bytes (an envelope when encrypted: open it with ``seal``).
        seal: ``(id, scope)`` the envelope is bound to: the item's own id and destination, or
            its log row's id and ``channel:<name>`` (a slim row), or what a move recorded.
    """

    destination: str
    payload: bytes
    seal: tuple[int, str]


async def view_payload(
    conn: AsyncConnection[Any], item_id: int, *, who: str, why: str | None = None
) -> StoredPayload | None:
    """Return one item's destination and stored bytes (an envelope when encrypted: the caller
    opens it with the binding returned), from the hot table or history, for a person to read,
    and record that ``who`` read them.

    The audit entry (action ``view-payload``) is committed in the same transaction as the read,
    so no viewing goes unrecorded. Needs a writable connection. None when the item does not
    exist (nothing is audited then).
    """
    async with conn.transaction():
        row = await fetch_one(conn, Q["payload_of"], {"id": item_id}, row=dict_row)
        if row is None:
            return None
        await audit.record(
            conn,
            who=who,
            action="view-payload",
            destination=row["destination"],
            ids=[item_id],
            why=why,
        )
    return StoredPayload(
        str(row["destination"]),
        bytes(row["payload"]),
        (int(row["seal_id"]), str(row["seal_scope"])),
    )


@dataclass(frozen=True)
class ReceiverView:
    """What its destination's receiver is (or was) sent for one item, short of the payload.

    Attributes:
        profile: the destination's receiver profile as registered (``spec.profile``), or None.
        sequence_number: the MSH-13 number the item was given at its first send, or None.
        next_number: the number the destination's next message would be given (>= 1).
    """

    profile: dict[str, Any] | None
    sequence_number: int | None
    next_number: int


async def receiver_view(conn: AsyncConnection[Any], destination: str, item_id: int) -> ReceiverView:
    """The registered profile of ``destination`` and the MSH-13 numbers of item ``item_id``
    (no payload is read)."""
    row = await fetch_one(
        conn, Q["receiver_view"], {"destination": destination, "id": item_id}, row=dict_row
    )
    assert row is not None  # one row, whatever exists
    number = row["sequence_number"]
    return ReceiverView(
        row["profile"] or None, None if number is None else int(number), int(row["next_number"])
    )


#: Audit action of a search by patient identifier (the identifier itself is never recorded).
SEARCH_PATIENT_ACTION = "search-patient"


async def search_patient(
    conn: AsyncConnection[Any],
    patient_key: str,
    *,
    who: str,
    why: str | None = None,
    limit: int = LIST_LIMIT_DEFAULT,
    also: Sequence[int] = (),
    **filters: Unpack[PageFilters],
) -> tuple[list[Item], int]:
    """Items naming a patient, newest first, through the identifier index (as
    :func:`list_items` with ``patient_key``, ``also`` and its other ``filters``, which narrow
    the page), and
    an audit entry saying that ``who`` searched, why, and which items were shown.

    The entry (action ``search-patient``) names the items found, not the identifier, and is
    committed in the same transaction as the read: a search is recorded even when it finds
    nothing. Needs a writable connection.

    Returns:
        The page (at most ``limit``, capped at 1,000) and the total count of matches.

    Raises:
        Invalid: as :func:`list_items`.
    """
    async with conn.transaction():
        items, total = await list_items(
            conn, patient_key=patient_key, also=also, limit=limit, **filters
        )
        await record_patient_lookup(conn, [i.id for i in items], who=who, why=why)
    return items, total


async def record_patient_lookup(
    conn: AsyncConnection[Any],
    item_ids: Sequence[int],
    *,
    who: str,
    why: str | None,
    action: str = SEARCH_PATIENT_ACTION,
) -> None:
    """Record that ``who`` looked a patient up (``why``) and was shown ``item_ids`` (possibly
    none), never the identifier: the audit entry of every lookup by patient whatever found it
    (the index, an erasure's dry run, a scan of the payloads). ``action`` is
    ``search-patient`` unless the lookup is part of another audited action (an erasure that
    matched nothing records ``erase`` with no ids). Needs a writable connection."""
    await audit.record(conn, who=who, action=action, ids=list(item_ids), why=why)


async def resend_chain(conn: AsyncConnection[Any], item_id: int, *, limit: int = 50) -> list[Item]:
    """The resend chain an item belongs to: its first original, each copy a resend queued for
    it, and so on to the latest copy (the item itself included), oldest first; at most
    ``limit`` links on each side. Empty when the item does not exist."""
    item = await get_item(conn, item_id)
    if item is None:
        return []
    before: list[Item] = []
    link = item.resent_from
    while link is not None and len(before) < limit:
        original = await get_item(conn, link)
        if original is None:  # purged or erased: the chain starts at what is left
            break
        before.append(original)
        link = original.resent_from
    after: list[Item] = []
    link = item.resent_as
    while link is not None and len(after) < limit:
        copy = await get_item(conn, link)
        if copy is None:
            break
        after.append(copy)
        link = copy.resent_as
    return [*reversed(before), item, *after]


async def attempts(conn: AsyncConnection[Any], item_id: int) -> list[Attempt]:
    """One item's failed attempts, oldest first (its delivery, if any, is its own state)."""
    return await fetch_all(conn, Q["attempts"], {"id": item_id}, row=class_row(Attempt))


async def destination_attempts(
    conn: AsyncConnection[Any], destination: str, *, seconds: float, limit: int
) -> list[tuple[datetime, str]]:
    """``destination``'s failed attempts of the last ``seconds`` seconds, newest first, at most
    ``limit``: ``(at, outcome)`` with outcome ``retry`` or ``failed`` (no error text)."""
    rows = await fetch_all(
        conn,
        Q["destination_attempts"],
        {"destination": destination, "seconds": float(seconds), "limit": limit},
        row=dict_row,
    )
    return [(r["at"], str(r["outcome"])) for r in rows]


async def heads(conn: AsyncConnection[Any], destinations: Sequence[str]) -> dict[str, HeadInfo]:
    """The head (oldest pending item, due or not) of each destination that has one.

    One index probe per destination, so the cost follows the number of destinations, not the
    number of pending rows.
    """
    rows = await fetch_all(conn, Q["heads"], {"destinations": list(destinations)}, row=dict_row)
    return {
        r["destination"]: HeadInfo(
            item_id=int(r["id"]),
            attempts=int(r["attempts"]),
            wait_seconds=float(r["wait_seconds"]),
            last_error=r["last_error"],
        )
        for r in rows
    }


async def depth(
    conn: AsyncConnection[Any], destination: str | None = None, *, holds: bool = True
) -> list[DepthRow]:
    """Per-destination summary (pending, failed, oldest, oldest seconds, max attempts).

    Destinations with something pending or failed appear, and every destination on hold,
    even with nothing pending (``held_at`` set; pending 0). One grouped query for all, which
    also says when each was suspended and whether it is registered (``registered`` False: an
    orphaned queue); with ``holds`` (people's reads) a second one says by whom
    (``held_by``); a worker's own gauges pass False (its login may not read who suspended it).
    """
    rows = await fetch_all(conn, Q["depth"], {"destination": destination}, row=class_row(DepthRow))
    if not holds:
        return rows
    held = {r["destination"]: r for r in await fetch_all(conn, Q["holds"], row=dict_row)}
    return [
        replace(r, held_at=held[r.destination]["held_at"], held_by=held[r.destination]["held_by"])
        if r.destination in held
        else r
        for r in rows
    ]


async def own_depth(conn: AsyncConnection[Any], destination: str) -> list[DepthRow] | None:
    """:func:`depth` of one destination for its worker's gauges; None on a schema that lacks
    what the depth reads (a database before migration 0038 while an online upgrade's
    ``inturn migrate`` runs beside workers of this release: the gauges wait for it, delivery
    goes on). ``conn`` must be in autocommit mode."""
    try:
        return await depth(conn, destination, holds=False)
    except (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedTable):
        return None


async def pending_destinations(conn: AsyncConnection[Any]) -> list[str]:
    """Every destination with work waiting, so a process starting up knows what to drain."""
    rows = await fetch_all(conn, Q["pending_destinations"], row=dict_row)
    return [str(r["destination"]) for r in rows]


async def audit_log(
    conn: AsyncConnection[Any],
    limit: int = 100,
    *,
    destination: str | None = None,
    item_id: int | None = None,
    before: int | None = None,
) -> list[dict[str, Any]]:
    """The newest ``limit`` audit entries (who, when, what, which items, why), newest first.

    Optional filters: one destination, entries naming one item, entries with an id below
    ``before`` (a keyset cursor). Entries never carry payloads. ``at`` is an ISO 8601 string.
    """
    params = {
        "limit": min(max(limit, 1), LIST_LIMIT_MAX),
        "destination": destination,
        "item_id": item_id,
        "before": before,
    }
    return [
        {
            "id": r["id"],
            "at": r["at"].isoformat(),
            "who": r["who"],
            "action": r["action"],
            "destination": r["destination"],
            "itemIds": list(r["item_ids"]),
            "why": r["why"],
        }
        for r in await fetch_all(conn, Q["audit_list"], params, row=dict_row)
    ]


async def oldest_pending(conn: AsyncConnection[Any], destination: str) -> Item | None:
    """The oldest pending item of ``destination`` (its head, whether held or not), or None."""
    row = await fetch_one(conn, Q["oldest_pending"], {"destination": destination}, row=dict_row)
    return Item.from_row(row) if row is not None else None


#: Most pending items a reader looks over to say what a destination's lanes hold.
LANE_VIEW_LIMIT = 1000


async def lane_window(
    conn: AsyncConnection[Any], destination: str, limit: int = LANE_VIEW_LIMIT
) -> list[Pending]:
    """The oldest pending items of ``destination`` (at most ``limit``) with their lane keys,
    read-only and without payloads: what :func:`inturn.worker.drain.lanes.summarize` reads to
    say what each lane holds."""
    params = {"destination": destination, "limit": limit}
    rows = await fetch_all(conn, Q["lane_window"], params, row=dict_row)
    return [
        Pending(
            r["id"], tuple(r["patient_keys"] or ()), r["attempts"], r["wait_seconds"], r["size"]
        )
        for r in rows
    ]


#: Longest one destination's lane window may take for a reader (ms): past it that destination's
#: view says it is unavailable, and the rest of the read (every other destination) goes on.
LANE_VIEW_TIMEOUT_MS = 2000


async def lane_window_within(
    conn: AsyncConnection[Any],
    destination: str,
    limit: int = LANE_VIEW_LIMIT,
    timeout_ms: int = LANE_VIEW_TIMEOUT_MS,
) -> list[Pending] | None:
    """:func:`lane_window`, bounded: None when it takes longer than ``timeout_ms``
    milliseconds (its statement cancelled within a savepoint, so the caller's transaction and
    its statement timeout are as they were and its next read runs).

    Raises:
        psycopg.Error: the read failed otherwise.
    """
    window: list[Pending] | None = None
    async with conn.transaction() as outer:
        await conn.execute(Q["local_statement_timeout"], {"ms": str(timeout_ms)})
        try:
            async with conn.transaction():
                window = await lane_window(conn, destination, limit)
        except psycopg.errors.QueryCanceled:
            window = None
        raise psycopg.Rollback(outer)  # the statement timeout goes back to the caller's
    return window
