"""Ingest's statements (``sql/ingest.sql``): the routing table, the one statement that stores
a transaction's messages, and the duplicate window's purge.

Ingest (:mod:`inturn.worker.ingest`) hands over :class:`~inturn.worker.store.model.Message`
records and gets :class:`~inturn.worker.store.model.StoreResult` records back; the statement's
parameters and result rows stay here. The routing table's rows are dicts read by column name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import Invalid
from inturn.worker.store.identifiers import keys_text
from inturn.worker.store.model import Message, StoreResult
from inturn.worker.store.queries import fetch_all, load
from inturn.worker.store.queue import notify_channel

Q = load("ingest.sql")


async def routes(conn: AsyncConnection[Any]) -> list[dict[str, Any]]:
    """Every live destination with its channel, message-type filter and sender kind."""
    return await fetch_all(conn, Q["routes"], row=dict_row)


async def store_messages(conn: AsyncConnection[Any], params: dict[str, Any]) -> dict[str, Any]:
    """Run the store statement (see ``sql/ingest.sql``, ``store``) with ``params`` and return
    its one row: ``fresh`` (1-based positions stored), ``ids``, ``reused`` (positions whose
    control ID was seen with another payload). Arrays are sent in binary (the text form would
    hex-escape every payload in Python)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(Q["store"], params)
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
    payloads: PayloadCodec | None = None,
) -> list[StoreResult]:
    """Store ``messages`` for every one of ``destinations`` in one transaction (one statement;
    two with payload keys, see :func:`store_sealed`).

    The statement (``store`` in ``ingest.sql``) runs in autocommit mode, so its implicit COMMIT
    (with ``synchronous_commit`` on, which the pool's connections set) has happened when the
    result arrives: one round trip. Its steps are ordered by data dependencies, not by text:

    1. ``remembered``: one duplicate-window row per message (when the window is on). A copy of
       the same bytes with the same MSH-10 on the same channel inside the window conflicts on
       ``inturn_received_key``, is left alone and yields no row: that message is a duplicate
       and nothing further is done for it. An older copy is outside the window: its row is
       recycled. A concurrent copy waits on the unique index until the first commits (then it
       is a duplicate) or rolls back (then it is stored).
    2. ``locked``: the per-destination enqueue locks in sorted order, with the delivery queue's
       own function (``enqueue_lock`` in ``queue.sql``, as
       :func:`inturn.worker.store.queue.enqueue_in_transaction` takes it), so that id order is
       commit order per destination. The aggregate returns only once every lock is held, and
       only when at least one message is fresh.
    3. ``inserted``: one ``inturn_delivery`` row per fresh message and destination, in message
       order then destination order (so ids ascend in that order), each with its message's
       identifier index keys (:mod:`inturn.worker.store.identifiers`): the index is written in
       the same transaction as the message.
    4. ``notified``: one NOTIFY per destination, delivered at COMMIT.

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

    Returns:
        One :class:`StoreResult` per message, in input order.

    Raises:
        psycopg.Error: nothing of the batch was stored.
        Invalid: no destination or no message.
        RuntimeError: ``conn`` is inside a transaction.
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("store_batch needs an autocommit connection outside a transaction")
    if payloads is not None and payloads.enabled:
        async with conn.transaction():
            return await store_statement(
                conn,
                channel=channel,
                destinations=destinations,
                messages=messages,
                window_seconds=window_seconds,
                payloads=payloads,
            )
    return await store_statement(
        conn,
        channel=channel,
        destinations=destinations,
        messages=messages,
        window_seconds=window_seconds,
    )


async def store_statement(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    destinations: Sequence[str],
    messages: Sequence[Message],
    window_seconds: float,
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
            payloads=payloads,
        )
    else:
        row = await store_messages(
            conn, _plain_params(channel, ordered, unique, remember, window_seconds)
        )
    return _results(row, ordered, unique, slot, copy)


def _plain_params(
    channel: str,
    ordered: Sequence[str],
    unique: Sequence[Message],
    remember: bool,
    window_seconds: float,
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
        "remember": remember,
        "destinations": list(ordered),
        "channels": [notify_channel(d) for d in ordered],
    }


def _results(
    row: dict[str, Any],
    ordered: Sequence[str],
    unique: Sequence[Message],
    slot: Sequence[int],
    copy: Sequence[bool],
) -> list[StoreResult]:
    fresh_positions, ids, reused_positions = row["fresh"], row["ids"], row["reused"]
    fresh = [int(n) - 1 for n in fresh_positions or ()]
    reused = {int(n) - 1 for n in reused_positions or ()}
    answered = {int(n) - 1 for n in row["answered"] or ()}
    all_ids = [int(i) for i in ids or ()]
    width = len(ordered)
    if len(all_ids) != width * len(fresh):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    by_unique: list[StoreResult] = [
        StoreResult((), duplicate=True, control_id_reused=i in reused) for i in range(len(unique))
    ]
    for k, index in enumerate(fresh):
        chunk = tuple(all_ids[k * width : (k + 1) * width])
        by_unique[index] = StoreResult(
            chunk, control_id_reused=index in reused, answered=index in answered
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
    reserve = {
        "channel": channel,
        "control_ids": [m.control_id for m in unique],
        "digests": [m.digest for m in unique],
        "sizes": [len(m.payload) for m in unique],
        "window_seconds": window,
        "remember": remember,
        "destinations": list(ordered),
    }
    got = await _one(conn, Q["reserve"], reserve)
    fresh = [int(n) - 1 for n in got["fresh"] or ()]
    drawn = sorted(int(i) for i in got["ids"] or ())
    got["ids"] = drawn
    got["answered"] = None
    if not fresh:
        return got
    rows: list[tuple[int, str, Message]] = []
    at = 0
    for index in fresh:  # message order, then destination order: IDs ascend that way
        for destination in ordered:
            rows.append((drawn[at], destination, unique[index]))
            at += 1
    sealed = await payloads.seal_many([(i, d, m.payload) for i, d, m in rows])
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
        "destinations": list(ordered),
        "channels": [notify_channel(d) for d in ordered],
        "control_ids": [m.control_id for m in fresh_messages],
        "reply_keys": [m.reply_keys for m in fresh_messages],
        "positions": [i + 1 for i in fresh],
    }
    stored = await _one(conn, Q["store_sealed"], params)
    if int(stored["inserted"]) != len(rows):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    got["answered"] = stored["answered"]
    return got


async def _one(conn: AsyncConnection[Any], query: Any, params: dict[str, Any]) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(query, params)
        row = await cur.fetchone()
    assert row is not None
    return row


async def forget_old(conn: AsyncConnection[Any], window_seconds: float, batch: int) -> int:
    """Delete at most ``batch`` duplicate-window rows older than ``window_seconds``; return how
    many (rows locked by another purge are skipped)."""
    cur = await conn.execute(
        Q["forget_old"], {"window_seconds": float(window_seconds), "batch": batch}
    )
    return max(cur.rowcount, 0)
