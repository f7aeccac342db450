"""Group commit across connections, and the store timeout kept where the outcome is known.

The statement that stores a transaction's messages is the store's
(:func:`inturn.worker.store.ingest.store_batch`); this module decides what goes into one.

A channel's messages are written once each to its log (``inturn_message``), serialised until
COMMIT by the channel's lock (that is what makes log id order equal commit order on a channel,
which each destination's pull relies on; docs/explanation/storage-layout.md). With one
transaction per message, N connections feeding the same channel would therefore commit strictly
one after another, each waiting for its own WAL flush. :class:`Committer` instead keeps at most
one transaction in flight per channel in this process, whatever each message's destinations
(its route set, written with it); messages that arrive on other connections meanwhile wait,
and the next transaction stores all of them at once: one lock, one COMMIT, one flush for the
lot. Each connection still has a single message in flight
and gets its acknowledgement only after the COMMIT that holds its rows, so nothing about "AA
means committed" or per-connection order changes; only unrelated connections share a commit.

A batch is atomic. If it fails and holds more than one message, each message is retried alone,
so that a message the database refuses cannot take the others down with it.

The store timeout is kept here, not by the caller, because only here is it known whether a
transaction can still commit. Each message has a deadline (``store_timeout`` after it was
handed over). A message whose deadline passes before its batch started, or while its batch
waited for a pooled connection, was never sent to the database: it fails with
:class:`StoreTimeout`. A batch whose statement is still running at the earliest deadline of its
messages is cancelled on the server (a cancel request, "Canceling Requests in Progress" in the
PostgreSQL manual), and its own end is awaited: the statement runs in autocommit, so an error
means its transaction rolled back (:class:`StoreTimeout`, nothing kept), and success means it
committed before the cancel arrived (the messages are stored and answered as such). When the
end does not come within ``confirm_seconds`` more (the server or the network does not answer),
the connection is closed and the messages fail with :class:`OutcomeUnknown`: they may have
been committed, and an answer saying otherwise would be a lie. A connection that was sent a
cancel is closed after use either way, so that a late cancel cannot hit another statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import Unavailable
from inturn.worker.store import ingest_rows
from inturn.worker.store.faults import classify
from inturn.worker.store.ingest import (
    DEFAULT_DELIVERED_WINDOW_SECONDS,
    RouteSets,
    answer_only,
    store_batch,
)
from inturn.worker.store.model import Message, StoreResult

log = logging.getLogger("inturn.ingest")

R = TypeVar("R")

#: Most messages stored by one transaction.
MAX_BATCH_MESSAGES = 64
#: Most payload bytes stored by one transaction (a single larger message still goes alone).
MAX_BATCH_BYTES = 32 * 1024 * 1024
#: Default seconds a storing statement may take before it is cancelled.
DEFAULT_STORE_TIMEOUT_SECONDS = 10.0
#: Default seconds to wait for a cancelled statement's end before the outcome is unknown.
DEFAULT_CONFIRM_SECONDS = 10.0
#: Seconds between two looks for the channel log's migration while it is not applied.
LOG_ASK_SECONDS = 1.0


class StoreTimeout(Unavailable):
    """A message was not stored within the store timeout, and nothing of it was kept: it never
    reached the database, or its statement was cancelled and rolled back (confirmed by the
    statement's own end)."""


class OutcomeUnknown(Unavailable):
    """A cancelled storing statement did not end within the confirmation bound; its connection
    was closed. Its transaction may have committed: the message must not be answered as
    refused."""


@dataclass
class _Waiting:
    message: Message
    destinations: tuple[str, ...]
    future: asyncio.Future[StoreResult]
    deadline: float  # loop.time() after which the message is not to be stored


@dataclass
class _Route:
    waiting: list[_Waiting] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class Committer:
    """Group commit: at most one storing transaction in flight per channel in this process.

    Args:
        pool: the write pool (autocommit connections, ``synchronous_commit`` on).
        window_seconds: the duplicate window (0 turns it off).
        delivered_seconds: the lost-ACK window (see
            :func:`inturn.worker.store.ingest.store_batch`).
        store_timeout: seconds (> 0) from handing a message over to the end of its storing,
            pool wait included; past it the statement is cancelled (see the module docstring).
        confirm_seconds: seconds to wait for a cancelled statement's end.
        max_messages, max_bytes: bounds of one batch.
        payloads: seals payloads (with payload keys) in the batch's transaction.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        window_seconds: float,
        delivered_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
        store_timeout: float = DEFAULT_STORE_TIMEOUT_SECONDS,
        confirm_seconds: float = DEFAULT_CONFIRM_SECONDS,
        max_messages: int = MAX_BATCH_MESSAGES,
        max_bytes: int = MAX_BATCH_BYTES,
        payloads: PayloadCodec | None = None,
    ) -> None:
        self.pool = pool
        #: Seals the payloads of each batch (payload keys given) or passes them (none).
        self.payloads = payloads
        self.window_seconds = window_seconds
        self.delivered_seconds = delivered_seconds
        self.store_timeout = store_timeout
        self.confirm_seconds = confirm_seconds
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._routes: dict[str, _Route] = {}
        #: Route-set ids, kept across batches (a channel's messages share a handful).
        self.route_sets = RouteSets()
        #: The channel log's ingest is in place (migration 0041; see :meth:`log_ready`).
        self.log = False
        self._log_asked = -LOG_ASK_SECONDS

    async def answer_only(self, channel: str, control_id: str, reply_keys: str) -> int:
        """Answer the open expectations of ``channel`` that ``reply_keys`` (comma-separated key
        digests) name by the reply ``control_id``, storing no message (a reply on a channel
        that accepts unrouted messages without storing them); how many it answered.

        Raises:
            psycopg.Error, psycopg_pool.PoolTimeout: nothing was recorded.
        """
        async with self.pool.connection(timeout=self.store_timeout) as conn:
            return await answer_only(conn, channel, control_id, reply_keys)

    async def store(
        self, channel: str, destinations: Sequence[str], message: Message
    ) -> StoreResult:
        """Store ``message`` for ``destinations``; return once its COMMIT has returned.

        Returns or raises only once the outcome is known (within about ``store_timeout`` plus
        ``confirm_seconds``): the caller must not give up earlier, since a transaction it
        stopped waiting for could still commit.

        Raises:
            StoreTimeout: not stored within ``store_timeout``; nothing was kept.
            OutcomeUnknown: cancelled, but its end was not seen; it may have been kept.
            psycopg.Error, psycopg_pool.PoolTimeout, ...: the message was not stored.
            asyncio.CancelledError: the caller gave up; if its batch had not started, the
                message is not stored at all.
        """
        key = channel
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = _Route()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[StoreResult] = loop.create_future()
        deadline = loop.time() + self.store_timeout
        route.waiting.append(_Waiting(message, tuple(sorted(set(destinations))), future, deadline))
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
        now = asyncio.get_running_loop().time()
        while route.waiting and len(batch) < self.max_messages:
            waiting = route.waiting[0]
            if waiting.future.done():  # its sender gave up before we started: do not store it
                route.waiting.pop(0)
                continue
            if waiting.deadline <= now:  # waited out its time behind earlier batches: unsent
                route.waiting.pop(0)
                _settle(waiting.future, StoreTimeout(self._late()))
                continue
            if batch and size + len(waiting.message.payload) > self.max_bytes:
                break
            route.waiting.pop(0)
            batch.append(waiting)
            size += len(waiting.message.payload)
        return batch

    def _late(self) -> str:
        return f"not stored within the store timeout of {self.store_timeout:g}s; nothing was kept"

    async def _drain(self, key: str, route: _Route) -> None:
        channel = key
        try:
            while batch := self._take(route):
                try:
                    results = await self._store(channel, batch)
                except Exception as exc:
                    if len(batch) == 1 or isinstance(exc, StoreTimeout | OutcomeUnknown):
                        for waiting in batch:  # out of time: no second try for any of them
                            _settle(waiting.future, exc)
                        continue
                    log.warning(
                        "channel %s: a batch of %d messages failed (%s); storing them one by one",
                        channel,
                        len(batch),
                        type(exc).__name__,
                    )
                    for waiting in batch:
                        try:
                            [result] = await self._store(channel, [waiting])
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

    async def _store(self, channel: str, batch: Sequence[_Waiting]) -> list[StoreResult]:
        """Store one batch; a connection found dead (the server restarted since the pool
        opened it) costs no answer: the pool's idle connections are checked, and the batch is
        stored once more on a fresh one if time is left. Only a second failure reaches the
        caller."""
        deadline = min(w.deadline for w in batch)
        try:
            return await self._store_once(channel, batch, deadline)
        except Exception as exc:
            if classify(exc).fault != "dead":
                raise
            log.info(
                "channel %s: a pooled connection was dead (%s); storing again on a fresh one",
                channel,
                type(exc).__name__,
            )
        await self.pool.check()
        return await self._store_once(channel, batch, deadline)

    async def _store_once(
        self,
        channel: str,
        batch: Sequence[_Waiting],
        deadline: float,
    ) -> list[StoreResult]:
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise StoreTimeout(self._late())
        try:
            async with self.pool.connection(timeout=remaining) as conn:
                return await self._bounded(conn, deadline, self._write(conn, channel, batch))
        except PoolTimeout as exc:  # no connection in time: nothing was sent
            raise StoreTimeout(self._late()) from exc

    async def log_ready(self, conn: AsyncConnection[Any]) -> bool:
        """Whether the database has the channel log's ingest (migration 0041), asked on
        ``conn`` at most once a second until it has, then never again: a new ingest started
        before ``inturn migrate`` stores as the release before did (one row per destination)
        meanwhile, and switches within a second of the migration's commit."""
        if self.log:
            return True
        now = asyncio.get_running_loop().time()
        if now - self._log_asked < LOG_ASK_SECONDS:
            return False
        self._log_asked = now
        self.log = await ingest_rows.log_ready(conn)
        if self.log:
            log.info("ingest: the channel log is in place; each message is stored once")
        return self.log

    async def _write(
        self, conn: AsyncConnection[Any], channel: str, batch: Sequence[_Waiting]
    ) -> list[StoreResult]:
        if await self.log_ready(conn):
            return await store_batch(
                conn,
                channel=channel,
                route_sets=[w.destinations for w in batch],
                messages=[w.message for w in batch],
                cache=self.route_sets,
                window_seconds=self.window_seconds,
                payloads=self.payloads,
                delivered_seconds=self.delivered_seconds,
            )
        # before migration 0041: one transaction per destination set, as the release before
        results: list[StoreResult | None] = [None] * len(batch)
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, waiting in enumerate(batch):
            groups.setdefault(waiting.destinations, []).append(index)
        for destinations, indexes in groups.items():
            stored = await ingest_rows.store_batch(
                conn,
                channel=channel,
                destinations=destinations,
                messages=[batch[i].message for i in indexes],
                window_seconds=self.window_seconds,
                payloads=self.payloads,
                delivered_seconds=self.delivered_seconds,
            )
            for index, result in zip(indexes, stored, strict=True):
                results[index] = result
        return [r for r in results if r is not None]

    async def _bounded(
        self, conn: AsyncConnection[Any], deadline: float, statement: Awaitable[R]
    ) -> R:
        return await run_bounded(
            conn,
            statement,
            deadline=deadline,
            store_timeout=self.store_timeout,
            confirm_seconds=self.confirm_seconds,
        )


async def run_bounded(
    conn: AsyncConnection[Any],
    statement: Awaitable[R],
    *,
    deadline: float,
    store_timeout: float,
    confirm_seconds: float = DEFAULT_CONFIRM_SECONDS,
) -> R:
    """Await ``statement`` (storing on ``conn``, in autocommit or in a transaction it ends) until
    ``deadline`` (``loop.time()``); past it, cancel it on the server and await its own end for up
    to ``confirm_seconds`` (see the module docstring).

    Raises:
        StoreTimeout: it was cancelled and ended with an error: nothing was kept.
        OutcomeUnknown: its end was not seen; ``conn`` was closed.
        Exception: whatever ``statement`` raised before the deadline.
    """
    task = asyncio.ensure_future(statement)
    loop = asyncio.get_running_loop()
    done, _ = await asyncio.wait({task}, timeout=max(deadline - loop.time(), 0.0))
    if task in done:
        return task.result()
    try:
        await conn.cancel_safe(timeout=confirm_seconds)
    except psycopg.Error as exc:  # the cancel request did not get through
        log.warning("ingest: the cancel request failed (%s)", type(exc).__name__)
    done, _ = await asyncio.wait({task}, timeout=confirm_seconds)
    try:
        if task not in done:
            await conn.close()  # the statement's socket goes; its outcome stays unknown
            with contextlib.suppress(BaseException):
                await task
            raise OutcomeUnknown(
                f"the storing statement was cancelled after the store timeout of"
                f" {store_timeout:g}s and did not end within {confirm_seconds:g}s"
                " more; it may have been kept"
            )
        try:
            result = task.result()
        except psycopg.Error as exc:
            if classify(exc).fault == "dead":  # ended with its session: unknown
                raise OutcomeUnknown(
                    f"the storing statement was cancelled after the store timeout of"
                    f" {store_timeout:g}s and its connection was lost"
                    f" ({type(exc).__name__}); it may have been kept"
                ) from exc
            raise StoreTimeout(
                f"cancelled after the store timeout of {store_timeout:g}s and rolled"
                " back; nothing was kept"
            ) from exc
        log.info(
            "ingest: a storing statement committed after the store timeout of %gs, before"
            " the cancel reached it; answered as stored",
            store_timeout,
        )
        return result
    finally:
        # A cancel that arrives late must not hit a later statement of this connection.
        if not conn.closed:
            await conn.close()


def _settle(future: asyncio.Future[StoreResult], outcome: StoreResult | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
        with contextlib.suppress(BaseException):
            future.exception()  # mark retrieved: a caller that gave up must not cause a warning
    else:
        future.set_result(outcome)
