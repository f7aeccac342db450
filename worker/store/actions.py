"""People's (and robots') actions on the delivery queue: retry now, skip, drain, remove, erase,
resend and purge.

Each function takes an open ``psycopg.AsyncConnection`` in autocommit mode and runs its own
transaction; every decision is written to the audit trail in the same transaction by
:func:`inturn.worker.store.audit.record`, and a destination whose queue changed is woken with
:func:`inturn.worker.store.notify.wake`. Statements are named queries of ``sql/queue.sql``. The
rules (who may, with what reason) are the operations layer's (:mod:`inturn.worker.operations`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import Conflict, Invalid
from inturn.worker.store import audit, locks, notify, worklist
from inturn.worker.store.lease import holder_id
from inturn.worker.store.model import (
    FINISHED_STATES,
)
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("queue.sql")

#: Rows deleted per purge transaction, at most.
PURGE_BATCH_MAX = 5000


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
        Invalid: neither or both of ``item_id`` and ``destination`` given.
    """
    if (item_id is None) == (destination is None):
        raise Invalid("give exactly one of item_id or destination")
    async with conn.transaction():
        if item_id is not None:
            rows = await fetch_all(conn, Q["retry_now_one"], {"id": item_id}, row=dict_row)
        else:
            params = {"destination": destination}
            rows = await fetch_all(conn, Q["retry_now_all"], params, row=dict_row)
        ids = sorted(int(r["id"]) for r in rows)
        touched = {str(r["destination"]) for r in rows}
        if ids:
            await audit.record(
                conn,
                who=who,
                action="retry-now",
                destination=destination or min(touched),
                ids=ids,
                why=why,
            )
            await notify.wake(conn, touched)
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
        await audit.record(
            conn, who=who, action="skip", destination=row["destination"], ids=[item_id], why=why
        )
        await notify.wake(conn, [row["destination"]])
    return True


#: Log rows one pull on behalf of a person or the sweeper copies per statement.
PULL_BATCH = 5000


async def pull_all(
    conn: AsyncConnection[Any], destination: str, *, at_most: int | None = None
) -> int:
    """Turn every message of the channel log routed to ``destination`` and not pulled yet into
    rows of its queue, in log order, in the caller's transaction (batches of
    :data:`PULL_BATCH`; ``inturn_pull_for``, migration 0038): the destination's enqueue lock is
    then held until COMMIT, so no worker pulls meanwhile and what the caller does next to the
    destination's pending rows covers every message accepted for it so far. ``at_most``: stop
    after about that many rows (whole batches; the sweeper's bound), None: all. Returns the
    rows pulled (0 for a destination with no channel)."""
    total = 0
    while True:
        params = {"destination": destination, "limit": PULL_BATCH}
        row = await fetch_one(conn, Q["pull_for"], params, row=dict_row)
        pulled = int(row["pulled"]) if row else 0
        total += pulled
        if pulled < PULL_BATCH or (at_most is not None and total >= at_most):
            return total


async def drain(
    conn: AsyncConnection[Any], destination: str, *, who: str, why: str | None = None
) -> list[int]:
    """Skip every pending item of ``destination`` (a backlog too stale to be useful); audited.

    The messages of its channel's log it has not pulled yet are pulled first (:func:`pull_all`)
    and skipped with the rest: a drain leaves nothing accepted before it to be sent after it.
    """
    async with conn.transaction():
        await pull_all(conn, destination)
        params = {"destination": destination, "who": who}
        ids = sorted(int(r["id"]) for r in await fetch_all(conn, Q["drain"], params, row=dict_row))
        if ids:
            await audit.record(
                conn, who=who, action="drain", destination=destination, ids=ids, why=why
            )
            await notify.wake(conn, [destination])  # its gauges change
    return ids


async def remove(
    conn: AsyncConnection[Any], item_ids: Sequence[int], *, who: str, why: str | None = None
) -> list[int]:
    """Delete finished items (delivered, failed, skipped); pending ones are never touched.

    Returns the ids actually deleted. Audited when anything was deleted.
    """
    return await _delete(conn, Q["remove"], "remove", item_ids, who=who, why=why)


#: The note on a ``delivery-failed`` item cleared because its message was erased.
ERASED_NOTE = "its message was erased (data-subject erasure): nothing is left to resend"


async def erase(
    conn: AsyncConnection[Any],
    item_ids: Sequence[int],
    *,
    who: str,
    why: str | None = None,
    patient_key: str | None = None,
) -> list[int]:
    """Delete items whatever their state (data-subject erasure); audited with ids, no payload.

    A message is stored once for all its destinations (the channel log, migration 0033): an
    item that names a log message erases that message for every destination, its log row and
    every destination's row (hot table and history), so the ids returned may be more than
    those given. With ``patient_key`` (every stored form of a patient's index key,
    comma-separated, as :func:`inturn.worker.store.identifiers.lookup_text` makes it), the log
    messages naming the patient are erased too, those no destination has pulled yet among
    them. The enqueue locks of every destination the messages are routed to are taken first
    (sorted), so that no pull copies a message being erased.

    In the same transaction, the erased items' pending ``delivery-failed`` worklist items are
    cleared by ``system`` with a note (:data:`ERASED_NOTE`): nothing is left for a person to
    resend or open. A pending item erased while its worker is sending it is simply gone when the
    worker reports back (its update matches no row). Returns the ids deleted, and minus the log
    id of each message erased that no destination had pulled (as the lookups list it); audited
    when anything was.
    """
    keys = patient_key.split(",") if patient_key else None
    async with conn.transaction():
        scope = await fetch_one(
            conn, Q["erase_scope"], {"ids": list(item_ids), "keys": keys}, row=dict_row
        )
        messages = list(scope["messages"]) if scope else []
        destinations = list(scope["destinations"]) if scope else []
        if destinations:
            await conn.execute(Q["erase_locks"], {"destinations": destinations})
        params = {"ids": list(item_ids), "messages": messages}
        deleted = await fetch_all(conn, Q["erase"], params, row=dict_row)
        ids = sorted(int(r["id"]) for r in deleted)
        if ids:
            touched = {r["destination"] for r in deleted}
            dest = touched.pop() if len(touched) == 1 else None
            await audit.record(conn, who=who, action="erase", destination=dest, ids=ids, why=why)
            # An erased pending item, or message not pulled yet, changes its worker's gauges.
            await notify.wake(conn, destinations)
        await worklist.clear_where(
            conn,
            record_kind="delivery",  # inturn.worker.worklist.delivery_failed's items
            record_keys=[str(i) for i in ids],
            queue="delivery-failed",
            who=worklist.SYSTEM,
            note=ERASED_NOTE,
        )
    return ids


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
            await audit.record(conn, who=who, action=action, destination=dest, ids=ids, why=why)
            # An erased pending item changes its worker's head and gauges.
            await notify.wake(conn, {r["destination"] for r in rows if r["state"] == "pending"})
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
    left_out: tuple[tuple[str, int], ...] = ()


#: The states a resend copies by default: messages given up on (``failed``). A delivered or
#: skipped message is copied only when the person says so (``include_delivered``): its
#: receiver already has it, or a person decided it must not go.
RESENDABLE = frozenset({"failed"})

#: With ``include_delivered``: every finished state.
RESENDABLE_FINISHED = frozenset({"failed", "delivered", "skipped"})


def _choose(
    rows: Sequence[dict[str, Any]],
    ids: Sequence[int],
    ranges: Sequence[tuple[int, int]],
    states: frozenset[str],
) -> tuple[list[dict[str, Any]], list[tuple[int, str]], dict[str, int]]:
    """The resend rule, pure: which rows are copied, which named ids are refused (one line
    each), and what the ranges' other rows left out (counted by kind).

    A named id (``ids``) is the person's choice: it is copied when its state is in ``states``
    and it was never resent, else refused with the reason. A range ``(first, last)`` covers
    the rows of ONE destination: the destination of its first and last existing rows (ids
    interleave across destinations, so a range of one destination's failures also spans other
    destinations' rows). Its rows of other destinations, and its rows not in ``states``,
    pending or already resent, are left out and counted, never copied.

    Raises:
        Invalid: a range whose first and last existing rows belong to different destinations.
    """
    by_id = {int(r["id"]): r for r in rows}
    named = set(ids)
    chosen: dict[int, dict[str, Any]] = {}
    refused: dict[int, str] = {}
    left_out: dict[str, int] = {}

    def why_not(row: dict[str, Any]) -> str | None:
        if row["state"] == "pending":
            return "still pending (it will be sent anyway)"
        if row["resent_as"] is not None:
            return f"already resent as {row['resent_as']}"
        if row["state"] not in states:
            return f"{row['state']} (only failed items are resent without --include-delivered)"
        return None

    for i in named:
        row = by_id.get(i)
        reason = "no such item" if row is None else why_not(row)
        if reason is None:
            chosen[i] = by_id[i]
        else:
            refused[i] = reason
    for first, last in ranges:
        present = [i for i in range(first, last + 1) if i in by_id]
        if not present:
            left_out["no such item"] = left_out.get("no such item", 0) + (last - first + 1)
            continue
        ends = {by_id[present[0]]["destination"], by_id[present[-1]]["destination"]}
        if len(ends) > 1:
            a, b = sorted(ends)
            raise Invalid(
                f"the range {first}-{last} starts and ends in different destinations ({a}, {b}):"
                " give one range per destination"
            )
        [dest] = ends
        for i in range(first, last + 1):
            if i in named or i in chosen:
                continue
            row = by_id.get(i)
            if row is None:
                kind = "no such item"
            elif row["destination"] != dest:
                kind = "of other destinations"
            elif row["state"] == "pending":
                kind = "pending"
            elif row["resent_as"] is not None:
                kind = "already resent"
            elif row["state"] not in states:
                kind = str(row["state"])
            else:
                chosen[i] = row
                continue
            left_out[kind] = left_out.get(kind, 0) + 1
    return [chosen[i] for i in sorted(chosen)], sorted(refused.items()), left_out


async def resend_many(
    conn: AsyncConnection[Any],
    item_ids: Sequence[int],
    *,
    who: str,
    why: str | None = None,
    payloads: PayloadCodec | None = None,
    ranges: Sequence[tuple[int, int]] = (),
    include_delivered: bool = False,
) -> ResendOutcome:
    """Put a copy of each failed item at the tail of its destination's queue, in id order.

    Which items: the rule of :func:`_choose`. ``item_ids`` are named one by one (each one not
    copied is refused with its reason); ``ranges`` are ``(first, last)`` id ranges, each
    covering only the destination of its ends (the rest is left out and counted in
    ``left_out``, kind and count). Only ``failed`` items are copied unless
    ``include_delivered`` (then delivered and skipped ones too): a delivered message copied by
    a range typed for another destination's failures would reach its receiver twice, after the
    messages that followed it.

    One transaction: the copies are enqueued oldest original first (so they keep the original
    order behind everything already queued), each original records its copy (``resent_as``)
    and each copy its original (``resent_from``), and one audit entry names every original and
    copy. An item already resent is refused with its copy's id (resend the copy if it failed
    too): a second copy of the same message is never queued by mistake. Pending items are
    refused (they will be sent anyway); so are ids that do not exist.

    Set-based, whatever the count: one read of the originals (locked against a second resend),
    one statement that takes the destinations' enqueue locks and draws the copies' IDs, one
    that inserts every copy and marks every original (``resend_copies`` in ``queue.sql``), one
    audit row: four round trips for 10,000 items, not three per item. Ingest's store
    statement waits on the same enqueue locks, so they are taken only after everything that
    can be computed before them, and held for one statement and the COMMIT
    (``bench/resend.py`` prints the time and ingest's AA latency meanwhile).

    A copy is a new row: an encrypted original is opened with ``payloads`` and the copy sealed
    for its own row ID (an envelope opens only in the row it was sealed for); the sealing runs
    between the two statements, under the locks (the IDs must be drawn under them).

    Raises:
        PayloadKeysMissing, PayloadUnreadable: an original is an envelope this codec cannot
            open; nothing is queued.
    """
    ids = sorted(set(item_ids))
    every = sorted(set(ids).union(*(range(a, b + 1) for a, b in ranges)))
    codec = payloads or PayloadCodec()
    states = RESENDABLE_FINISHED if include_delivered else RESENDABLE
    async with conn.transaction():
        await conn.execute(Q["synchronous_commit"])
        rows = await fetch_all(conn, Q["get_for_resend"], {"ids": every}, row=dict_row)
        chosen, refused, skipped = _choose(rows, ids, ranges, states)
        left_out = tuple(sorted(skipped.items()))
        if not chosen:
            return ResendOutcome((), tuple(refused), left_out)
        originals = [int(r["id"]) for r in chosen]
        plain = [
            await codec.open(int(r["seal_id"]), str(r["seal_scope"]), bytes(r["payload"]))
            for r in chosen
        ]
        keys = [",".join(codec.index_keys(p)) for p in plain]
        destinations = sorted({r["destination"] for r in chosen})
        for destination in destinations:  # sorted: the order every enqueue takes the locks in
            # the messages accepted before this resend go first: pulled under the same lock
            await pull_all(conn, destination)
        drawn = await fetch_all(
            conn,
            Q["lock_and_draw_ids"],
            {"destinations": destinations, "n": len(chosen)},
            row=dict_row,
        )
        new_ids = [int(r["id"]) for r in drawn]
        stored = plain
        if codec.enabled:
            stored = await codec.seal_many(
                [(i, r["destination"], p) for i, r, p in zip(new_ids, chosen, plain, strict=True)]
            )
        async with conn.cursor() as cur:  # arrays in binary: the text form hex-escapes payloads
            cur.adapters.register_dumper(list, ListBinaryDumper)
            await cur.execute(
                Q["resend_copies"],
                {
                    "ids": new_ids,
                    "originals": originals,
                    "payloads": stored,
                    "sizes": [len(p) for p in plain],
                    "keys": keys,
                    "channels": [notify.notify_channel(d) for d in destinations],
                    "destinations": destinations,
                },
            )
        copies = list(zip(originals, new_ids, strict=True))
        dest = destinations[0] if len(destinations) == 1 else None
        audited = sorted(i for pair in copies for i in pair)
        await audit.record(conn, who=who, action="resend", destination=dest, ids=audited, why=why)
    return ResendOutcome(tuple(copies), tuple(refused), left_out)


async def resend(
    conn: AsyncConnection[Any],
    item_id: int,
    *,
    who: str,
    why: str | None = None,
    payloads: PayloadCodec | None = None,
    include_delivered: bool = False,
) -> int | None:
    """Put a copy of one failed item (any finished one with ``include_delivered``) at the
    tail of its queue (see :func:`resend_many`); return the copy's id, or None when the item
    does not exist.

    Raises:
        Conflict: the item is still pending, was already resent, or is delivered or skipped
            without ``include_delivered`` (the message says which).
    """
    outcome = await resend_many(
        conn, [item_id], who=who, why=why, payloads=payloads, include_delivered=include_delivered
    )
    if outcome.copies:
        return outcome.copies[0][1]
    [(_, why_not)] = outcome.refused
    if why_not == "no such item":
        return None
    if why_not.startswith("still pending"):
        raise Conflict(f"item {item_id} is still pending; only finished items can be resent")
    if not why_not.startswith("already"):
        state = why_not.split(" ", 1)[0]
        raise Conflict(
            f"item {item_id} was {state}: only failed items are resent without"
            " --include-delivered"
            + (" (its receiver would get it again)" if state == "delivered" else "")
        )
    raise Conflict(f"item {item_id} was {why_not}: resend the copy if it failed too")


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
    """Delete finished items older than a cutoff per state, in batches of at most 5,000 rows,
    under the purge singleton (:func:`purge_held`, :func:`purge_rows`).

    Args:
        cutoffs: ``{"delivered": t1, "failed": t2, "skipped": t3}``; states left out are kept.
            ``pending`` is refused: purge never touches pending items.
        batch: rows per transaction (1..5000).

    Returns:
        Rows deleted per state, or None when another purge holds the purge lock (singleton).

    Raises:
        Invalid: a cutoff for ``pending`` or an unknown state, or a batch out of range.
    """
    _check_cutoffs(cutoffs, batch)
    async with purge_held(conn) as renew:
        if renew is None:
            return None
        return await purge_rows(conn, cutoffs, batch=batch, renew=renew)


def _check_cutoffs(cutoffs: dict[str, datetime], batch: int) -> None:
    for state in cutoffs:
        if state not in FINISHED_STATES:
            raise Invalid(f"purge only removes finished states {FINISHED_STATES}, not {state!r}")
    if not 1 <= batch <= PURGE_BATCH_MAX:
        raise Invalid(f"batch must be 1..{PURGE_BATCH_MAX}, got {batch}")


#: Take the purge singleton again (renewed); False when another purge took it over meanwhile.
Renew = Callable[[], Awaitable[bool]]


@asynccontextmanager
async def purge_held(
    conn: AsyncConnection[Any], holder: str | None = None
) -> AsyncIterator[Renew | None]:
    """Hold the purge singleton (one purge at a time) for the block: yields a function that
    renews it (to call between batches: a purge that died holds it no longer than its ttl),
    or None when another purge holds it. Released at the end. ``holder``: this process's
    identity (:func:`~inturn.worker.store.lease.holder_id` when None); a run tried again with
    the same one takes its own singleton again, even when the release of the failed run was
    refused too."""
    holder = holder or holder_id("purge")
    held = await locks.take_singleton(conn, "purge", holder)
    if held is None:
        yield None
        return
    current = [held]

    async def renew() -> bool:
        renewed = await locks.take_singleton(conn, "purge", holder)
        if renewed is None:
            return False  # another purge took over meanwhile: it does the rest
        current[0] = renewed
        return True

    try:
        yield renew
    finally:
        if not (conn.closed or conn.broken):
            await locks.release_singleton(conn, current[0])


async def purge_rows(
    conn: AsyncConnection[Any],
    cutoffs: dict[str, datetime],
    *,
    batch: int,
    renew: Renew,
) -> dict[str, int]:
    """Delete finished rows of the hot table older than a cutoff per state, in batches (the
    rule of migration 0031: rows a person still needs are kept); ``renew`` is called between
    batches (False: stop). Since the history (migration 0034) moves finished rows out of the
    hot table after minutes, what this finds is what the move leaves: rows stored before the
    channel log past their age, and kept rows once no longer kept.

    Raises:
        Invalid: a cutoff for ``pending`` or an unknown state, or a batch out of range.
    """
    _check_cutoffs(cutoffs, batch)
    counts = {state: 0 for state in cutoffs}
    for state, cutoff in cutoffs.items():
        while True:
            cur = await conn.execute(
                Q["purge_batch"], {"state": state, "cutoff": cutoff, "batch": batch}
            )
            counts[state] += cur.rowcount
            if cur.rowcount < batch:
                break
            if not await renew():
                return counts
    return counts


async def purge_count(conn: AsyncConnection[Any], cutoffs: dict[str, datetime]) -> dict[str, int]:
    """What :func:`purge` would delete per state with these ``cutoffs``, deleting nothing (the
    same rule, migration 0031: rows a pending worklist item names are kept).

    Raises:
        Invalid: a cutoff for ``pending`` or an unknown state.
    """
    for state in cutoffs:
        if state not in FINISHED_STATES:
            raise Invalid(f"purge only removes finished states {FINISHED_STATES}, not {state!r}")
    counts: dict[str, int] = {}
    for state, cutoff in cutoffs.items():
        row = await fetch_one(
            conn, Q["purge_count"], {"state": state, "cutoff": cutoff}, row=dict_row
        )
        counts[state] = int(row["n"]) if row else 0
    return counts
