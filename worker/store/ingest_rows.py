"""Ingest's statements of the release before the channel log (``sql/ingest.sql``,
``rows_*``): one ``inturn_delivery`` row per message and destination, each with its payload
(sealed per row with payload keys). Used only for the minutes of an upgrade in place, while
migration 0041 (the log's ingest) is not applied yet: ingest switches to the channel log
(:mod:`inturn.worker.store.ingest`) once it is (:func:`log_ready`), so that a new ingest
started before ``inturn migrate`` keeps accepting (docs/explanation/storage-layout.md).

:class:`~inturn.worker.store.model.StoreResult` ``ids`` are delivery row ids here, one per
destination, where the log's are one log id per message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper

from inturn.worker.crypto import envelope
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import Invalid
from inturn.worker.store.identifiers import keys_text
from inturn.worker.store.ingest import DEFAULT_DELIVERED_WINDOW_SECONDS, Q, compact_query, one_row
from inturn.worker.store.model import Earlier, Message, StoreResult
from inturn.worker.store.notify import notify_channel

#: The statements as sent (``sql/ingest.sql``, compacted).
STORE, RESERVE, STORE_SEALED = (
    compact_query(Q[n]) for n in ("rows_store", "rows_reserve", "rows_store_sealed")
)


async def log_ready(conn: AsyncConnection[Any]) -> bool:
    """Whether the database has the channel log's ingest (migration 0041): its function
    ``inturn_latest_copy`` exists. Needs no privilege."""
    cur = await conn.execute(Q["log_ready"])
    row = await cur.fetchone()
    return bool(row and row[0])


async def store_messages(conn: AsyncConnection[Any], params: dict[str, Any]) -> dict[str, Any]:
    """Run the store statement (see ``sql/ingest.sql``, ``store``) with ``params`` and return
    its one row: ``fresh`` (1-based positions stored as new messages), ``ids``, ``repeated``
    (JSON: ``[position, destination, earlier id, earlier state, queued]`` per message received
    again and destination), ``reused`` (positions whose control ID was seen with another
    payload). Arrays are sent in binary (the text form would
    hex-escape every payload in Python)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(STORE, params)
        row = await cur.fetchone()
    assert row is not None
    return row


async def store_batch(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    destinations: Sequence[str],
    messages: Sequence[Message],
    window_seconds: float,
    delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
    payloads: PayloadCodec | None = None,
) -> list[StoreResult]:
    """Store ``messages`` for every one of ``destinations`` in one transaction (one statement;
    two with payload keys, see :func:`store_sealed`).

    The statement (``store`` in ``ingest.sql``) runs in autocommit mode, so its implicit COMMIT
    (with ``synchronous_commit`` on, which the pool's connections set) has happened when the
    result arrives: one round trip. Its steps are ordered by data dependencies, not by text:

    1. ``remembered``: one duplicate-window row per message (when the window is on), upserted
       on ``inturn_received_key``. A new message, or one whose row is older than the window
       (recycled), is stored as new (``repeats`` 0). An identical copy inside the window (the
       same channel, MSH-10 and bytes) only counts itself (``repeats`` + 1): it is a message
       *received again*. A concurrent copy waits on the unique index until the first commits.
    2. ``latest``: for a message received again, per destination, its latest earlier copy
       there (the newest row of the channel, MSH-10 and destination enqueued since the window
       row's ``received_at``: the original, a person's ``queue resend`` or an earlier re-send;
       a message's rows share the transaction's ``now()`` with its window row). The new copy is
       acknowledged without being queued while that copy is pending, or was delivered within
       ``delivered_seconds`` (the lost-ACK window: a sender that lost our ACK sends again within
       minutes). It is queued as a re-send, linked to that copy (``resent_from`` on the new
       row, ``resent_as`` on the earlier one, as ``queue resend`` links them), when that copy
       failed, was skipped, was delivered longer ago, or is gone (erased, purged: nothing to
       link). A copy whose window row another transaction counted after this statement's
       snapshot (``prior`` disagrees with ``remembered``) arrived at the same moment as another:
       it is never queued, so that two replicas given the same re-send queue it once.
    3. ``locked``: the per-destination enqueue locks in sorted order, with the delivery queue's
       own function (``enqueue_lock`` in ``queue.sql``, as
       :func:`inturn.worker.store.queue.enqueue_in_transaction` takes it), so that id order is
       commit order per destination. The aggregate returns only once every lock is held, and
       only when at least one row is to be inserted.
    4. ``inserted``: one ``inturn_delivery`` row per new message and destination and one per
       re-send, in message order then destination order (so ids ascend in that order), each
       with its message's identifier index keys (:mod:`inturn.worker.store.identifiers`): the
       index is written in the same transaction as the message. The earlier copies re-sent
       are marked (``resent_as``) by the insertion itself (migration 0032's trigger, audited).
    5. ``notified``: one NOTIFY per destination, delivered at COMMIT.

    The statement also reports, per message, whether its MSH-10 was used on the channel inside
    the window by a message with different bytes. A destination's lock is held only for the
    server's own work and the commit, never across a round trip to Python. Identical copies
    inside one batch are removed here first (the later ones are duplicates of the first).

    Args:
        conn: an autocommit connection with ``synchronous_commit`` on, outside a transaction.
        channel: the channel all the messages arrived on.
        destinations: ``namespace/name`` values (at least one; repeats are ignored).
        messages: at least one.
        window_seconds: the duplicate window; 0 or less turns duplicate detection off.
        delivered_seconds: the lost-ACK window (see step 2), seconds.

    Returns:
        One :class:`StoreResult` per message, in input order.

    Raises:
        psycopg.Error: nothing of the batch was stored.
        Invalid: no destination or no message.
        RuntimeError: ``conn`` is inside a transaction.
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("store_batch needs an autocommit connection outside a transaction")
    sealing = payloads is not None and payloads.enabled
    # sealed: two statements, so one transaction of them, inside the codec's sealing scope
    # (the keys stay live in the key store until the COMMIT); in clear: one autocommit statement
    scope = payloads.sealing() if sealing and payloads is not None else contextlib.nullcontext()
    async with scope, conn.transaction() if sealing else contextlib.nullcontext():
        return await store_statement(
            conn,
            channel=channel,
            destinations=destinations,
            messages=messages,
            window_seconds=window_seconds,
            delivered_seconds=delivered_seconds,
            payloads=payloads,
        )


async def store_statement(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    destinations: Sequence[str],
    messages: Sequence[Message],
    window_seconds: float,
    delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
    payloads: PayloadCodec | None = None,
) -> list[StoreResult]:
    """Run the ``store`` statement of :func:`store_batch` in ``conn``'s current state: on an
    autocommit connection outside a transaction it commits on its own (what
    :func:`store_batch` checks); inside the caller's transaction it commits with it (an HL7
    batch stored whole, :mod:`inturn.worker.ingest.envelope`). Same arguments, results and
    errors (:class:`~inturn.worker.errors.Invalid` for no destination or no message). With
    ``payloads`` that seal, the caller's transaction is required: see :func:`store_sealed`.
    """
    ordered = sorted(set(destinations))
    if not ordered or not messages:
        raise Invalid("nothing to store")
    remember = window_seconds > 0
    # Identical copies inside one batch: only the first is sent; the others are its duplicates.
    first: dict[tuple[str, bytes], int] = {}
    unique: list[Message] = []
    slot: list[int] = []
    copy: list[bool] = []
    for message in messages:
        key = (message.control_id, message.digest)
        if remember and key in first:
            slot.append(first[key])
            copy.append(True)
            continue
        first[key] = len(unique)
        slot.append(len(unique))
        copy.append(False)
        unique.append(message)
    if payloads is not None and payloads.enabled:
        row = await store_sealed(
            conn,
            channel=channel,
            ordered=ordered,
            unique=unique,
            remember=remember,
            window_seconds=window_seconds,
            delivered_seconds=delivered_seconds,
            payloads=payloads,
        )
    else:
        row = await store_messages(
            conn,
            _plain_params(channel, ordered, unique, remember, window_seconds, delivered_seconds),
        )
    return _results(row, ordered, unique, slot, copy)


def _plain_params(
    channel: str,
    ordered: Sequence[str],
    unique: Sequence[Message],
    remember: bool,
    window_seconds: float,
    delivered_seconds: float,
) -> dict[str, Any]:
    return {
        "channel": channel,
        "control_ids": [m.control_id for m in unique],
        "message_types": [m.message_type for m in unique],
        "payloads": [m.payload for m in unique],
        "digests": [m.digest for m in unique],
        "patient_keys": [
            keys_text(m.payload) if m.patient_keys is None else m.patient_keys for m in unique
        ],
        "traceparents": [m.traceparent for m in unique],
        "reply_keys": [m.reply_keys for m in unique],
        "window_seconds": float(max(window_seconds, 0.0)),
        "delivered_seconds": float(max(delivered_seconds, 0.0)),
        "remember": remember,
        "destinations": list(ordered),
        "channels": [notify_channel(d) for d in ordered],
    }


def _repeated(row: dict[str, Any]) -> dict[int, list[Earlier]]:
    """The ``repeated`` column of ``store`` or ``reserve``: per 0-based position of a message
    received again, its earlier copies by destination, in destination order."""
    repeated = row["repeated"]
    if isinstance(repeated, str):
        repeated = json.loads(repeated)
    earlier: dict[int, list[Earlier]] = {}
    for n, destination, earlier_id, state, queued in repeated or ():
        earlier.setdefault(int(n) - 1, []).append(
            Earlier(str(destination), earlier_id, state, bool(queued))
        )
    return earlier


def _rows(
    row: dict[str, Any], ordered: Sequence[str], count: int
) -> list[list[tuple[str, int | None]]]:
    """Per unique message, the rows stored for it: ``(destination, resent_from)``, in the
    order their ids ascend (message order, then destination order). A new message has one per
    destination; a message received again one per destination it was queued again for."""
    fresh = {int(n) - 1 for n in row["fresh"] or ()}
    earlier = _repeated(row)
    return [
        [(d, None) for d in ordered]
        if i in fresh
        else [(e.destination, e.id) for e in earlier.get(i, ()) if e.queued]
        for i in range(count)
    ]


def _results(
    row: dict[str, Any],
    ordered: Sequence[str],
    unique: Sequence[Message],
    slot: Sequence[int],
    copy: Sequence[bool],
) -> list[StoreResult]:
    reused = {int(n) - 1 for n in row["reused"] or ()}
    answered = {int(n) - 1 for n in row["answered"] or ()}
    all_ids = [int(i) for i in row["ids"] or ()]
    earlier = _repeated(row)
    wanted = [len(r) for r in _rows(row, ordered, len(unique))]
    if len(all_ids) != sum(wanted):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    by_unique: list[StoreResult] = []
    start = 0
    for i, count in enumerate(wanted):
        chunk = tuple(all_ids[start : start + count])
        start += count
        by_unique.append(
            StoreResult(
                chunk,
                duplicate=not chunk,
                control_id_reused=i in reused,
                answered=i in answered,
                earlier=tuple(earlier.get(i, ())),
            )
        )
    results = []
    for index, is_copy in zip(slot, copy, strict=True):
        result = by_unique[index]
        if is_copy:
            result = StoreResult((), duplicate=True, control_id_reused=result.control_id_reused)
        results.append(result)
    return results


async def store_sealed(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    ordered: Sequence[str],
    unique: Sequence[Message],
    remember: bool,
    window_seconds: float,
    delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
    payloads: PayloadCodec,
) -> dict[str, Any]:
    """Store a batch with its payloads sealed (payload keys given), inside the caller's
    transaction, in two statements: ``reserve`` (window rows, the enqueue locks, then one row
    ID per fresh message and destination, drawn under the locks so that ID order stays commit
    order) and, once the codec has sealed each payload for its row ID and destination (the
    associated data of its envelope), ``store_sealed`` (the rows, NOTIFY, answered orders).
    The locks are held across the one round trip between them and the sealing (microseconds
    per message). No payload in clear reaches the database: ``reserve`` gets sizes, not bytes.

    Returns:
        The row :func:`store_statement` decodes (``fresh``, ``ids``, ``reused``, ``answered``).

    Raises:
        RuntimeError: ``conn`` is not inside a transaction.
        psycopg.Error: nothing was stored (the caller's transaction rolls back).
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        raise RuntimeError("store_sealed runs inside the caller's transaction")
    window = float(max(window_seconds, 0.0))
    # The bulk of the sealing before the enqueue locks (reserve takes them): every payload
    # encrypted for each destination, the keys fetched or made; under the locks only each
    # data key's wrap, bound to the row ID drawn there (microseconds a row).
    keyings = [
        k
        for m in unique
        for k in (
            [m.keying] * len(ordered)
            if m.keying is not None
            else [payloads.destination_keying(d) for d in ordered]
            if m.patient_keys == ""
            else payloads.keyings(m.payload, ordered)
        )
    ]
    bodies = await payloads.seal_bodies([(d, m.payload) for m in unique for d in ordered], keyings)
    body_of = {
        (index, destination): bodies[index * len(ordered) + k]
        for index in range(len(unique))
        for k, destination in enumerate(ordered)
    }
    reserve = {
        "channel": channel,
        "control_ids": [m.control_id for m in unique],
        "digests": [m.digest for m in unique],
        "sizes": [len(m.payload) for m in unique],
        "window_seconds": window,
        "delivered_seconds": float(max(delivered_seconds, 0.0)),
        "remember": remember,
        "destinations": list(ordered),
    }
    got = await one_row(conn, RESERVE, reserve)
    fresh = [int(n) - 1 for n in got["fresh"] or ()]
    drawn = sorted(int(i) for i in got["ids"] or ())
    got["ids"] = drawn
    got["answered"] = None
    rows: list[tuple[int, str, Message]] = []
    resent_from: list[int | None] = []
    sealed: list[bytes] = []
    at = 0
    # message order, then destination order: IDs ascend that way (new messages and re-sends)
    for index, placed in enumerate(_rows(got, ordered, len(unique))):
        for destination, earlier_id in placed:
            if at < len(drawn):
                sealed.append(envelope.bind(body_of[(index, destination)], drawn[at]))
            rows.append((drawn[at] if at < len(drawn) else 0, destination, unique[index]))
            resent_from.append(earlier_id)
            at += 1
    if len(rows) != len(drawn):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    if not rows:
        return got
    fresh_messages = [unique[i] for i in fresh]
    params = {
        "channel": channel,
        "ids": [i for i, _, _ in rows],
        "row_destinations": [d for _, d, _ in rows],
        "row_control_ids": [m.control_id for _, _, m in rows],
        "row_types": [m.message_type for _, _, m in rows],
        "row_payloads": sealed,
        "row_sizes": [len(m.payload) for _, _, m in rows],
        "row_keys": [
            ",".join(payloads.index_keys(m.payload)) if m.patient_keys is None else m.patient_keys
            for _, _, m in rows
        ],
        "row_traceparents": [m.traceparent for _, _, m in rows],
        "row_resent_from": resent_from,
        "destinations": list(ordered),
        "channels": [notify_channel(d) for d in ordered],
        "control_ids": [m.control_id for m in fresh_messages],
        "reply_keys": [m.reply_keys for m in fresh_messages],
        "positions": [i + 1 for i in fresh],
    }
    stored = await one_row(conn, STORE_SEALED, params)
    if int(stored["inserted"]) != len(rows):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    got["answered"] = stored["answered"]
    return got
