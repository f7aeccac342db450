"""Storing messages: one statement per batch, and group commit across connections.

Every destination's enqueues are serialised until COMMIT by the delivery queue's advisory lock
(that is what makes id order equal commit order). With one transaction per message, N
connections feeding the same destination would therefore commit strictly one after another,
each waiting for its own WAL flush. :class:`Committer` instead keeps at most one transaction in
flight per (channel, destinations) route in this process; messages that arrive on other
connections meanwhile wait, and the next transaction stores all of them at once: one lock
round, one COMMIT, one flush for the lot. Each connection still has a single message in flight
and gets its acknowledgement only after the COMMIT that holds its rows, so nothing about "AA
means committed" or per-connection order changes; only unrelated connections share a commit.

A batch is atomic. If it fails and holds more than one message, each message is retried alone,
so that a message the database refuses cannot take the others down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper
from psycopg_pool import AsyncConnectionPool

from inturn.worker.store import locks, queue
from inturn.worker.store.faults import classify
from inturn.worker.store.identifiers import keys_text
from inturn.worker.store.queries import load

log = logging.getLogger("inturn.ingest")

Q = load("ingest.sql")

#: Most messages stored by one transaction.
MAX_BATCH_MESSAGES = 64
#: Most payload bytes stored by one transaction (a single larger message still goes alone).
MAX_BATCH_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Message:
    """One received message, ready to store.

    Attributes:
        control_id: MSH-10.
        message_type: MSH-9 as ``CODE^TRIGGER``.
        payload: the bytes exactly as received.
        digest: SHA-256 of ``payload`` (32 bytes), the duplicate-window key with MSH-10.
    """

    control_id: str
    message_type: str
    payload: bytes
    digest: bytes


@dataclass(frozen=True)
class StoreResult:
    """What storing one message did.

    Attributes:
        ids: its ``inturn_delivery`` ids, one per destination in sorted destination order
            (empty for a duplicate).
        duplicate: the same channel, MSH-10 and bytes were already stored inside the window
            (or earlier in the same batch); nothing new was stored for it.
        control_id_reused: another message with this MSH-10 and different bytes was received
            on the channel inside the window.
    """

    ids: tuple[int, ...]
    duplicate: bool = False
    control_id_reused: bool = False


async def store_batch(
    conn: AsyncConnection[Any],
    *,
    channel: str,
    destinations: Sequence[str],
    messages: Sequence[Message],
    window_seconds: float,
) -> list[StoreResult]:
    """Store ``messages`` for every one of ``destinations`` in one transaction (one statement).

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
       own key (``enqueue_lock`` in ``queue.sql``, as
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
        ValueError: no destination or no message.
        RuntimeError: ``conn`` is inside a transaction.
    """
    ordered = sorted(set(destinations))
    if not ordered or not messages:
        raise ValueError("nothing to store")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("store_batch needs an autocommit connection outside a transaction")
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
    params = {
        "channel": channel,
        "control_ids": [m.control_id for m in unique],
        "message_types": [m.message_type for m in unique],
        "payloads": [m.payload for m in unique],
        "digests": [m.digest for m in unique],
        "patient_keys": [keys_text(m.payload) for m in unique],
        "window_seconds": float(max(window_seconds, 0.0)),
        "remember": remember,
        "destinations": ordered,
        "channels": [queue.notify_channel(d) for d in ordered],
        "enqueue_prefix": locks.ENQUEUE_PREFIX,
    }
    async with conn.cursor(row_factory=dict_row) as cur:
        # Arrays in binary: the text form would hex-escape every payload in Python.
        cur.adapters.register_dumper(list, ListBinaryDumper)
        await cur.execute(Q["store"], params)
        row = await cur.fetchone()
    assert row is not None
    fresh_positions, ids, reused_positions = row["fresh"], row["ids"], row["reused"]
    fresh = [int(n) - 1 for n in fresh_positions or ()]
    reused = {int(n) - 1 for n in reused_positions or ()}
    all_ids = [int(i) for i in ids or ()]
    width = len(ordered)
    if len(all_ids) != width * len(fresh):
        raise RuntimeError("the store statement returned an unexpected number of rows")
    by_unique: list[StoreResult] = [
        StoreResult((), duplicate=True, control_id_reused=i in reused) for i in range(len(unique))
    ]
    for k, index in enumerate(fresh):
        chunk = tuple(all_ids[k * width : (k + 1) * width])
        by_unique[index] = StoreResult(chunk, control_id_reused=index in reused)
    results = []
    for index, is_copy in zip(slot, copy, strict=True):
        result = by_unique[index]
        if is_copy:
            result = StoreResult((), duplicate=True, control_id_reused=result.control_id_reused)
        results.append(result)
    return results


@dataclass
class _Waiting:
    message: Message
    future: asyncio.Future[StoreResult]


@dataclass
class _Route:
    waiting: list[_Waiting] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class Committer:
    """Group commit: at most one storing transaction in flight per route in this process.

    Args:
        pool: the write pool (autocommit connections, ``synchronous_commit`` on).
        window_seconds: the duplicate window (0 turns it off).
        acquire_timeout: seconds to wait for a pooled connection before the batch fails.
        max_messages, max_bytes: bounds of one batch.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        window_seconds: float,
        acquire_timeout: float = 10.0,
        max_messages: int = MAX_BATCH_MESSAGES,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self.pool = pool
        self.window_seconds = window_seconds
        self.acquire_timeout = acquire_timeout
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._routes: dict[tuple[str, tuple[str, ...]], _Route] = {}

    async def store(
        self, channel: str, destinations: Sequence[str], message: Message
    ) -> StoreResult:
        """Store ``message`` for ``destinations``; return once its COMMIT has returned.

        Raises:
            psycopg.Error, psycopg_pool.PoolTimeout, ...: the message was not stored.
            asyncio.CancelledError: the caller gave up; if its batch had not started, the
                message is not stored at all.
        """
        key = (channel, tuple(sorted(set(destinations))))
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = _Route()
        future: asyncio.Future[StoreResult] = asyncio.get_running_loop().create_future()
        route.waiting.append(_Waiting(message, future))
        if route.task is None:
            route.task = asyncio.create_task(self._drain(key, route), name="inturn-ingest-commit")
        return await future

    async def close(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout`` seconds) for the transactions in flight to finish."""
        tasks = [r.task for r in self._routes.values() if r.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _take(self, route: _Route) -> list[_Waiting]:
        batch: list[_Waiting] = []
        size = 0
        while route.waiting and len(batch) < self.max_messages:
            waiting = route.waiting[0]
            if waiting.future.done():  # its sender gave up before we started: do not store it
                route.waiting.pop(0)
                continue
            if batch and size + len(waiting.message.payload) > self.max_bytes:
                break
            route.waiting.pop(0)
            batch.append(waiting)
            size += len(waiting.message.payload)
        return batch

    async def _drain(self, key: tuple[str, tuple[str, ...]], route: _Route) -> None:
        channel, destinations = key
        try:
            while batch := self._take(route):
                try:
                    results = await self._store(channel, destinations, batch)
                except Exception as exc:
                    if len(batch) == 1:
                        _settle(batch[0].future, exc)
                        continue
                    log.warning(
                        "channel %s: a batch of %d messages failed (%s); storing them one by one",
                        channel,
                        len(batch),
                        type(exc).__name__,
                    )
                    for waiting in batch:
                        try:
                            [result] = await self._store(channel, destinations, [waiting])
                        except Exception as single:
                            _settle(waiting.future, single)
                        else:
                            _settle(waiting.future, result)
                    continue
                for waiting, result in zip(batch, results, strict=True):
                    _settle(waiting.future, result)
        finally:
            route.task = None
            for waiting in route.waiting:  # only if cancelled (shutdown): nothing was stored
                _settle(waiting.future, RuntimeError("ingest is shutting down"))
            route.waiting.clear()
            if self._routes.get(key) is route:
                del self._routes[key]

    async def _store(
        self, channel: str, destinations: Sequence[str], batch: Sequence[_Waiting]
    ) -> list[StoreResult]:
        """Store one batch; a connection found dead (the server restarted since the pool
        opened it) costs no answer: the pool's idle connections are checked, and the batch is
        stored once more on a fresh one. Only a second failure reaches the caller."""
        try:
            return await self._store_once(channel, destinations, batch)
        except Exception as exc:
            if classify(exc).fault != "dead":
                raise
            log.info(
                "channel %s: a pooled connection was dead (%s); storing again on a fresh one",
                channel,
                type(exc).__name__,
            )
        await self.pool.check()
        return await self._store_once(channel, destinations, batch)

    async def _store_once(
        self, channel: str, destinations: Sequence[str], batch: Sequence[_Waiting]
    ) -> list[StoreResult]:
        async with self.pool.connection(timeout=self.acquire_timeout) as conn:
            return await store_batch(
                conn,
                channel=channel,
                destinations=destinations,
                messages=[w.message for w in batch],
                window_seconds=self.window_seconds,
            )


def _settle(future: asyncio.Future[StoreResult], outcome: StoreResult | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
        with contextlib.suppress(BaseException):
            future.exception()  # mark retrieved: a caller that gave up must not cause a warning
    else:
        future.set_result(outcome)
