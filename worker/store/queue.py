"""The delivery queue's operations, one async function per operation (docs/reference/cli.md).

Every function takes an open ``psycopg.AsyncConnection`` in autocommit mode and runs its own
short transaction(s), so the same code serves the worker (one dedicated connection that also
holds the destination's advisory lock) and the pooled callers (ingest, CLI, operator), which
take a connection from :class:`inturn.worker.store.connect.Pools`. Destinations are identified
as ``namespace/name``. Every statement is a named query of ``sql/queue.sql``; rows are read by
column name.

Ordering rests on three rules, each enforced here:

* the head is the oldest pending item whether or not it is due (:func:`next_head`);
* enqueues for one destination are serialised until COMMIT by a transaction-level advisory lock
  (taken in sorted order for fan-out), so identity order equals commit order (:func:`enqueue`);
* there is no in-flight state: the head stays pending while being sent, so a crash leaves it to
  be sent again by the next lock holder (at most one duplicate, never a reorder).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString, Protocol

from psycopg import AsyncConnection, sql
from psycopg.rows import class_row, dict_row

from inturn.worker.hl7.pid import index_keys
from inturn.worker.store import locks
from inturn.worker.store.model import (
    FINISHED_STATES,
    STATES,
    Attempt,
    DepthRow,
    Head,
    HeadInfo,
    Item,
    NewItem,
    ScannedPayload,
)
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("queue.sql")

#: Largest page :func:`list_items` returns, whatever the caller asks for.
LIST_LIMIT_MAX = 1000
#: Page size when the caller does not say.
LIST_LIMIT_DEFAULT = 100
#: Rows deleted per purge transaction, at most.
PURGE_BATCH_MAX = 5000


def notify_channel(destination: str) -> str:
    """Return the LISTEN/NOTIFY channel name of a destination (a valid identifier, 30 bytes).

    Each destination has its own channel so that a thousand idle workers are not all woken by
    every enqueue.
    """
    return "inturn_q_" + hashlib.sha1(destination.encode()).hexdigest()[:21]


async def listen(conn: AsyncConnection[Any], destination: str) -> None:
    """LISTEN on the destination's channel (:func:`notify_channel`) on ``conn``."""
    await listen_channel(conn, notify_channel(destination))


async def listen_channel(conn: AsyncConnection[Any], channel: str) -> None:
    """LISTEN on ``channel`` on ``conn``.

    A utility statement with an identifier, composed here rather than a named query (there is
    nothing in it to plan).
    """
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


async def lock_for_enqueue(conn: AsyncConnection[Any], destinations: Iterable[str]) -> None:
    """Take each destination's enqueue lock (transaction level, held until COMMIT), in sorted
    order so that two fan-outs never deadlock: enqueues for one destination then commit in
    the order of their ids."""
    for destination in sorted(set(destinations)):
        await conn.execute(Q["enqueue_lock"], {"destination": destination})


async def enqueue_in_transaction(conn: AsyncConnection[Any], items: Sequence[NewItem]) -> list[int]:
    """Insert ``items`` inside the caller's open transaction; return their ids in input order.

    Takes each touched destination's enqueue lock in sorted order (no deadlock between two
    fan-outs), inserts (each row with its identifier index keys, see
    :mod:`inturn.worker.store.identifiers`), and queues one NOTIFY per destination, delivered at
    COMMIT. The caller
    commits, and must only acknowledge the sender after its COMMIT has returned.
    """
    destinations = sorted({item.destination for item in items})
    await lock_for_enqueue(conn, destinations)
    ids: list[int] = []
    async with conn.cursor(row_factory=dict_row) as cur:
        for item in items:
            await cur.execute(
                Q["enqueue_insert"],
                {
                    "destination": item.destination,
                    "channel": item.channel,
                    "control_id": item.control_id,
                    "message_type": item.message_type,
                    "payload": item.payload,
                    "size": len(item.payload),
                    "patient_keys": index_keys(item.payload),
                },
            )
            row = await cur.fetchone()
            assert row is not None
            ids.append(int(row["id"]))
    await wake(conn, destinations)
    return ids


async def enqueue(conn: AsyncConnection[Any], items: Sequence[NewItem]) -> list[int]:
    """Store ``items`` durably in one transaction and return their ids, after COMMIT.

    ``synchronous_commit`` is forced on for the transaction: when this returns, the rows survive
    a database crash, so the caller may answer AA.

    Raises:
        psycopg.Error: nothing was stored.
    """
    if not items:
        return []
    async with conn.transaction():
        await conn.execute(Q["synchronous_commit"])
        return await enqueue_in_transaction(conn, items)


async def blocked(conn: AsyncConnection[Any], destination: str) -> bool:
    """Whether anything is pending for ``destination``, due or not (an item backing off counts)."""
    row = await fetch_one(conn, Q["blocked"], {"destination": destination}, row=dict_row)
    return bool(row and row["blocked"])


HeadResult = tuple[Head | None, float | None]


def _head_result(row: Mapping[str, Any] | None) -> HeadResult:
    if row is None or row["id"] is None:
        return None, None
    wait = float(row["wait_seconds"])
    if wait > 0:
        return None, wait
    return (
        Head(
            item=Item.from_row(row),
            payload=bytes(row["payload"]),
            traceparent=row.get("traceparent"),
        ),
        None,
    )


async def next_head(conn: AsyncConnection[Any], destination: str, *, after: int = 0) -> HeadResult:
    """Return the head of ``destination`` if it is due, else how long to wait.

    Args:
        after: a keyset bound: only items with a larger id are considered. A worker passes the
            id it finished last (everything at or below it is finished, because enqueues commit
            in id order); 0 considers every item.

    Returns:
        ``(head, None)`` when the oldest pending item is due now; ``(None, seconds)`` when it is
        backing off (nothing behind it may go first); ``(None, None)`` when nothing is pending.
    """
    params = {"destination": destination, "after": after}
    return _head_result(await fetch_one(conn, Q["head"], params, row=dict_row))


class ExpectedReply(Protocol):
    """What :func:`succeeded_next` records of one expected reply
    (:class:`inturn.worker.orders.keys.Expectation` has these attributes)."""

    @property
    def key(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def reply_types(self) -> tuple[str, ...]: ...
    @property
    def within_seconds(self) -> int: ...


async def succeeded_next(
    conn: AsyncConnection[Any],
    head: Item,
    attempts: int,
    expecting: Sequence[ExpectedReply] = (),
) -> tuple[float | None, HeadResult]:
    """Mark ``head`` delivered and return the next head, in one statement (one round trip).

    ``expecting``: the replies the delivered order now waits for (``spec.replies``), recorded
    in ``inturn_order_expectation`` by the same statement, so only if the mark is written.

    Committed synchronously like :func:`succeeded`. Returns ``(waited_seconds, next)`` where
    ``waited_seconds`` is None when ``head`` was no longer pending, and ``next`` is as from
    :func:`next_head` with ``after=head.id``.
    """
    opened = list(expecting)
    params = {
        "id": head.id,
        "attempts": attempts,
        "destination": head.destination,
        "keys": [e.key for e in opened],
        "digests": [e.digest for e in opened],
        "channels": [e.channel for e in opened],
        "types": [",".join(e.reply_types) for e in opened],
        "within": [e.within_seconds for e in opened],
    }
    row = await fetch_one(conn, Q["succeeded_next"], params, row=dict_row)
    assert row is not None  # the statement always returns one row
    waited = None if row["waited_seconds"] is None else float(row["waited_seconds"])
    return waited, _head_result(row)


async def retry(
    conn: AsyncConnection[Any], item_id: int, attempts: int, delay_seconds: float, cause: str
) -> bool:
    """Record a failed attempt: ``attempts`` so far, next attempt in ``delay_seconds``.

    ``cause`` becomes ``last_error``, and ``reason`` if it was still empty. Returns False when
    the item is no longer pending (skipped or erased meanwhile).
    """
    cur = await conn.execute(
        Q["retry"],
        {"id": item_id, "attempts": attempts, "delay_seconds": delay_seconds, "cause": cause},
    )
    return cur.rowcount == 1


async def sender_changed(
    conn: AsyncConnection[Any], destination: str, fingerprint: str
) -> tuple[bool, int]:
    """Record the sender fingerprint of a worker that took the destination's lock.

    When the last worker of the destination recorded another fingerprint (its sender settings
    were changed: address, TLS, headers), every pending item waiting out a backoff is made due
    now, so the head is tried at once with the new settings; its attempts, ``last_error`` and
    ``reason`` are kept for the audit. A restart with the same settings changes nothing.

    Returns:
        ``(changed, made_due)``: whether the settings changed, and how many items were made due.
    """
    params = {"destination": destination, "fingerprint": fingerprint}
    row = await fetch_one(conn, Q["sender_changed"], params, row=dict_row)
    assert row is not None
    return bool(row["changed"]), int(row["made_due"])


async def succeeded(conn: AsyncConnection[Any], item_id: int, attempts: int) -> float | None:
    """Mark an item delivered; return seconds from enqueue to delivery.

    One autocommit statement. It must commit synchronously: a delivered mark lost in a database
    crash would resend earlier messages after later ones. The connections this package opens
    (:func:`~inturn.worker.store.connect.connect_worker`, the pools) force
    ``synchronous_commit=on`` for their whole session, which saves a round trip per message.

    Returns None when the item was no longer pending (skipped or erased during the attempt).
    """
    params = {"id": item_id, "attempts": attempts}
    row = await fetch_one(conn, Q["succeeded"], params, row=dict_row)
    return float(row["waited_seconds"]) if row else None


async def gave_up(conn: AsyncConnection[Any], item_id: int, attempts: int, cause: str) -> bool:
    """Mark an item failed (attempts exhausted or a ``fail`` ACK policy); the next head goes.

    One autocommit statement, synchronous like :func:`succeeded`.
    """
    cur = await conn.execute(Q["gave_up"], {"id": item_id, "attempts": attempts, "cause": cause})
    return cur.rowcount == 1


async def wake(conn: AsyncConnection[Any], destinations: Iterable[str]) -> None:
    """NOTIFY each destination's worker (delivered at COMMIT of the caller's transaction)."""
    for destination in sorted(set(destinations)):
        await conn.execute(
            Q["notify"], {"channel": notify_channel(destination), "destination": destination}
        )


async def retry_now(
    conn: AsyncConnection[Any],
    *,
    who: str,
    item_id: int | None = None,
    destination: str | None = None,
    why: str | None = None,
) -> list[int]:
    """Make one pending item (``item_id``) or every pending item of ``destination`` due now.

    Resets attempts to 0: whoever retries by hand has usually just fixed the cause, and the
    failures before the fix should not eat the new attempt budget. Audited; wakes the worker.
    Returns the ids changed.

    Raises:
        ValueError: neither or both of ``item_id`` and ``destination`` given.
    """
    if (item_id is None) == (destination is None):
        raise ValueError("give exactly one of item_id or destination")
    async with conn.transaction():
        if item_id is not None:
            rows = await fetch_all(conn, Q["retry_now_one"], {"id": item_id}, row=dict_row)
        else:
            params = {"destination": destination}
            rows = await fetch_all(conn, Q["retry_now_all"], params, row=dict_row)
        ids = sorted(int(r["id"]) for r in rows)
        touched = {str(r["destination"]) for r in rows}
        if ids:
            await record(
                conn,
                who=who,
                action="retry-now",
                destination=destination or min(touched),
                ids=ids,
                why=why,
            )
            await wake(conn, touched)
    return ids


async def skip(
    conn: AsyncConnection[Any], item_id: int, *, who: str, why: str | None = None
) -> bool:
    """Abandon one pending item on purpose: state ``skipped``, ``decided_by`` = ``who``; audited.

    Returns False when the item is not pending (nothing changed, nothing audited).
    """
    async with conn.transaction():
        row = await fetch_one(conn, Q["skip"], {"id": item_id, "who": who}, row=dict_row)
        if row is None:
            return False
        await record(
            conn, who=who, action="skip", destination=row["destination"], ids=[item_id], why=why
        )
        await wake(conn, [row["destination"]])
    return True


async def drain(
    conn: AsyncConnection[Any], destination: str, *, who: str, why: str | None = None
) -> list[int]:
    """Skip every pending item of ``destination`` (a backlog too stale to be useful); audited."""
    async with conn.transaction():
        params = {"destination": destination, "who": who}
        ids = sorted(int(r["id"]) for r in await fetch_all(conn, Q["drain"], params, row=dict_row))
        if ids:
            await record(conn, who=who, action="drain", destination=destination, ids=ids, why=why)
            await wake(conn, [destination])  # its gauges change
    return ids


async def remove(
    conn: AsyncConnection[Any], item_ids: Sequence[int], *, who: str, why: str | None = None
) -> list[int]:
    """Delete finished items (delivered, failed, skipped); pending ones are never touched.

    Returns the ids actually deleted. Audited when anything was deleted.
    """
    return await _delete(conn, Q["remove"], "remove", item_ids, who=who, why=why)


async def erase(
    conn: AsyncConnection[Any], item_ids: Sequence[int], *, who: str, why: str | None = None
) -> list[int]:
    """Delete items whatever their state (data-subject erasure); audited with ids, no payload.

    A pending item erased while its worker is sending it is simply gone when the worker reports
    back (its update matches no row). Returns the ids deleted.
    """
    return await _delete(conn, Q["erase"], "erase", item_ids, who=who, why=why)


async def _delete(
    conn: AsyncConnection[Any],
    query: LiteralString,
    action: str,
    item_ids: Sequence[int],
    *,
    who: str,
    why: str | None,
) -> list[int]:
    """Run a DELETE returning ``id, destination, state`` and audit what it deleted, in one
    transaction; wake the workers of destinations that lost a pending item.

    The audit names the destination when every deleted item had the same one.
    """
    async with conn.transaction():
        rows = await fetch_all(conn, query, {"ids": list(item_ids)}, row=dict_row)
        ids = sorted(int(r["id"]) for r in rows)
        if ids:
            touched = {r["destination"] for r in rows}
            dest = touched.pop() if len(touched) == 1 else None
            await record(conn, who=who, action=action, destination=dest, ids=ids, why=why)
            # An erased pending item changes its worker's head and gauges.
            await wake(conn, {r["destination"] for r in rows if r["state"] == "pending"})
    return ids


@dataclass(frozen=True)
class ResendOutcome:
    """What a resend of several items did, in the original order.

    Attributes:
        copies: ``(original, copy)`` for every item resent, oldest original first; the copies'
            ids grow in the same order, so they go out in the original order.
        refused: ``(id, why)`` for every item not resent: still pending, already resent (the
            copy is named), or no such item.
    """

    copies: tuple[tuple[int, int], ...]
    refused: tuple[tuple[int, str], ...]


async def resend_many(
    conn: AsyncConnection[Any], item_ids: Sequence[int], *, who: str, why: str | None = None
) -> ResendOutcome:
    """Put a copy of each finished item at the tail of its destination's queue, in id order.

    One transaction: the copies are enqueued oldest original first (so they keep the original
    order behind everything already queued), each original records its copy (``resent_as``)
    and each copy its original (``resent_from``), and one audit entry names every original and
    copy. An item already resent is refused with its copy's id (resend the copy if it failed
    too): a second copy of the same message is never queued by mistake. Pending items are
    refused (they will be sent anyway); so are ids that do not exist.
    """
    ids = sorted(set(item_ids))
    async with conn.transaction():
        await conn.execute(Q["synchronous_commit"])
        rows = await fetch_all(conn, Q["get_for_resend"], {"ids": ids}, row=dict_row)
        found = {int(r["id"]) for r in rows}
        refused = [(i, "no such item") for i in ids if i not in found]
        chosen = []
        for row in rows:
            if row["state"] == "pending":
                refused.append((row["id"], "still pending (it will be sent anyway)"))
            elif row["resent_as"] is not None:
                refused.append((row["id"], f"already resent as {row['resent_as']}"))
            else:
                chosen.append(row)
        news = [
            NewItem(
                destination=r["destination"],
                channel=r["channel"],
                control_id=r["control_id"],
                message_type=r["message_type"],
                payload=bytes(r["payload"]),
            )
            for r in chosen
        ]
        new_ids = await enqueue_in_transaction(conn, news)
        copies = list(zip([int(r["id"]) for r in chosen], new_ids, strict=True))
        for original, copy in copies:
            await conn.execute(Q["mark_resent"], {"id": original, "copy": copy})
            await conn.execute(Q["mark_copy"], {"original": original, "copy": copy})
        if copies:
            touched = {r["destination"] for r in chosen}
            dest = touched.pop() if len(touched) == 1 else None
            audited = sorted(i for pair in copies for i in pair)
            await record(conn, who=who, action="resend", destination=dest, ids=audited, why=why)
    return ResendOutcome(tuple(copies), tuple(sorted(refused)))


async def resend(
    conn: AsyncConnection[Any], item_id: int, *, who: str, why: str | None = None
) -> int | None:
    """Put a copy of one finished item at the tail of its queue (see :func:`resend_many`);
    return the copy's id, or None when the item does not exist.

    Raises:
        ValueError: the item is still pending, or was already resent (the message says which).
    """
    outcome = await resend_many(conn, [item_id], who=who, why=why)
    if outcome.copies:
        return outcome.copies[0][1]
    [(_, why_not)] = outcome.refused
    if why_not == "no such item":
        return None
    if why_not.startswith("still pending"):
        raise ValueError(f"item {item_id} is still pending; only finished items can be resent")
    raise ValueError(f"item {item_id} was {why_not}: resend the copy if it failed too")


async def oldest_pending(conn: AsyncConnection[Any], destination: str) -> Item | None:
    """The oldest pending item of ``destination`` (its head, whether held or not), or None."""
    row = await fetch_one(conn, Q["oldest_pending"], {"destination": destination}, row=dict_row)
    return Item.from_row(row) if row is not None else None


async def resend_candidates(
    conn: AsyncConnection[Any], destination: str, *, type_like: str | None = None, limit: int
) -> list[int]:
    """Ids of the failed items of ``destination`` never resent (what still needs a person),
    oldest first, at most ``limit``; ``type_like`` is a LIKE pattern on MSH-9."""
    rows = await fetch_all(
        conn,
        Q["resend_candidates"],
        {"destination": destination, "type_like": type_like, "limit": limit},
        row=dict_row,
    )
    return [int(r["id"]) for r in rows]


async def resent_delivered(conn: AsyncConnection[Any], limit: int) -> list[str]:
    """Record keys (delivery ids) of pending ``delivery-failed`` worklist items whose message
    was resent and whose latest copy was delivered, oldest first, at most ``limit``."""
    rows = await fetch_all(conn, Q["resent_delivered"], {"limit": limit}, row=dict_row)
    return [str(r["record_key"]) for r in rows]


async def purge(
    conn: AsyncConnection[Any],
    cutoffs: dict[str, datetime],
    *,
    batch: int = PURGE_BATCH_MAX,
) -> dict[str, int] | None:
    """Delete finished items older than a cutoff per state, in batches of at most 5,000 rows.

    Args:
        cutoffs: ``{"delivered": t1, "failed": t2, "skipped": t3}``; states left out are kept.
            ``pending`` is refused: purge never touches pending items.
        batch: rows per transaction (1..5000).

    Returns:
        Rows deleted per state, or None when another purge holds the purge lock (singleton).

    Raises:
        ValueError: a cutoff for ``pending`` or an unknown state, or a batch out of range.
    """
    for state in cutoffs:
        if state not in FINISHED_STATES:
            raise ValueError(f"purge only removes finished states {FINISHED_STATES}, not {state!r}")
    if not 1 <= batch <= PURGE_BATCH_MAX:
        raise ValueError(f"batch must be 1..{PURGE_BATCH_MAX}, got {batch}")
    if not await locks.try_component_lock(conn, "purge"):
        return None
    counts = {state: 0 for state in cutoffs}
    try:
        for state, cutoff in cutoffs.items():
            while True:
                cur = await conn.execute(
                    Q["purge_batch"], {"state": state, "cutoff": cutoff, "batch": batch}
                )
                counts[state] += cur.rowcount
                if cur.rowcount < batch:
                    break
    finally:
        await locks.release_component_lock(conn, "purge")
    return counts


async def scan_payloads(
    conn: AsyncConnection[Any], *, batch: int = 500
) -> AsyncIterator[ScannedPayload]:
    """Yield every held item with its payload, in id order, reading ``batch`` rows at a time.

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
            return
        last = rows[-1].id


async def list_items(
    conn: AsyncConnection[Any],
    *,
    destination: str | None = None,
    channel: str | None = None,
    state: str | None = None,
    control_id: str | None = None,
    patient_key: str | None = None,
    limit: int = LIST_LIMIT_DEFAULT,
    offset: int = 0,
    before: int | None = None,
) -> tuple[list[Item], int]:
    """Return matching items newest first (never payloads) and the total count of matches.

    ``control_id`` (MSH-10, exact) and ``patient_key`` (an identifier index key, from
    :func:`inturn.worker.hl7.pid.lookup_key`) are answered by their indexes, so such a listing
    costs what it finds whatever the table holds. Rows not indexed yet (see
    :mod:`inturn.worker.store.identifiers`) are not found by ``patient_key``.

    ``limit`` defaults to 100 and is capped at 1,000: this feeds a page, and an unbounded query
    over a large backlog would be a denial of service on ourselves. ``before`` is a keyset
    cursor: only items with a smaller id (the last id of the previous page); it keeps a deep
    page as cheap as the first, where ``offset`` does not.

    Raises:
        ValueError: unknown ``state``, negative ``limit`` or ``offset``.
    """
    if state is not None and state not in STATES:
        raise ValueError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must be >= 0")
    params = {
        "destination": destination,
        "channel": channel,
        "state": state,
        "control_id": control_id,
        "patient_key": patient_key,
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


async def view_payload(
    conn: AsyncConnection[Any], item_id: int, *, who: str, why: str | None = None
) -> bytes | None:
    """Return one item's stored bytes for a person to read, and record that ``who`` read them.

    The audit entry (action ``view-payload``) is committed in the same transaction as the read,
    so no viewing goes unrecorded. Needs a writable connection. None when the item does not
    exist (nothing is audited then).
    """
    async with conn.transaction():
        row = await fetch_one(conn, Q["payload_of"], {"id": item_id}, row=dict_row)
        if row is None:
            return None
        await record(
            conn,
            who=who,
            action="view-payload",
            destination=row["destination"],
            ids=[item_id],
            why=why,
        )
    return bytes(row["payload"])


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


async def depth(conn: AsyncConnection[Any], destination: str | None = None) -> list[DepthRow]:
    """Per-destination summary (pending, failed, oldest, oldest seconds, max attempts).

    Only destinations with something pending or failed appear. One grouped query for all.
    """
    return await fetch_all(conn, Q["depth"], {"destination": destination}, row=class_row(DepthRow))


async def pending_destinations(conn: AsyncConnection[Any]) -> list[str]:
    """Every destination with work waiting, so a process starting up knows what to drain."""
    rows = await fetch_all(conn, Q["pending_destinations"], row=dict_row)
    return [str(r["destination"]) for r in rows]


async def record(
    conn: AsyncConnection[Any],
    *,
    who: str,
    action: str,
    destination: str | None = None,
    ids: Sequence[int] = (),
    why: str | None = None,
) -> None:
    """Add one entry to the audit trail in the caller's transaction (never a payload).

    The one writer of the audit trail: every decision (skip, drain, erase, retry-now, resend,
    remove, view-payload, suspend, resume, worklist clears, the sweeper's expiries) goes
    through here.
    """
    await conn.execute(
        Q["audit"],
        {"who": who, "action": action, "destination": destination, "ids": list(ids), "why": why},
    )


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
