"""Storing an HL7 batch (FHS/BHS ... BTS/FTS): all of its messages, or none of them.

Source: HL7 v2.5 chapter 2, section 2.10.3 "HL7 batch protocol" (splitting and the answering
batch are pure, in :mod:`inturn.worker.hl7.batch`; the answers are built by
:class:`inturn.worker.ingest.accept.Acceptor`). The rules ingest applies, over MLLP and HTTP
alike:

* Each message of the batch goes through exactly the checks a message sent alone goes through
  (MSH readable, bounded fields, a destination that takes it and could send it).
* When every message passes, all of them are stored **in one transaction**, in batch order,
  each by the same statement a single message uses (one row of the channel's log routed to
  its destinations, duplicate window, identifier index, NOTIFY at COMMIT); the first takes the
  channel's lock, held to the COMMIT, so the log ids, and each destination's queue, ascend in
  batch order. The answer is a batch of ACKs, one per message
  in order (AA, or AA with "duplicate" in MSA-3), after the COMMIT.
* When a message would be refused, the batch is **refused whole** and nothing of it is
  stored: the refused message's ACK carries its own ERR; every other message is answered
  AR (CR) with an ERR (table 0357 code 207) naming the refused message by its position and
  MSH-10; BHS-10 says the same.
* When storing fails, every message is answered AE (CE), or AR (CR) for content the database
  refuses (:mod:`inturn.worker.store.faults`); nothing is kept, the sender sends it again. A
  transaction still running at the store timeout is cancelled and answered by its own end, as
  a single message is (:mod:`inturn.worker.ingest.batch`): AE only once it rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.ingest.batch import DEFAULT_CONFIRM_SECONDS, StoreTimeout, run_bounded
from inturn.worker.store import ingest_rows, queue
from inturn.worker.store.ingest import DEFAULT_DELIVERED_WINDOW_SECONDS, RouteSets, store_log
from inturn.worker.store.model import Message, StoreResult


async def store_all(
    pool: AsyncConnectionPool,
    channel: str,
    items: Sequence[tuple[Sequence[str], Message]],
    *,
    window_seconds: float,
    delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
    store_timeout: float,
    confirm_seconds: float = DEFAULT_CONFIRM_SECONDS,
    payloads: PayloadCodec | None = None,
    cache: RouteSets | None = None,
    log: bool = False,
) -> list[StoreResult]:
    """Store every message for its destinations in one transaction, in order.

    The store timeout is kept as for a single message (:mod:`inturn.worker.ingest.batch`):
    past it the transaction is cancelled and its own end awaited, so that an error (AE) always
    means it rolled back.

    Args:
        pool: the write pool (autocommit connections, ``synchronous_commit`` on).
        channel: where the batch arrived.
        items: ``(destinations, message)`` per message of the batch, in batch order.
        window_seconds: the duplicate window (0 turns it off).
        delivered_seconds: the lost-ACK window (:func:`inturn.worker.store.ingest.store_batch`).
        store_timeout: seconds for the pool wait and the transaction together.
        confirm_seconds: seconds to wait for a cancelled transaction's end.
        cache: route-set ids kept across calls (read first, outside the transaction).
        log: the channel log's migration (0041) is known to be applied; False: asked first
            (before it, the batch is stored as the release before stored it).

    Returns:
        One result per item, in order, once the COMMIT has returned.

    Raises:
        StoreTimeout: not stored within ``store_timeout``; nothing was kept.
        OutcomeUnknown: cancelled, but its end was not seen; it may have been kept.
        psycopg.Error: nothing of the batch was stored.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + store_timeout

    async def transaction(conn: AsyncConnection[Any]) -> list[StoreResult]:
        if not (log or await ingest_rows.log_ready(conn)):
            return await rows_transaction(conn)
        routes = await (cache or RouteSets()).ids(conn, channel, [d for d, _ in items])
        # the keys sealed under stay live until the COMMIT (an erasure waits): see sealing()
        sealing = payloads.sealing() if payloads is not None else contextlib.nullcontext()
        async with sealing, conn.transaction():
            results: list[StoreResult] = []
            for route, (_, message) in zip(routes, items, strict=True):
                [result] = await store_log(
                    conn,
                    channel=channel,
                    route_ids=[route],
                    messages=[message],
                    window_seconds=window_seconds,
                    payloads=payloads,
                    delivered_seconds=delivered_seconds,
                )
                results.append(result)
            return results

    async def rows_transaction(conn: AsyncConnection[Any]) -> list[StoreResult]:
        # before migration 0041 (an upgrade in place): one row per destination, as the release
        # before stored a batch, every destination's enqueue lock first, in sorted order
        everyone = sorted({d for destinations, _ in items for d in destinations})
        sealing = payloads.sealing() if payloads is not None else contextlib.nullcontext()
        async with sealing, conn.transaction():
            await queue.lock_for_enqueue(conn, everyone)
            results: list[StoreResult] = []
            for destinations, message in items:
                [result] = await ingest_rows.store_statement(
                    conn,
                    channel=channel,
                    destinations=destinations,
                    messages=[message],
                    window_seconds=window_seconds,
                    payloads=payloads,
                    delivered_seconds=delivered_seconds,
                )
                results.append(result)
            return results

    try:
        async with pool.connection(timeout=store_timeout) as conn:
            return await run_bounded(
                conn,
                transaction(conn),
                deadline=deadline,
                store_timeout=store_timeout,
                confirm_seconds=confirm_seconds,
            )
    except PoolTimeout as exc:  # no connection in time: nothing was sent
        raise StoreTimeout(
            f"no database connection within the store timeout of {store_timeout:g}s;"
            " nothing was kept"
        ) from exc
