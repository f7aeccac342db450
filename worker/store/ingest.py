"""Ingest's statements (``sql/ingest.sql``): the routing table, the one statement that stores
a transaction's messages, and the duplicate window's purge.

Ingest (:mod:`inturn.worker.ingest`) hands over :class:`~inturn.worker.store.model.Message`
records and gets :class:`~inturn.worker.store.model.StoreResult` records back; the statement's
parameters and result rows stay here. The routing table's rows are dicts read by column name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, LiteralString

import psycopg
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper

from inturn.worker.crypto import envelope
from inturn.worker.crypto.codec import Keying, PayloadCodec
from inturn.worker.crypto.keystore import StoredKey
from inturn.worker.errors import Invalid
from inturn.worker.store.identifiers import keys_text
from inturn.worker.store.model import Earlier, Message, StoreResult
from inturn.worker.store.notify import channel_wake_name
from inturn.worker.store.queries import fetch_all, load

Q = load("ingest.sql")

#: Default lost-ACK window, seconds: a message received again within this time of its earlier
#: copy's delivery is taken for a sender that lost our ACK, and not queued again.
DEFAULT_DELIVERED_WINDOW_SECONDS = 600.0


def compact_query(query: str) -> LiteralString:
    """``query`` without its comment lines and runs of blanks: psycopg caches its conversion
    of a query only under 4 KiB (``MAX_CACHED_STATEMENT_LENGTH``), and the store statements run
    for every batch. Only for statements whose string literals hold no blank runs and no
    newline (those of ``ingest.sql``: ``','``, ``'pending'``, ``'delivered'``, ``'arriving'``)."""
    lines = (" ".join(line.split()) for line in query.splitlines())
    return "\n".join(x for x in lines if x and not x.startswith("--"))


#: The statements as sent (``sql/ingest.sql``, compacted).
STORE_LOG, RESERVE_LOG, STORE_LOG_SEALED = (
    compact_query(Q[n]) for n in ("store_log", "reserve_log", "store_log_sealed")
)

#: Route sets a cache holds at most (a channel's messages mostly share a handful).
MAX_CACHED_ROUTES = 4096


async def routes(conn: AsyncConnection[Any]) -> list[dict[str, Any]]:
    """Every live destination with its channel, message-type filter and sender kind."""
    return await fetch_all(conn, Q["routes"], row=dict_row)


class RouteSets:
    """Route-set ids (``inturn_route``, migration 0033) by channel and destination set, kept
    once read: a route set is never changed or deleted, so an id once committed stays right.
    Only ids read or made by a statement committed on its own (autocommit) are kept: a set made
    inside a transaction that then rolled back would be gone. At most ``MAX_CACHED_ROUTES``
    (then emptied and read again)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, tuple[str, ...]], int] = {}

    async def ids(
        self, conn: AsyncConnection[Any], channel: str, sets: Sequence[Sequence[str]]
    ) -> list[int]:
        """The id of each of ``sets`` (destinations, any order, repeats ignored) of
        ``channel``, made when new; one statement per set not known yet.

        Raises:
            Invalid: an empty set.
            psycopg.Error: the route table could not be read or written.
            RuntimeError: a new set another transaction was adding was still not seen after
                three tries.
        """
        keep = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        out: list[int] = []
        for raw in sets:
            key = (channel, tuple(sorted(set(raw))))
            if not key[1]:
                raise Invalid("a route set names at least one destination")
            known = self._ids.get(key)
            if known is None:
                known = await _route_id(conn, channel, key[1])
                if keep:
                    if len(self._ids) >= MAX_CACHED_ROUTES:
                        self._ids.clear()
                    self._ids[key] = known
            out.append(known)
        return out


async def _route_id(conn: AsyncConnection[Any], channel: str, destinations: Sequence[str]) -> int:
    for _ in range(3):  # a set a concurrent transaction adds is seen once it has committed
        cur = await conn.execute(
            Q["route"], {"channel": channel, "destinations": list(destinations)}
        )
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
    raise RuntimeError(f"the route set of channel {channel!r} could not be read")


async def store_batch(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    destinations: Sequence[str] | None = None,
    messages: Sequence[Message],
    window_seconds: float,
    delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
    payloads: PayloadCodec | None = None,
    route_sets: Sequence[Sequence[str]] | None = None,
    cache: RouteSets | None = None,
) -> list[StoreResult]:
    """Store ``messages`` in ``channel``'s log, each once, in one transaction (one statement;
    two with payload keys, see :func:`store_log`), each routed to ``destinations`` or to its
    own set in ``route_sets`` (one per message); the route sets' ids are read first
    (``cache``: kept across calls).

    Args:
        conn: an autocommit connection with ``synchronous_commit`` on, outside a transaction.
        channel: the channel all the messages arrived on.
        destinations: ``namespace/name`` values (at least one; repeats are ignored), for
            every message; or None with ``route_sets``.
        messages: at least one.
        window_seconds: the duplicate window; 0 or less turns duplicate detection off.
        delivered_seconds: the lost-ACK window (see :func:`store_log`), seconds.
        route_sets: the destinations of each message (as many as ``messages``).

    Returns:
        One :class:`StoreResult` per message, in input order.

    Raises:
        psycopg.Error: nothing of the batch was stored.
        Invalid: no destination or no message, or not as many route sets as messages.
        RuntimeError: ``conn`` is inside a transaction.
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("store_batch needs an autocommit connection outside a transaction")
    if not messages:
        raise Invalid("nothing to store")
    sets = route_sets if route_sets is not None else [destinations or ()] * len(messages)
    if len(sets) != len(messages):
        raise Invalid("one route set per message")
    ids = await (cache or RouteSets()).ids(conn, channel, sets)
    sealing = payloads is not None and payloads.enabled
    # sealed: two statements in one transaction of their own, pipelined (_store_log_sealed),
    # inside the codec's sealing scope (the keys stay live in the key store until the COMMIT);
    # in clear: one autocommit statement
    scope = payloads.sealing() if sealing and payloads is not None else contextlib.nullcontext()
    async with scope:
        return await store_log(
            conn,
            channel=channel,
            route_ids=ids,
            messages=messages,
            window_seconds=window_seconds,
            delivered_seconds=delivered_seconds,
            payloads=payloads,
        )


async def store_log(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    route_ids: Sequence[int],
    messages: Sequence[Message],
    window_seconds: float,
    delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
    payloads: PayloadCodec | None = None,
) -> list[StoreResult]:
    """Store ``messages`` in ``channel``'s log (``inturn_message``), each routed to its route
    set ``route_ids[i]`` (:class:`RouteSets`), in ``conn``'s current state: on an autocommit
    connection outside a transaction the statement commits on its own; inside the caller's
    transaction it commits with it (an HL7 batch stored whole). With ``payloads`` that seal,
    two statements: in the caller's transaction, or outside one in a transaction of their own
    (see :func:`_store_log_sealed`).

    The statement (``store_log`` in ``ingest.sql``; docs/explanation/storage-layout.md) writes,
    whatever the number of destinations, **one log row per message** (payload, MSH-10/9, size,
    patient index keys, traceparent, route set) and one NOTIFY for the channel's workers
    (:func:`inturn.worker.store.notify.channel_wake_name`), delivered at COMMIT; each
    destination's worker pulls the rows into its queue. Its steps, by data dependency:

    1. ``remembered``: one duplicate-window row per message (when the window is on), upserted
       on ``inturn_received_key``. A new message, or one whose row is older than the window
       (recycled), is stored as new (``repeats`` 0). An identical copy inside the window (the
       same channel, MSH-10 and bytes) only counts itself (``repeats`` + 1): it is a message
       *received again*. A concurrent copy waits on the unique index until the first commits.
    2. ``latest``: for a message received again, per destination of its route set, its latest
       earlier copy there: a log row routed to it past its cursor (not pulled yet: pending),
       else its newest row of the channel and MSH-10 enqueued since the window row's
       ``received_at``. The new copy is acknowledged without being queued while that copy is
       pending, or was delivered within ``delivered_seconds`` (the lost-ACK window). It is
       queued as a re-send when that copy failed, was skipped, was delivered longer ago, or is
       gone: one more log row, routed to those destinations only, naming each one's earlier
       copy (``resent_from``, linked by the pull). A copy another transaction counted after
       this statement's snapshot is ``arriving``: never queued.
    3. ``locked``: the channel's lock (``inturn_enqueue_lock('channel:<name>')``), held until
       COMMIT and taken only when a row is to be written, before the log ids are drawn: on one
       channel, log ids are drawn and committed in the same order, so a pull that sees an id
       committed sees every lower id of the channel committed too (the cursor never skips a
       row). No destination's lock is taken: 200 destinations cost one lock.
    4. ``inserted``: the log rows in message order (ids ascend that way).
    5. ``answered``: the order expectations a reply answers.

    Args:
        route_ids: one per message.
        window_seconds, delivered_seconds: as :func:`store_batch`.

    Returns:
        One :class:`StoreResult` per message, in input order; ``ids`` holds its log id.

    Raises:
        psycopg.Error: nothing of the batch was stored.
        Invalid: no message, or not one route set per message.
    """
    if not messages or len(route_ids) != len(messages):
        raise Invalid("nothing to store, or not one route set per message")
    remember = window_seconds > 0
    # Identical copies inside one batch: only the first is sent; the others are its duplicates.
    first: dict[tuple[str, bytes], int] = {}
    unique: list[Message] = []
    unique_routes: list[int] = []
    slot: list[int] = []
    copy: list[bool] = []
    for message, route in zip(messages, route_ids, strict=True):
        key = (message.control_id, message.digest)
        if remember and key in first:
            slot.append(first[key])
            copy.append(True)
            continue
        first[key] = len(unique)
        slot.append(len(unique))
        copy.append(False)
        unique.append(message)
        unique_routes.append(int(route))
    window = {
        "channel": channel,
        "wake": channel_wake_name(channel),
        "routes": unique_routes,
        "window_seconds": float(max(window_seconds, 0.0)),
        "delivered_seconds": float(max(delivered_seconds, 0.0)),
        "remember": remember,
    }
    if payloads is not None and payloads.enabled:
        row = await _store_log_sealed(conn, channel, window, unique, payloads)
    else:
        params = {
            **window,
            "control_ids": [m.control_id for m in unique],
            "types": [m.message_type for m in unique],
            "payloads": [m.payload for m in unique],
            "digests": [m.digest for m in unique],
            "keys": [
                keys_text(m.payload) if m.patient_keys is None else m.patient_keys for m in unique
            ],
            "tps": [m.traceparent for m in unique],
            "rks": [m.reply_keys for m in unique],
        }
        row = await one_row(conn, STORE_LOG, params)
    return _results(row, len(unique), slot, copy)


def _repeated(row: dict[str, Any]) -> dict[int, list[Earlier]]:
    """The ``repeated`` column of ``store_log`` or ``reserve_log``: per 0-based position of a
    message received again, its earlier copies by destination, in destination order."""
    repeated = row["repeated"]
    if isinstance(repeated, str):
        repeated = json.loads(repeated)
    earlier: dict[int, list[Earlier]] = {}
    for n, destination, earlier_id, state, queued in repeated or ():
        earlier.setdefault(int(n) - 1, []).append(
            Earlier(str(destination), earlier_id, state, bool(queued))
        )
    return earlier


def _results(
    row: dict[str, Any], count: int, slot: Sequence[int], copy: Sequence[bool]
) -> list[StoreResult]:
    """Per message of the batch, what was stored: ``placed`` (1-based positions written to
    the log, ascending) pairs with ``ids`` (their log ids, ascending)."""
    reused = {int(n) - 1 for n in row["reused"] or ()}
    answered = {int(n) - 1 for n in row["answered"] or ()}
    placed = [int(n) - 1 for n in row["placed"] or ()]
    ids = sorted(int(i) for i in row["ids"] or ())
    if len(placed) != len(ids):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    log_id = dict(zip(placed, ids, strict=True))
    earlier = _repeated(row)
    by_unique = [
        StoreResult(
            (log_id[i],) if i in log_id else (),
            duplicate=i not in log_id,
            control_id_reused=i in reused,
            answered=i in answered,
            earlier=tuple(earlier.get(i, ())),
        )
        for i in range(count)
    ]
    results = []
    for index, is_copy in zip(slot, copy, strict=True):
        result = by_unique[index]
        if is_copy:
            result = StoreResult((), duplicate=True, control_id_reused=result.control_id_reused)
        results.append(result)
    return results


async def _store_log_sealed(
    conn: AsyncConnection[Any],
    channel: str,
    window: dict[str, Any],
    unique: Sequence[Message],
    payloads: PayloadCodec,
) -> dict[str, Any]:
    """Store a batch in the log with its payloads sealed, in two statements: ``reserve_log``
    (window rows, the channel's lock, one log id per row to write, drawn under it) and, once
    each payload is sealed for its log id and ``channel:<name>`` (the envelope's associated
    data: the head's read opens it so, ``payload_binding`` in ``queue.sql``),
    ``store_log_sealed``. Each message is encrypted once, before the lock, whatever the number
    of its destinations: under it only each data key's wrap (microseconds). A message naming no
    patient is sealed under its channel's key. No payload in clear reaches the database.

    Inside the caller's transaction (an HL7 batch) the statements run in it. On an autocommit
    connection outside a transaction they run in a transaction of their own, pipelined: BEGIN
    goes with ``reserve_log`` and COMMIT with ``store_log_sealed``, two round trips in all
    where four were, and the channel's lock is held across one round trip, not two. An error
    of either statement skips the COMMIT (a pipeline skips what follows an error up to its
    sync) and the transaction is rolled back: nothing was stored.

    Returns:
        The row :func:`_results` decodes.

    Raises:
        RuntimeError: ``conn`` is in a failed transaction.
        psycopg.Error: nothing was stored (the caller's transaction, or its own, rolls back).
    """
    status = conn.info.transaction_status
    if status == psycopg.pq.TransactionStatus.IDLE:
        return await _store_log_sealed_pipelined(conn, channel, window, unique, payloads)
    if status != psycopg.pq.TransactionStatus.INTRANS:
        raise RuntimeError("a sealed store runs in a transaction that has not failed")
    bodies, reserve = await _sealed_bodies(channel, window, unique, payloads)
    got = await one_row(conn, RESERVE_LOG, reserve)
    params = _sealed_rows(got, channel, window, unique, payloads, bodies)
    if params is None:
        return got
    stored = await one_row(conn, STORE_LOG_SEALED, params)
    return _sealed_stored(got, stored, params)


async def _store_log_sealed_pipelined(
    conn: AsyncConnection[Any],
    channel: str,
    window: dict[str, Any],
    unique: Sequence[Message],
    payloads: PayloadCodec,
) -> dict[str, Any]:
    """:func:`_store_log_sealed` on an idle autocommit connection: BEGIN and ``reserve_log``
    in one round trip (a Flush reads its row), ``store_log_sealed``, COMMIT and the
    pipeline's only Sync in the next (the end of the pipeline block, which sends everything
    queued before it reads: a batch of any size; :func:`_send_sealed_rows`).

    When every key the batch is sealed under is cached (the usual case: a process sees the
    same patients again), the key store's lock of them (:meth:`PayloadCodec.lock_ahead`) runs
    beside the first round trip instead of before it, and the bodies are sealed once both
    have answered, under the channel's lock (about 20 us a message). The lock is awaited
    before the COMMIT is sent, so an erasure still waits for the rows sealed under those
    keys. When it has not answered within :data:`LOCK_AHEAD_GRACE_SECONDS` of the log ids,
    or did not find every key as cached (erased, or made again elsewhere), the transaction
    is rolled back (the channel's lock given back: a key store wait, or a key to make, is
    never paid under it) and the batch is stored as when a key is not cached: keys first,
    then both round trips."""
    scope = f"channel:{channel}"
    keyings = _keyings(scope, unique, payloads)
    ahead = payloads.lock_ahead(keyings)
    confirmed = None
    if ahead is not None:
        try:
            return await _store_log_sealed_ahead(
                conn, channel, window, unique, payloads, keyings, ahead
            )
        except _GiveBack:
            confirmed = await ahead  # the channel's lock is given back: wait here
    bodies = await payloads.seal_bodies([(scope, m.payload) for m in unique], keyings, confirmed)
    reserve = _reserve_params(window, unique)
    try:
        async with conn.cursor(row_factory=dict_row) as cur:
            async with conn.pipeline():
                await conn.execute("BEGIN")
                got = await one_row(conn, RESERVE_LOG, reserve)  # the fetch sends both
                params = _sealed_rows(got, channel, window, unique, payloads, bodies)
                await _send_sealed_rows(conn, cur, params)
            return await _sealed_result(cur, got, params)
    except BaseException:
        await _roll_back(conn)
        raise


#: Seconds a sealed batch whose key store lock runs beside its first round trip
#: (:func:`_store_log_sealed_pipelined`) waits for that lock once its log ids are drawn,
#: before it gives the channel's lock back and waits without it.
LOCK_AHEAD_GRACE_SECONDS = 0.2


class _GiveBack(Exception):
    """The key store's lock did not confirm the cached keys in time: roll back, store again."""


async def _store_log_sealed_ahead(
    conn: AsyncConnection[Any],
    channel: str,
    window: dict[str, Any],
    unique: Sequence[Message],
    payloads: PayloadCodec,
    keyings: Sequence[Keying],
    ahead: asyncio.Task[Mapping[bytes, StoredKey]],
) -> dict[str, Any]:
    """The batch with its keys' lock (``ahead``) in flight beside BEGIN and ``reserve_log``.

    Raises:
        _GiveBack: rolled back, nothing stored; ``ahead`` left to the caller.
        psycopg.Error, KeyStoreUnavailable: rolled back, nothing stored.
    """
    reserve = _reserve_params(window, unique)
    try:
        async with conn.cursor(row_factory=dict_row) as cur:
            async with conn.pipeline():
                await conn.execute("BEGIN")
                got = await one_row(conn, RESERVE_LOG, reserve)  # the fetch sends both
                done, _ = await asyncio.wait({ahead}, timeout=LOCK_AHEAD_GRACE_SECONDS)
                if not done or not payloads.confirms(keyings, ahead.result()):
                    raise _GiveBack
                scope = f"channel:{channel}"
                rows = [(scope, m.payload) for m in unique]
                bodies = await payloads.seal_bodies(rows, keyings, ahead.result())
                params = _sealed_rows(got, channel, window, unique, payloads, bodies)
                await _send_sealed_rows(conn, cur, params)
            return await _sealed_result(cur, got, params)
    except _GiveBack:
        await _roll_back(conn)
        raise
    except BaseException:
        await _roll_back(conn)
        if not ahead.done():
            ahead.cancel()
        with contextlib.suppress(BaseException):
            await ahead
        raise


async def _send_sealed_rows(
    conn: AsyncConnection[Any], cur: AsyncCursor[dict[str, Any]], params: dict[str, Any] | None
) -> None:
    """Queue ``store_log_sealed`` on ``cur`` (unless nothing is to be written) and COMMIT in
    ``conn``'s pipeline. Nothing is awaited here: the end of the pipeline block sends them with
    its Sync, everything queued sent first whatever its size, and reads every result (one round
    trip; a ``sync()`` of the pipeline before its end would cost one more, the block's own
    Sync); :func:`_sealed_result` then reads the row."""
    if params is not None:
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(STORE_LOG_SEALED, params)
    await conn.execute("COMMIT")


async def _sealed_result(
    cur: AsyncCursor[dict[str, Any]], got: dict[str, Any], params: dict[str, Any] | None
) -> dict[str, Any]:
    """Once the pipeline of :func:`_send_sealed_rows` has ended (committed): the row
    :func:`_results` decodes."""
    if params is None:
        return got
    stored = await cur.fetchone()
    assert stored is not None
    return _sealed_stored(got, stored, params)


async def _roll_back(conn: AsyncConnection[Any]) -> None:
    """End a sealed store's own transaction after an error (nothing of it was stored)."""
    if not conn.closed and conn.info.transaction_status in (
        psycopg.pq.TransactionStatus.INTRANS,
        psycopg.pq.TransactionStatus.INERROR,
    ):
        with contextlib.suppress(psycopg.Error):
            await conn.rollback()


def _keyings(scope: str, unique: Sequence[Message], payloads: PayloadCodec) -> list[Keying]:
    """The keys each message is sealed under: its own (computed at ingest), its channel's
    when it names no patient."""
    return [
        m.keying
        if m.keying is not None
        else payloads.destination_keying(scope)
        if m.patient_keys == ""
        else payloads.keying(m.payload, scope)
        for m in unique
    ]


def _reserve_params(window: dict[str, Any], unique: Sequence[Message]) -> dict[str, Any]:
    """``reserve_log``'s parameters."""
    return {
        **window,
        "control_ids": [m.control_id for m in unique],
        "digests": [m.digest for m in unique],
        "sizes": [len(m.payload) for m in unique],
    }


async def _sealed_bodies(
    channel: str, window: dict[str, Any], unique: Sequence[Message], payloads: PayloadCodec
) -> tuple[list[Any], dict[str, Any]]:
    """Each message's body sealed (before the channel's lock) and ``reserve_log``'s
    parameters."""
    scope = f"channel:{channel}"
    keyings = _keyings(scope, unique, payloads)
    bodies = await payloads.seal_bodies([(scope, m.payload) for m in unique], keyings)
    return list(bodies), _reserve_params(window, unique)


def _sealed_rows(
    got: dict[str, Any],
    channel: str,
    window: dict[str, Any],
    unique: Sequence[Message],
    payloads: PayloadCodec,
    bodies: Sequence[Any],
) -> dict[str, Any] | None:
    """From ``reserve_log``'s row (``got``, completed here with ``placed`` and ``ids``): the
    parameters of ``store_log_sealed``, each payload bound to its log id; None when nothing is
    to be written."""
    queued = got["queued"]
    if isinstance(queued, str):
        queued = json.loads(queued)
    queued = sorted(queued or (), key=lambda q: int(q[0]))
    drawn = sorted(int(i) for i in got["ids"] or ())
    if len(queued) != len(drawn):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    got["placed"] = [int(q[0]) for q in queued]
    got["ids"] = drawn
    got["answered"] = None
    if not queued:
        return None
    rows = [
        (i, int(n) - 1, int(route), froms)
        for i, (n, route, froms) in zip(drawn, queued, strict=True)
    ]
    fresh = [int(n) - 1 for n in got["fresh"] or ()]
    params = {
        "channel": channel,
        "wake": window["wake"],
        "ids": [i for i, _, _, _ in rows],
        "row_control_ids": [unique[k].control_id for _, k, _, _ in rows],
        "row_types": [unique[k].message_type for _, k, _, _ in rows],
        "row_payloads": [envelope.bind(bodies[k], i) for i, k, _, _ in rows],
        "row_sizes": [len(unique[k].payload) for _, k, _, _ in rows],
        "row_keys": [
            ",".join(payloads.index_keys(unique[k].payload))
            if unique[k].patient_keys is None
            else unique[k].patient_keys
            for _, k, _, _ in rows
        ],
        "row_traceparents": [unique[k].traceparent for _, k, _, _ in rows],
        "row_routes": [r for _, _, r, _ in rows],
        "row_froms": [
            None if f is None else ",".join("" if x is None else str(int(x)) for x in f)
            for _, _, _, f in rows
        ],
        "control_ids": [unique[k].control_id for k in fresh],
        "reply_keys": [unique[k].reply_keys for k in fresh],
        "positions": [k + 1 for k in fresh],
    }
    return params


def _sealed_stored(
    got: dict[str, Any], stored: dict[str, Any], params: dict[str, Any]
) -> dict[str, Any]:
    """``reserve_log``'s row with what ``store_log_sealed`` answered."""
    if int(stored["inserted"]) != len(params["ids"]):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    got["answered"] = stored["answered"]
    return got


async def one_row(conn: AsyncConnection[Any], query: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Run one of ingest's store statements (lists bound as binary arrays) and return its one
    row; shared by the channel log's path and the per-row path of an upgrade window."""
    async with conn.cursor(row_factory=dict_row) as cur:
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(query, params)
        row = await cur.fetchone()
    assert row is not None
    return row


async def answer_only(
    conn: AsyncConnection[Any], channel: str, control_id: str, reply_keys: str
) -> int:
    """Answer the open expectations of ``channel`` whose key digest is one of ``reply_keys``
    (comma-separated) by the reply ``control_id`` (MSH-10), storing no message: for a reply on
    a channel that accepts unrouted messages without storing them. Returns how many."""
    cur = await conn.execute(
        Q["answer_only"], {"channel": channel, "control_id": control_id, "reply_keys": reply_keys}
    )
    return max(cur.rowcount, 0)


async def forget_old(conn: AsyncConnection[Any], window_seconds: float, batch: int) -> int:
    """Delete at most ``batch`` duplicate-window rows older than ``window_seconds``; return how
    many (rows locked by another purge are skipped)."""
    cur = await conn.execute(
        Q["forget_old"], {"window_seconds": float(window_seconds), "batch": batch}
    )
    return max(cur.rowcount, 0)
