"""How the worker's loop runs its statements: the step-fault policy, the lock watch, and the
wait for a notification.

Every statement (or transaction) of the drain loop goes through :meth:`StepRunner.run`, which
applies the one fault table of :func:`inturn.worker.store.faults.classify_step`: while the
session lives (a full disk, ``lock_timeout``, ``statement_timeout``...), the failed step alone is
repeated after a backoff, with ``/readyz`` saying why and liveness kept (a restart would lose what
the worker knows); only a lost session raises :class:`SessionLost`, on which the worker reconnects.
A delivered message whose mark cannot be written is therefore marked again, never sent again.
Each statement also runs under a lock watch (:mod:`inturn.worker.store.lockwatch`): a wait on
another session's lock longer than the threshold is logged with the blocking session, shown on
``/readyz`` and counted in ``inturn_lock_wait_seconds``.

The same runner serves every task of one worker (the single stream, and each lane when a
destination has several), so that the policy is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.drain.observer import Observer
from inturn.worker.drain.permits import StatementPermits
from inturn.worker.drain.state import WorkerHealth
from inturn.worker.errors import Unavailable
from inturn.worker.store import lockwatch
from inturn.worker.store.connect import write_target
from inturn.worker.store.faults import Step, StepFault, classify_step

log = logging.getLogger("inturn.drain")

#: Backoff of a step repeated on a live session (a mark on a full disk...): first delay and
#: ceiling, seconds.
STEP_RETRY_BASE_SECONDS = 0.5
STEP_RETRY_MAX_SECONDS = 10.0
#: Seconds between two warnings about the same lock wait (the first comes at the threshold).
LOCK_WAIT_LOG_EVERY_SECONDS = 60.0

T = TypeVar("T")


class SessionLost(Unavailable):
    """The worker's session, and the destination's lock with it, is gone (see
    :func:`inturn.worker.store.faults.classify_step`); the worker reconnects.

    Attributes:
        fault: the classified error.
    """

    def __init__(self, fault: StepFault) -> None:
        super().__init__(fault.text)
        self.fault = fault


class Stopped(Exception):
    """Stop was asked while a failed step waited to be repeated."""


class StepRunner:
    """Runs one worker's statements under the step-fault policy and the lock watch.

    Args:
        destination: the queue key, ``namespace/name`` (for logs and metrics).
        dsn: the database, for the lock watch's short-lived side connection.
        state: the worker's health, which a repeated step and a lock wait update.
        observer: told of failed steps and lock waits (metrics).
        lock_wait_seconds: the lock-wait threshold, seconds > 0.
        permits: the process's bound on statements at once
            (:mod:`inturn.worker.drain.permits`), shared by the workers of one process; None:
            no bound.
    """

    def __init__(
        self,
        destination: str,
        dsn: str,
        state: WorkerHealth,
        observer: Observer,
        lock_wait_seconds: float,
        permits: StatementPermits | None = None,
    ) -> None:
        self.destination = destination
        self.permits = permits
        self.dsn = dsn
        self.state = state
        self.observer = observer
        self.lock_wait_seconds = lock_wait_seconds
        self._lock_wait_logged = 0.0

    def _tick(self) -> None:
        self.state.last_tick = time.monotonic()

    async def run(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        step: Step,
        call: Callable[[], Awaitable[T]],
        item_id: int | None = None,
        between: Callable[[], Awaitable[object]] | None = None,
    ) -> T:
        """Run one statement (or transaction) of the loop; repeat it alone while the session
        lives (:func:`inturn.worker.store.faults.classify_step`).

        A failure on a live session sets ``state.trouble`` (``/readyz`` answers 503 with it),
        is logged, and the step is run again after a backoff from
        :data:`STEP_RETRY_BASE_SECONDS` doubling to :data:`STEP_RETRY_MAX_SECONDS`; the loop
        keeps turning (liveness holds). Each run is under a lock watch (:meth:`watch`).

        ``between`` runs before each repeat (the worker renews its lease there: a failed
        statement renewed nothing); its database errors are ignored, anything else propagates
        (``LeaseLost``: another worker took over, so repeating is over).

        Raises:
            SessionLost: the session is gone; for a ``mark`` step the head may be sent once more
                by the next lock holder.
            Stopped: stop was asked while the step waited to be repeated (never for the
                delivered mark: a stop waits for it, as for the attempt in flight, and only
                abandoning cancels it).
        """
        failures = 0
        while True:
            self._tick()
            try:
                if self.permits is None:
                    result = await self._watched(conn, call)
                else:  # held around the round trip only: a repeat's backoff gives it back
                    result = await self.permits.run(partial(self._watched, conn, call))
            except (psycopg.Error, lockwatch.LockWaitError) as exc:
                error = exc.__cause__ if isinstance(exc, lockwatch.LockWaitError) else exc
                assert isinstance(error, BaseException)
                fault = classify_step(step, error, connection_closed=conn.closed or conn.broken)
                about = "" if item_id is None else f" of id={item_id}"
                if fault.action == "stop":
                    raise error from None  # no schema: the command line says to migrate
                if fault.action == "reconnect":
                    if fault.meaning == "may_resend":
                        log.warning(
                            "destination %s: the session was lost while marking %s delivered;"
                            " this process writes the mark when the database is back (only a"
                            " new process would send it again)",
                            self.destination,
                            "remembered messages" if item_id is None else f"id={item_id}",
                        )
                    raise SessionLost(fault) from exc
                failures += 1
                delay = backoff_seconds(failures, STEP_RETRY_BASE_SECONDS, STEP_RETRY_MAX_SECONDS)
                self.state.trouble = f"{_STEP_WORDS[step]}{about} failed: {fault.text}"
                self.observer.step_failed(self.destination, step)
                log.warning(
                    "destination %s: %s%s failed (%s: %s); the session and the lock are kept,"
                    " so only this step is repeated%s: try %d, next in %.1fs",
                    self.destination,
                    _STEP_WORDS[step],
                    about,
                    fault.text,
                    _first_line(exc),
                    ", the message is not sent again" if fault.meaning == "delivered" else "",
                    failures + 1,
                    delay,
                )
                if between is not None:
                    with contextlib.suppress(psycopg.Error):
                        await between()
                if fault.meaning == "delivered":
                    # Part of the attempt in flight, which a stop lets finish: stopping now would
                    # send the message again. Only abandoning (a second signal) cancels it.
                    await asyncio.sleep(delay)
                    continue
                await sleep_or_stop(stop, delay)
                if stop.is_set():
                    raise Stopped from exc
                continue
            if failures:
                log.info(
                    "destination %s: %s%s succeeded after %d failed tries",
                    self.destination,
                    _STEP_WORDS[step],
                    "" if item_id is None else f" of id={item_id}",
                    failures,
                )
                self.state.trouble = None
            return result

    async def _watched(self, conn: AsyncConnection[Any], call: Callable[[], Awaitable[T]]) -> T:
        async with self.watch(conn):
            return await call()

    def watch(self, conn: AsyncConnection[Any]) -> lockwatch.Watch:
        """The lock watch of one step (:func:`inturn.worker.store.lockwatch.watch`)."""
        return lockwatch.Watch(conn, self._side, self.lock_wait_seconds, self._on_lock_wait)

    async def _side(self) -> AsyncConnection[Any]:
        """The lock watch's side connection (opened only for a statement past the threshold)."""
        return await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            application_name=f"inturn-worker {self.destination} lock watch",
            connect_timeout=lockwatch.CONNECT_TIMEOUT_SECONDS,
            **write_target(self.dsn),  # the locks are the primary's
        )

    def _on_lock_wait(self, wait: lockwatch.LockWait, added_seconds: float) -> None:
        self._tick()  # the loop is not wedged: it waits for another session, and says so
        self.observer.lock_wait(self.destination, added_seconds)
        now = time.monotonic()
        if wait.ended:
            self.state.lock_wait = None
            log.info(
                "destination %s: the lock wait is over after %.1fs",
                self.destination,
                wait.waited_seconds,
            )
            self._lock_wait_logged = 0.0
            return
        self.state.lock_wait = wait.describe()
        if now - self._lock_wait_logged >= LOCK_WAIT_LOG_EVERY_SECONDS:
            self._lock_wait_logged = now
            log.warning("destination %s: %s", self.destination, wait.describe())

    async def wait(self, conn: AsyncConnection[Any], stop: asyncio.Event, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a NOTIFY, or until stopped.

        The wait is on the connection's socket becoming readable (the event loop's own reader
        callback), not in psycopg's ``notifies()``, whose wait wakes ten times a second to check
        for interrupts: that alone cost an idle worker 0.2% of a core. Notifications already
        received (during an earlier query) are taken first, without waiting.

        Raises:
            SessionLost: the connection is lost (the caller reconnects).
        """
        try:
            await self._wait_readable(conn, stop, timeout)
        except psycopg.Error as exc:
            fault = classify_step("head", exc, connection_closed=conn.closed or conn.broken)
            if fault.action == "reconnect":
                raise SessionLost(fault) from exc
            log.info("destination %s: waiting for a notification: %s", self.destination, fault.text)

    async def _wait_readable(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, timeout: float
    ) -> None:
        if timeout <= 0 or await take_notifies(conn):
            return
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        fd = conn.fileno()
        loop.add_reader(fd, on_readable)
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {readable, stopped}
        try:
            await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(fd)
            stopped.cancel()
        if readable.done():
            await take_notifies(conn)  # consume them (or surface a lost connection)
        else:
            readable.cancel()


#: How the log and ``/readyz`` name each step.
_STEP_WORDS: dict[Step, str] = {
    "session": "setting up the session",
    "head": "reading the head",
    "attempt": "recording the failed attempt",
    "mark": "the delivered mark",
    "give_up": "marking the head failed",
}


async def take_notifies(conn: AsyncConnection[Any]) -> int:
    """Consume the notifications already received or readable now, without waiting; count."""
    taken = 0
    async for _ in conn.notifies(timeout=0):
        taken += 1
    return taken


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
