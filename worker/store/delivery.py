"""The worker's statements on the delivery queue: the head, its marks (delivered, retry,
failed), the sender fingerprint, and the lanes' window and take. The hot path of a delivery.

Every function takes the worker's open ``psycopg.AsyncConnection`` in autocommit mode and runs
one statement (a named query of ``sql/queue.sql``; rows read by column name). Items join the
queue through :mod:`inturn.worker.store.queue`; a worker is woken through
:mod:`inturn.worker.store.notify`.

Ordering rests on three rules; the first and the last are enforced here, the second where items
are enqueued:

* the head is the oldest pending item whether or not it is due (:func:`next_head`);
* enqueues for one destination commit in id order
  (:func:`inturn.worker.store.queue.enqueue`);
* there is no in-flight state: the head stays pending while being sent, so a crash leaves it to
  be sent again by the next lease holder (at most one duplicate, never a reorder).

Fencing. Every statement a worker runs that reads the head or writes a row takes its ``lease``
(:class:`inturn.worker.store.lease.Lease`, keyword) and is guarded in SQL by the lease row: the
same destination, holder and epoch, renewed to its ``ttl_seconds`` by the same statement (no
extra round trip; the guard is one fragment of ``sql/queue.sql``, ``lease_guard``, composed into
each statement when the file is loaded). The per-message statements (:func:`next_head`,
:func:`succeeded_next`, :func:`pull`, :func:`pending_window`, :func:`take`) take ``renew``:
False checks holder and epoch under a share lock of the lease row and writes nothing to it,
and is sent without the guard's renewing UPDATE (:data:`CHECKING`; the worker renews only once
its renewal is due: :mod:`inturn.worker.drain.holding`); a
takeover and a guarded statement are serialised on that row either way. A guard that fails
changes nothing and raises :class:`~inturn.worker.store.lease.LeaseLost`. A lease that expired
but that nobody took over is renewed by its holder's next renewing statement (and still passes
a check): nobody else can have sent meanwhile, since a takeover raises the epoch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.errors import Invalid
from inturn.worker.store.lease import Lease, LeaseLost
from inturn.worker.store.model import ExpectedReply, Head, Item, Pending, Sendable
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("queue.sql")

#: The line of head, succeeded_next(_expecting) and take that reads a slim row's log payload
#: from its own partition (inturn_log_payload_rows, migration 0057).
_LOOKUP = "LEFT JOIN LATERAL inturn_log_payload_rows(h.log_id) AS m ON TRUE"
#: The same statements for a database before migration 0057 (an upgrade in place: a worker
#: started before ``inturn migrate``): the join of queue.sql's log_payload_joined in place of
#: the lookup, which every database has.
_JOINED = Q["log_payload_joined"][Q["log_payload_joined"].rindex("LEFT JOIN LATERAL") :].rstrip(";")
BEFORE_0057: dict[str, LiteralString] = {
    name: Q[name].replace(_LOOKUP, _JOINED)
    for name in ("head", "succeeded_next", "succeeded_next_expecting", "take")
}


#: The per-message statements that take ``renew``.
RENEWABLE = (
    "head", "succeeded_next", "succeeded_next_expecting", "pull_lock", "pull", "pull_unlinked",
    "pending_window", "take",
)  # fmt: skip


def checking(query: str) -> LiteralString:
    """``query`` (composed with ``lease_guard``) without the guard's renewing half: its
    ``lease`` CTE is the share-locked check alone, as the guard reads with ``renew`` false.

    The same rows, locks and writes as the guard with ``renew`` false (whose ``renewed`` UPDATE
    then matches nothing), and the same parameters; but a statement carrying an UPDATE of the
    lease that runs nothing still pays for it at each execution (the executor opens the table
    and builds the modify node and the UNION: about 35,000 of the backend's instructions a
    message, issue 43). The worker sends this form between its renewals.

    Raises:
        ValueError: ``query`` holds no lease guard of that shape.
    """
    start = query.index("renewed AS (\n")
    union = "    SELECT held FROM renewed\n    UNION ALL\n    SELECT 1 FROM"
    end = query.index(union, start) + len(union)
    return query[:start] + "lease AS (\n    SELECT 1 AS held FROM" + query[end:]


#: The per-message statements (and their forms before migration 0057) that only check the
#: lease: sent with ``renew`` false.
CHECKING: dict[str, LiteralString] = {name: checking(Q[name]) for name in RENEWABLE}
CHECKING_BEFORE_0057: dict[str, LiteralString] = {
    name: checking(query) for name, query in BEFORE_0057.items()
}


def _statement(name: str, renew: bool, before_0057: bool = False) -> LiteralString:
    """The text of statement ``name``: renewing the lease, or (``renew`` false) checking it
    only; ``before_0057``: its form for a database before migration 0057."""
    if before_0057:
        return BEFORE_0057[name] if renew else CHECKING_BEFORE_0057[name]
    return Q[name] if renew else CHECKING[name]


def _before_0057(exc: psycopg.errors.UndefinedFunction, conn: AsyncConnection[Any]) -> bool:
    """Whether ``exc`` says the database has no inturn_log_payload_rows yet (migration 0057)
    and the statement may be sent again in its joined form (the connection is in no
    transaction, which the failed statement would have aborted)."""
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return "inturn_log_payload" in str(exc) and idle


HeadResult = tuple[Head | None, float | None]

#: The wait :func:`next_head` gives for a destination on hold (``queue suspend``, the console, a
#: restore found): no head until a person resumes it, however long (a resume wakes the worker).
ON_HOLD = math.inf


def _head_result(row: Mapping[str, Any] | None, destination: str) -> HeadResult:
    """The head of ``destination`` in a row of ``head`` or a delivered mark (the columns of a
    :class:`~inturn.worker.store.model.Sendable`, its payload, trace context and wait)."""
    if row is None or row["id"] is None:
        return None, None
    wait = row["wait_seconds"]
    if wait > 0:
        return None, float(wait)
    item = Sendable(
        row["id"], row["channel"], destination, row["control_id"], row["message_type"],
        row["attempts"],
    )  # fmt: skip
    seal = (int(row["seal_id"]), str(row["seal_scope"]))
    return Head(item, row["payload"], row["traceparent"], seal=seal), None


def _next_result(row: Mapping[str, Any], destination: str) -> HeadResult:
    """:func:`_head_result` of a row of ``head`` or a delivered mark's next head, with
    ``(None, ON_HOLD)`` when nothing was read because the destination is on hold."""
    if row["id"] is None and row.get("on_hold"):
        return None, ON_HOLD
    return _head_result(row, destination)


def _guard(destination: str, lease: Lease, renew: bool = True) -> dict[str, Any]:
    """The lease guard's parameters (``destination``, ``holder``, ``epoch``, and ``renew``:
    whether the statement renews the lease, or only checks it).

    Raises:
        Invalid: ``lease`` is another destination's.
    """
    if lease.destination != destination:
        raise Invalid(f"the lease of {lease.destination} does not cover {destination}")
    return {
        "destination": destination,
        "holder": lease.holder,
        "epoch": lease.epoch,
        "renew": renew,
    }


async def next_head(
    conn: AsyncConnection[Any],
    destination: str,
    *,
    after: int = 0,
    lease: Lease,
    renew: bool = True,
) -> HeadResult:
    """Return the head of ``destination`` if it is due, else how long to wait; renews ``lease``
    (with ``renew``; else only checks it).

    Args:
        after: a keyset bound: only items with a larger id are considered. A worker passes the
            id it finished last (everything at or below it is finished, because enqueues commit
            in id order); 0 considers every item.
        lease: the worker's lease of ``destination`` (see the module docstring).

    Returns:
        ``(head, None)`` when the oldest pending item is due now; ``(None, seconds)`` when it is
        backing off (nothing behind it may go first); ``(None, ON_HOLD)`` (infinite seconds)
        when the destination is on hold, whatever waits; ``(None, None)`` when nothing is
        pending (the channel log may still hold messages not pulled).

    Raises:
        LeaseLost: another holder took the destination over; nothing was read.
        Invalid: ``lease`` is another destination's.
    """
    params = {**_guard(destination, lease, renew), "after": after}
    try:
        row = await fetch_one(conn, _statement("head", renew), params, row=dict_row, binary=True)
    except psycopg.errors.UndefinedFunction as exc:
        if not _before_0057(exc, conn):
            raise
        row = await fetch_one(
            conn, _statement("head", renew, True), params, row=dict_row, binary=True
        )  # the payload
    if row is None:
        raise LeaseLost(lease, "reading the head")
    return _next_result(row, destination)


#: Log rows a pull copies at most (one statement; a longer backlog takes several pulls).
PULL_LIMIT = 500


@dataclass(frozen=True)
class Pulled:
    """What one pull did: ``count`` rows added to the queue, the cursor now at ``position``
    (a log id; everything of the channel at or below it is pulled) and ``more``: the limit was
    reached, so more may be waiting in the log."""

    count: int
    position: int
    more: bool


async def pull(
    conn: AsyncConnection[Any],
    destination: str,
    channel: str,
    *,
    lease: Lease,
    limit: int = PULL_LIMIT,
    renew: bool = True,
) -> Pulled:
    """Copy the channel log's messages routed to ``destination`` past its cursor into its
    queue, as slim rows in log order, and move the cursor (docs/explanation/storage-layout.md),
    in one transaction under the destination's enqueue lock; renews ``lease`` (with ``renew``;
    else only checks it).

    Args:
        channel: the destination's ingest channel (the log it reads).
        limit: at most this many rows (1 or more).

    Raises:
        LeaseLost: another holder took the destination over; nothing was pulled.
        Invalid: ``lease`` is another destination's, or ``limit`` < 1.
    """
    if limit < 1:
        raise Invalid(f"a pull takes at least 1 row, not {limit}")
    guard = _guard(destination, lease, renew)
    params = {**guard, "channel": channel, "limit": limit}
    try:
        row = await _pull_once(conn, guard, params, lease, "pull")
    except psycopg.errors.UndefinedColumn:
        # a database before migration 0041 (an upgrade in place): no re-send links in the log
        # yet, so none to make; tried again at the next pull
        row = await _pull_once(conn, guard, params, lease, "pull_unlinked")
    count = int(row["pulled"])
    return Pulled(count, int(row["position"]), count >= limit)


async def _pull_once(
    conn: AsyncConnection[Any],
    guard: dict[str, Any],
    params: dict[str, Any],
    lease: Lease,
    name: str,
) -> dict[str, Any]:
    renew = bool(guard["renew"])
    async with conn.transaction():
        if await fetch_one(conn, _statement("pull_lock", renew), guard, row=dict_row) is None:
            raise LeaseLost(lease, "pulling from the channel log")
        row = await fetch_one(conn, _statement(name, renew), params, row=dict_row)
        if row is None or row["held"] is None:
            raise LeaseLost(lease, "pulling from the channel log")
    return row


async def make_due(conn: AsyncConnection[Any], destination: str, *, lease: Lease) -> bool:
    """Make ``destination``'s head due now (a probe found its receiver reachable again); no
    attempt is recorded. Returns whether it was waiting. Renews ``lease``.

    Raises:
        LeaseLost: another holder took the destination over; nothing changed.
    """
    row = await fetch_one(conn, Q["make_due"], _guard(destination, lease), row=dict_row)
    if row is None or not row["held"]:
        raise LeaseLost(lease, "making the head due")
    return bool(row["changed"])


async def make_due_unreachable(
    conn: AsyncConnection[Any], destination: str, *, lease: Lease
) -> list[int]:
    """Make every pending row of ``destination`` held for an unreachable receiver due now (a
    probe found it reachable again; the lanes' counterpart of :func:`make_due`); rows backing
    off after a refusal keep their backoff, no attempt is recorded. Returns the ids made due.
    Renews ``lease``.

    Raises:
        LeaseLost: another holder took the destination over; nothing changed.
    """
    row = await fetch_one(conn, Q["make_due_unreachable"], _guard(destination, lease), row=dict_row)
    if row is None or not row["held"]:
        raise LeaseLost(lease, "making the held rows due")
    return [int(i) for i in row["ids"] or ()]


async def poll_head(conn: AsyncConnection[Any], destination: str) -> tuple[int | None, bool]:
    """The id of ``destination``'s head (None: nothing pending or on hold) and whether it is due:
    how a worker behind a pooler, which cannot LISTEN, looks for work between head queries.

    A read that changes nothing and reads no payload: nothing is sent on its word (the guarded
    :func:`next_head` comes next), so it needs no lease.
    """
    row = await fetch_one(conn, Q["poll_head"], {"destination": destination}, row=dict_row)
    if row is None:
        return None, False
    return int(row["id"]), bool(row["due"])


async def succeeded_next(
    conn: AsyncConnection[Any],
    head: Sendable,
    attempts: int,
    expecting: Sequence[ExpectedReply] = (),
    *,
    lease: Lease,
    renew: bool = True,
) -> tuple[float | None, HeadResult]:
    """Mark ``head`` delivered and return the next head, in one statement (one round trip);
    renews ``lease`` (with ``renew``; else only checks it).

    ``expecting``: the replies the delivered order now waits for (``spec.replies``), recorded
    in ``inturn_order_expectation`` by the same statement, so only if the mark is written
    (``succeeded_next_expecting``; without any, ``succeeded_next``, which inserts nothing).

    Committed synchronously like :func:`succeeded`. Returns ``(waited_seconds, next)`` where
    ``waited_seconds`` is None when ``head`` was no longer pending, and ``next`` is as from
    :func:`next_head` with ``after=head.id``.

    Raises:
        LeaseLost: another holder took the destination over; nothing was marked or recorded.
    """
    destination = head.destination
    params = _guard(destination, lease, renew)
    params["id"] = head.id
    params["attempts"] = attempts
    name = "succeeded_next"
    if expecting:
        params |= _expected_params(expecting)
        name = "succeeded_next_expecting"
    try:
        row = await fetch_one(conn, _statement(name, renew), params, row=dict_row, binary=True)
    except psycopg.errors.UndefinedFunction as exc:
        # before migration 0057 the statement failed whole: nothing was marked
        if not _before_0057(exc, conn):
            raise
        query = _statement(name, renew, True)
        row = await fetch_one(conn, query, params, row=dict_row, binary=True)
    assert row is not None  # the statement always returns one row
    if row["held"] is None:
        raise LeaseLost(lease, f"marking id={head.id} delivered")
    waited = row["waited_seconds"]
    return (None if waited is None else float(waited)), _next_result(row, destination)


def _expected_params(expecting: Sequence[ExpectedReply]) -> dict[str, Any]:
    """The ``keys``, ``digests``, ``channels``, ``types`` and ``within`` arrays of the replies
    ``expecting`` (``spec.replies``) for the delivered marks' ``unnest``."""
    opened = list(expecting)
    return {
        "keys": [e.key for e in opened],
        "digests": [e.digest for e in opened],
        "channels": [e.channel for e in opened],
        "types": [",".join(e.reply_types) for e in opened],
        "within": [e.within_seconds for e in opened],
    }


async def _guarded(
    conn: AsyncConnection[Any], name: str, params: dict[str, Any], lease: Lease, what: str
) -> Mapping[str, Any]:
    """Run the guarded statement ``name`` (it returns one row with ``held``).

    Raises:
        LeaseLost: the guard failed: nothing changed.
    """
    row = await fetch_one(conn, Q[name], params, row=dict_row)
    assert row is not None  # the statement always returns one row
    if not row["held"]:
        raise LeaseLost(lease, what)
    return row


async def retry(
    conn: AsyncConnection[Any],
    item_id: int,
    attempts: int,
    delay_seconds: float,
    cause: str,
    *,
    lease: Lease,
) -> bool:
    """Record a failed attempt: ``attempts`` so far, next attempt in ``delay_seconds``.

    ``cause`` becomes ``last_error``, and ``reason`` if it was still empty. Returns False when
    the item is no longer pending (skipped or erased meanwhile).

    Raises:
        LeaseLost: another holder took the destination over; nothing changed.
    """
    params = {
        **_guard(lease.destination, lease),
        "id": item_id,
        "attempts": attempts,
        "delay_seconds": delay_seconds,
        "cause": cause,
    }
    row = await _guarded(
        conn, "retry", params, lease, f"recording a failed attempt of id={item_id}"
    )
    return bool(row["changed"])


async def reserve_sequence(conn: AsyncConnection[Any], item_id: int, *, lease: Lease) -> int | None:
    """The MSH-13 sequence number of pending item ``item_id`` (``spec.profile.sequenceNumbers``,
    HL7 v2 chapter 2, sequence number protocol): the number it was given at an earlier attempt,
    else its destination's next one (1 first), recorded with it in the same statement. A retry,
    a restart, a takeover or another lane sends the same number again; no two messages of a
    destination are given the same one. Called only once the profile has shaped the message,
    so a message it refuses spends no number.

    Returns:
        The number (>= 1), or None when the item is no longer pending (skipped or erased).

    Raises:
        LeaseLost: another holder took the destination over; nothing changed.
    """
    params = {**_guard(lease.destination, lease), "id": item_id}
    row = await _guarded(
        conn, "reserve_sequence", params, lease, f"reserving the sequence number of id={item_id}"
    )
    number = row["number"]
    return None if number is None else int(number)


async def sender_changed(
    conn: AsyncConnection[Any],
    destination: str,
    fingerprint: str,
    *,
    lease: Lease,
    starting: bool = False,
) -> tuple[bool, int]:
    """Record the sender fingerprint of a worker that took the destination's lock.

    When the last worker of the destination recorded another fingerprint (its sender settings
    were changed: address, TLS, headers), or when ``starting`` (this worker process takes the
    destination for the first time, so any backoff on its rows was persisted by a process that
    stopped or died), every pending item waiting out a backoff is made due now: the head is
    tried at once; its attempts, ``last_error`` and ``reason`` are kept for the audit. The same
    process taking the lease again (after a lost connection) keeps its own backoff.

    Returns:
        ``(changed, made_due)``: whether the settings changed, and how many items were made due.

    Raises:
        LeaseLost: another holder took the destination over; nothing was recorded.
    """
    params = {**_guard(destination, lease), "fingerprint": fingerprint, "starting": starting}
    row = await _guarded(conn, "sender_changed", params, lease, "recording the sender")
    return bool(row["changed"]), int(row["made_due"])


async def succeeded(
    conn: AsyncConnection[Any], item_id: int, attempts: int, *, lease: Lease
) -> float | None:
    """Mark an item delivered; return seconds from enqueue to delivery.

    One autocommit statement. It must commit synchronously: a delivered mark lost in a database
    crash would resend earlier messages after later ones. The connections this package opens
    (:func:`~inturn.worker.store.connect.connect_worker`, the pools) force
    ``synchronous_commit=on`` for their whole session, which saves a round trip per message.

    Returns None when the item was no longer pending (skipped or erased during the attempt).

    Raises:
        LeaseLost: another holder took the destination over; nothing changed.
    """
    params = {**_guard(lease.destination, lease), "id": item_id, "attempts": attempts}
    row = await _guarded(conn, "succeeded", params, lease, f"marking id={item_id} delivered")
    return None if row["waited_seconds"] is None else float(row["waited_seconds"])


async def gave_up(
    conn: AsyncConnection[Any], item_id: int, attempts: int, cause: str, *, lease: Lease
) -> bool:
    """Mark an item failed (attempts exhausted or a ``fail`` ACK policy); the next head goes.

    One statement, synchronous like :func:`succeeded`. Returns False when the item was no
    longer pending.

    Raises:
        LeaseLost: another holder took the destination over; nothing changed.
    """
    params = {
        **_guard(lease.destination, lease),
        "id": item_id,
        "attempts": attempts,
        "cause": cause,
    }
    row = await _guarded(conn, "gave_up", params, lease, f"marking id={item_id} failed")
    return bool(row["changed"])


# --- lanes (spec.lanes.count > 1) -------------------------------------------------------------


async def pending_window(
    conn: AsyncConnection[Any],
    destination: str,
    *,
    limit: int,
    after: int = 0,
    lease: Lease,
    renew: bool = True,
) -> list[Pending]:
    """The oldest pending items of ``destination`` (at most ``limit``), due or not, in id order,
    with their lane keys and no payload: the window the lanes' scheduler looks over
    (:mod:`inturn.worker.drain.lanes`). Empty while the destination is on hold. Renews ``lease``
    (with ``renew``; else only checks it).

    Args:
        limit: the window bound (``spec.lanes.window``), at least 1.
        after: a keyset bound: only ids above it (0: all), to read the tail of a window.
        lease: the worker's lease of ``destination`` (see the module docstring).

    Raises:
        LeaseLost: another holder took the destination over; nothing was read.
        Invalid: ``limit`` is below 1, or ``lease`` is another destination's.
    """
    if limit < 1:
        raise Invalid("limit must be at least 1")
    params = {**_guard(destination, lease, renew), "after": after, "limit": limit}
    rows = await fetch_all(conn, _statement("pending_window", renew), params, row=dict_row)
    if not rows:
        raise LeaseLost(lease, "reading the lanes' window")
    return [
        Pending(
            r["id"], tuple(r["patient_keys"] or ()), r["attempts"], r["wait_seconds"], r["size"]
        )
        for r in rows
        if r["id"] is not None
    ]


@dataclass(frozen=True)
class Delivered:
    """An answer to mark delivered with :func:`take`: the item, its attempts (this one
    included) and the replies it now waits for (``spec.replies``)."""

    item: Sendable
    attempts: int
    expecting: Sequence[ExpectedReply] = ()


async def mark_remembered(
    conn: AsyncConnection[Any],
    destination: str,
    delivered: Sequence[Delivered],
    *,
    lease: Lease,
) -> dict[int, float | None]:
    """Mark ``delivered`` delivered in one statement: what a worker process remembered its
    receiver acknowledged while the delivered marks did not commit (its session was lost in
    between: a database restart, a failover, a network cut). Only rows still pending are
    marked (one already delivered, or skipped, drained or erased meanwhile, is left as it is),
    with the replies each now waits for; the marks commit synchronously before this returns.
    Renews ``lease``.

    Returns:
        Seconds from enqueue to delivery per id marked (ids left as they were are absent).

    Raises:
        LeaseLost: another holder took the destination over; nothing was marked.
    """
    opened = [(d.item.id, e) for d in delivered for e in d.expecting]
    params = {
        **_guard(destination, lease),
        "ids": [d.item.id for d in delivered],
        "attempts": [d.attempts for d in delivered],
        "exp_ids": [i for i, _ in opened],
        "keys": [e.key for _, e in opened],
        "digests": [e.digest for _, e in opened],
        "channels": [e.channel for _, e in opened],
        "types": [",".join(e.reply_types) for _, e in opened],
        "within": [e.within_seconds for _, e in opened],
    }
    row = await fetch_one(conn, Q["mark_remembered"], params, row=dict_row)
    if row is None:
        raise LeaseLost(lease, "marking remembered deliveries")
    return {int(i): None if w is None else float(w) for i, w in row["done"]}


async def take(
    conn: AsyncConnection[Any],
    destination: str,
    ids: Sequence[int],
    *,
    delivered: Sequence[Delivered] = (),
    lease: Lease,
    renew: bool = True,
) -> tuple[dict[int, float | None], list[Head]]:
    """Mark ``delivered`` delivered, then return the heads (with payloads and lane keys) of
    those of ``ids`` still pending, in id order, in one statement: one round trip per turn of
    the lanes. The marks commit (synchronously, like :func:`succeeded`) before this returns, so
    before any of the heads is sent. An item skipped or erased since the window was read is
    left out of the heads; nothing is returned while the destination is on hold. Renews
    ``lease`` (with ``renew``; else only checks it).

    Returns:
        ``(waited, heads)``: seconds from enqueue to delivery per marked id (an item gone, i.e.
        erased, is absent), and the heads.

    Raises:
        LeaseLost: another holder took the destination over; nothing was marked or read.
        Invalid: ``lease`` is another destination's.
    """
    opened = [(d.item.id, e) for d in delivered for e in d.expecting]
    params = {
        **_guard(destination, lease, renew),
        "ids": list(ids),
        "done_ids": [d.item.id for d in delivered],
        "done_attempts": [d.attempts for d in delivered],
        "exp_ids": [i for i, _ in opened],
        "keys": [e.key for _, e in opened],
        "digests": [e.digest for _, e in opened],
        "channels": [e.channel for _, e in opened],
        "types": [",".join(e.reply_types) for _, e in opened],
        "within": [e.within_seconds for _, e in opened],
    }
    try:
        rows = await fetch_all(conn, _statement("take", renew), params, row=dict_row)
    except psycopg.errors.UndefinedFunction as exc:
        if not _before_0057(exc, conn):
            raise
        rows = await fetch_all(conn, _statement("take", renew, True), params, row=dict_row)
    if not rows:
        what = "marking delivered and taking" if delivered else "taking"
        raise LeaseLost(lease, f"{what} the lanes' messages")
    waited = {int(i): None if w is None else float(w) for i, w in rows[0]["done"]}
    heads = [
        Head(
            item=Item.from_row(r),
            payload=bytes(r["payload"]),
            traceparent=r.get("traceparent"),
            keys=tuple(r["patient_keys"] or ()),
            seal=(int(r["seal_id"]), str(r["seal_scope"])),
        )
        for r in rows
        if r["id"] is not None
    ]
    return waited, heads
