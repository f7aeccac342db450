"""The per-destination worker: holds the destination's lock and drains its head, in order.

One worker drains exactly one destination, one message at a time, through the destination's
real sender. Its single Postgres connection carries everything: the session advisory lock
(only the holder sends), LISTEN for enqueue notifications, the head query, the marks and the
depth gauge. Without the lock it sends nothing; when the connection is lost it stops sending,
reconnects with backoff and takes the lock again before the next send.

There is no in-flight state: a crash between the receiver's ACK and the delivered mark leaves
the head pending, so the next lock holder sends it again (at most one duplicate per lost
session, never a reorder).

Every statement of the loop goes through :meth:`DestinationWorker._step`, which applies the one
fault table of :func:`inturn.worker.store.faults.classify_step`: while the session lives (a full
disk, ``lock_timeout``, ``statement_timeout``...), the failed step alone is repeated after a
backoff, with ``/readyz`` saying why and liveness kept (a restart would lose what the worker
knows); only a lost session makes it reconnect. A delivered message whose mark cannot be
written is therefore marked again, never sent again. Each statement also runs under a lock
watch (:mod:`inturn.worker.store.lockwatch`): a wait on another session's lock longer than
the threshold is logged with the blocking session, shown on ``/readyz`` and counted in
``inturn_lock_wait_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from inturn.worker import tracing
from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.drain.gate import Gate, may_send
from inturn.worker.drain.observer import NullObserver, Observer
from inturn.worker.drain.retry import decide
from inturn.worker.errors import Unavailable
from inturn.worker.orders.keys import expectations
from inturn.worker.senders.base import DeliveryError, FailureCause, Sender
from inturn.worker.senders.fingerprint import fingerprint
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store import locks, lockwatch, queue
from inturn.worker.store.connect import connect_worker, write_target
from inturn.worker.store.faults import Step, StepFault, classify_step
from inturn.worker.store.model import Head
from inturn.worker.worklist.delivery_failed import give_up
from inturn.worker.worklist.publish import Publisher, announce

log = logging.getLogger("inturn.drain")

#: Most characters of a failure cause stored in ``last_error``.
CAUSE_MAX_CHARS = 500
#: Seconds between two depth queries while the queue holds something (an empty queue is known
#: from the head query alone and costs none).
DEPTH_EVERY_SECONDS = 5.0
#: Most seconds between two tries of a standby worker (another holds the lock) to take it.
STANDBY_POLL_SECONDS = 5.0
#: Reconnect backoff after a lost database connection: first delay and ceiling, seconds. The
#: ceiling is short so that a worker resumes within it of Postgres accepting connections again,
#: however long the outage (one connection attempt every 2 s while it lasts costs nothing).
RECONNECT_BASE_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 2.0
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


class _Stopped(Exception):
    """Stop was asked while a failed step waited to be repeated."""


@dataclass
class WorkerHealth:
    """What the health endpoints read.

    Attributes:
        lock_held: this worker holds the destination's lock.
        db_ok: the last database round trip succeeded.
        connected_once: the worker has reached the database at least once.
        last_tick: ``time.monotonic()`` of the last loop turn.
        sending_since: monotonic start of the attempt in flight, or None.
        trouble: why a step is being repeated on a live session (e.g. the delivered mark on a
            full disk), or None.
        lock_wait: the lock wait in progress past the threshold (blocking sessions), or None.
    """

    lock_held: bool = False
    db_ok: bool = False
    connected_once: bool = False
    last_tick: float = field(default_factory=time.monotonic)
    sending_since: float | None = None
    trouble: str | None = None
    lock_wait: str | None = None

    def alive(self, stale_after: float) -> bool:
        """Whether the loop turned within ``stale_after`` seconds (the attempt in flight counts)."""
        now = time.monotonic()
        if self.sending_since is not None:
            return True
        return now - self.last_tick <= stale_after

    def ready(self) -> bool:
        """Holds the lock, the database answered, no step is being repeated, no lock wait."""
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why the worker is not ready (one line), or None when it is."""
        if not self.lock_held or not self.db_ok:
            return "not holding the lock or no database"
        if self.lock_wait is not None:
            return self.lock_wait
        return self.trouble


class DestinationWorker:
    """Drains one destination. Create one per destination and ``await run(stop)``.

    Args:
        config: the destination's worker configuration.
        dsn: the database (libpq DSN or URI).
        sender: the destination's real sender; closed when ``run`` returns.
        observer: receives delivery events (metrics).
        publishers: told of each message placed on ``delivery-failed``, after its COMMIT.
        lock_wait_seconds: the lock-wait threshold (seconds > 0); default
            :func:`inturn.worker.store.lockwatch.threshold_from_env`.
    """

    def __init__(
        self,
        config: WorkerConfig,
        dsn: str,
        sender: Sender,
        observer: Observer | None = None,
        publishers: Sequence[Publisher] = (),
        lock_wait_seconds: float | None = None,
    ) -> None:
        self.config = config
        self.dsn = dsn
        self.sender = sender
        self.observer: Observer = observer or NullObserver()
        #: Digest of the sender settings (see :mod:`inturn.worker.senders.fingerprint`).
        self.sender_fingerprint = fingerprint(config.sender)
        self.state = WorkerHealth()
        self.publishers = publishers
        #: The sender's credential-free summary, as traces name the peer.
        self.peer = sender.describe()
        self._wake = asyncio.Event()
        self._next_depth = 0.0
        self.lock_wait_seconds = (
            lockwatch.threshold_from_env() if lock_wait_seconds is None else lock_wait_seconds
        )
        self._lock_wait_logged = 0.0
        #: ``time.monotonic()`` when the last attempt started (the throttle paces from it).
        self._last_send: float | None = None
        #: While held outside the window: when it opens (for saying so once).
        self._held_until: datetime | None = None
        #: Consecutive failures that said the destination is unreachable (the backoff of a held
        #: queue grows with it; any answer from the receiver ends the run).
        self._unreachable_run = 0

    @property
    def destination(self) -> str:
        """The queue key, ``namespace/name``."""
        return self.config.destination

    def health_window(self) -> float:
        """Seconds without a loop turn after which the worker is considered wedged."""
        return float(self.config.idle_seconds + self.config.retry.timeout_seconds + 30)

    async def run(self, stop: asyncio.Event) -> None:
        """Drain until ``stop`` is set; then finish (or time out) the attempt in flight,
        release the lock and return. Database outages are retried forever with backoff."""
        failures = 0
        try:
            while not stop.is_set():
                try:
                    await self._session(stop)
                    failures = 0
                except (psycopg.OperationalError, psycopg.InterfaceError, SessionLost) as exc:
                    failures += 1
                    self._set_lock(False)
                    self.state.db_ok = False
                    delay = backoff_seconds(failures, RECONNECT_BASE_SECONDS, RECONNECT_MAX_SECONDS)
                    what = "connection lost" if self.state.connected_once else "unreachable"
                    log.warning(
                        "destination %s: database %s (%s); workers wait for it: next try in %.1fs",
                        self.destination,
                        what,
                        _first_line(exc),
                        delay,
                    )
                    await _sleep_or_stop(stop, delay)
        finally:
            self._set_lock(False)
            await self.sender.close()

    def _set_lock(self, held: bool) -> None:
        if self.state.lock_held != held:
            self.state.lock_held = held
            self.observer.lock(self.destination, held)

    def _tick(self) -> None:
        self.state.last_tick = time.monotonic()

    async def _session(self, stop: asyncio.Event) -> None:
        conn = await connect_worker(self.dsn, application_name=f"inturn-worker {self.destination}")
        self.state.db_ok = True
        self.state.connected_once = True
        try:
            if not await self._acquire(conn, stop):
                return
            await self._step(conn, stop, "session", lambda: queue.listen(conn, self.destination))
            changed, made_due = await self._step(
                conn,
                stop,
                "session",
                lambda: queue.sender_changed(conn, self.destination, self.sender_fingerprint),
            )
            if changed:
                log.info(
                    "destination %s: sender settings changed since the last worker;"
                    " %d backing-off item(s) made due now (attempts and last error kept)",
                    self.destination,
                    made_due,
                )
            log.info(
                "destination %s: lock held, %s %s",
                self.destination,
                "suspended, sending nothing to" if self.config.suspend else "draining via",
                self.sender.describe(),
            )
            await self._drain(conn, stop)
        except _Stopped:
            pass
        finally:
            self.state.trouble = self.state.lock_wait = None
            self._set_lock(False)
            # Closing the session releases the advisory lock on the server.
            with contextlib.suppress(Exception):
                await conn.close()

    async def _acquire(self, conn: AsyncConnection[Any], stop: asyncio.Event) -> bool:
        """Wait for the destination's session lock; False when stopped first."""
        announced = False
        while not stop.is_set():
            self._tick()
            if await self._step(
                conn,
                stop,
                "session",
                partial(locks.try_component_lock, conn, "worker", self.destination),
            ):
                self._set_lock(True)
                return True
            if not announced:
                log.info("destination %s: another worker holds the lock; waiting", self.destination)
                announced = True
            await _sleep_or_stop(stop, min(float(self.config.idle_seconds), STANDBY_POLL_SECONDS))
        return False

    async def _drain(self, conn: AsyncConnection[Any], stop: asyncio.Event) -> None:
        """Send heads until stopped.

        ``after`` is the id this lock holder finished last: the head query starts above it, so
        its cost stays flat however many rows were delivered since the statistics were taken.
        When the queue looks empty it is looked at once more from the start, so that nothing
        can stay hidden below the bound.

        Idle cost. An enqueue's NOTIFY (sent in its transaction, delivered at COMMIT to this
        session, which LISTENs before its first head query) wakes the worker at once; without
        one, an idle worker looks at its queue every ``idle_seconds`` (60 by default): one head
        query, and no depth query, since "nothing pending" is what the head query said.
        """
        idle = float(self.config.idle_seconds)
        after = 0
        prefetched: queue.HeadResult | None = None
        while not stop.is_set():
            self._tick()
            if self.config.suspend:
                await self._report_depth(conn, stop)
                await self._wait(conn, stop, idle)
                continue
            gate = self._gate()
            if gate.hold == "window":  # outside spec.schedule: hold, spend no attempt
                self._say_held(gate)
                await self._report_depth(conn, stop)
                await self._wait(conn, stop, gate.wait_seconds)
                continue
            self._say_held(None)
            if prefetched is not None:
                (head, wait), prefetched = prefetched, None
            else:
                head, wait = await self._step(
                    conn,
                    stop,
                    "head",
                    partial(queue.next_head, conn, self.destination, after=after),
                )
                if head is None and wait is None and after:
                    after = 0
                    head, wait = await self._step(
                        conn, stop, "head", lambda: queue.next_head(conn, self.destination)
                    )
            self.state.db_ok = True
            if head is None and wait is None:
                self._report_empty()
                await self._wait(conn, stop, idle)
                continue
            await self._report_depth(conn, stop)
            if head is None:
                await self._wait(conn, stop, idle if wait is None else min(wait, idle))
                continue
            gate = self._gate()
            if gate.hold == "throttle":  # spec.throttle: the head waits, nothing overtakes it
                await _sleep_or_stop(stop, gate.wait_seconds)
                if stop.is_set():
                    break
            elif gate.hold == "window":
                prefetched = (head, wait)  # the window closed meanwhile: keep the head
                continue
            self._last_send = time.monotonic()
            finished, prefetched = await self._attempt(conn, stop, head)
            if finished:
                after = head.item.id

    def _gate(self) -> Gate:
        """The destination's window and throttle, judged now (:mod:`inturn.worker.drain.gate`)."""
        return may_send(
            now=datetime.now(UTC),
            monotonic=time.monotonic(),
            schedule=self.config.schedule,
            messages_per_second=self.config.messages_per_second,
            last_send=self._last_send,
        )

    def _say_held(self, gate: Gate | None) -> None:
        """Log once when the worker starts holding the queue for its window, and once when it
        resumes."""
        until = None if gate is None else gate.until
        if gate is not None and self._held_until != until:
            log.info(
                "destination %s: outside its delivery window (spec.schedule); holding the queue"
                " until %s",
                self.destination,
                until.isoformat() if until is not None else "further notice",
            )
        elif gate is None and self._held_until is not None:
            log.info("destination %s: delivery window open; sending again", self.destination)
        self._held_until = until if gate is not None else None

    def _report_empty(self) -> None:
        """Nothing is pending: the gauges say so without a query (failed items are not in them).

        The next depth query then runs as soon as anything is pending again.
        """
        self.observer.depth(self.destination, 0, 0.0, 0)
        self._next_depth = 0.0

    async def _report_depth(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, force: bool = False
    ) -> None:
        """Query the destination's depth, at most every :data:`DEPTH_EVERY_SECONDS`."""
        now = time.monotonic()
        if not force and now < self._next_depth:
            return
        self._next_depth = now + DEPTH_EVERY_SECONDS
        rows = await self._step(conn, stop, "head", lambda: queue.depth(conn, self.destination))
        if rows:
            r = rows[0]
            self.observer.depth(self.destination, r.pending, r.oldest_seconds, r.max_attempts)
        else:
            self.observer.depth(self.destination, 0, 0.0, 0)

    async def _wait(self, conn: AsyncConnection[Any], stop: asyncio.Event, timeout: float) -> None:
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
        if timeout <= 0 or await _take_notifies(conn):
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
            await _take_notifies(conn)  # consume them (or surface a lost connection)
        else:
            readable.cancel()

    async def _attempt(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, head: Head
    ) -> tuple[bool, queue.HeadResult | None]:
        """Send ``head`` once and record the outcome.

        Returns whether the head is finished (delivered or given up) and, after a delivery,
        the next head read in the same round trip as the delivered mark.
        """
        item = head.item
        attempts = item.attempts + 1
        outcome: FailureCause
        sent = self.state.sending_since = time.monotonic()
        trace = tracing.attempt_started(
            self.destination, item.id, item.control_id, head.traceparent, attempts, self.peer
        )
        try:
            async with asyncio.timeout(self.config.retry.timeout_seconds):
                await self.sender.send(head.payload, item_id=item.id)
        except DeliveryError as exc:
            outcome, detail = exc.outcome, exc.detail
        except TimeoutError:
            limit = self.config.retry.timeout_seconds
            if self.sender.written:
                outcome, detail = "timeout", f"no answer within {limit}s"
            else:
                outcome, detail = "unreachable", f"no connection within {limit}s"
        except OSError as exc:
            outcome = "connection" if self.sender.written else "unreachable"
            detail = str(exc) or type(exc).__name__
        else:
            self._attempted(trace, None, sent)
            held, self._unreachable_run = self._unreachable_run, 0
            # spec.replies: the replies this order now waits for, recorded with its mark
            expecting = (
                expectations(self.destination, self.config.replies, item.message_type, head.payload)
                if self.config.replies
                else []
            )
            waited, following = await self._step(
                conn,
                stop,
                "mark",
                lambda: queue.succeeded_next(conn, item, attempts, expecting),
                item.id,
            )
            if attempts > 1 or held:  # the recovery is news as much as the failures were
                log.info(
                    "destination %s: delivering again after %d failed attempt(s)%s (id=%d)",
                    self.destination,
                    attempts - 1,
                    f" and {held} unreachable" if held else "",
                    item.id,
                )
            log.debug(
                "destination %s: delivered id=%d attempts=%d", self.destination, item.id, attempts
            )
            if waited is not None:
                self.observer.delivered(self.destination, attempts, waited)
            tracing.finished(trace, "delivered", attempts)
            return True, following
        finally:
            self.state.sending_since = None
        self._attempted(trace, outcome, sent)
        gave_up = await self._failed(conn, stop, head, attempts, outcome, detail)
        if gave_up:
            tracing.finished(trace, "failed", attempts)
        return gave_up, None

    def _attempted(
        self, trace: tracing.Attempt | None, outcome: FailureCause | None, sent: float
    ) -> None:
        """An attempt that began at ``sent`` (monotonic) ended: metrics and its span."""
        self.observer.attempted(self.destination, outcome or "delivered", time.monotonic() - sent)
        tracing.attempt_ended(trace, outcome)

    async def _failed(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        head: Head,
        attempts: int,
        outcome: FailureCause,
        detail: str,
    ) -> bool:
        """Apply the retry decision (:func:`inturn.worker.drain.retry.decide`) to a failed attempt:
        give up (returns True) or schedule a retry (False)."""
        item = head.item
        cause = f"{outcome}: {detail}"[:CAUSE_MAX_CHARS]
        self._unreachable_run = self._unreachable_run + 1 if outcome == "unreachable" else 0
        decision = decide(
            outcome,
            attempts,
            self.config.retry,
            self.config.ack_policy,
            unreachable_run=max(1, self._unreachable_run),
        )
        if decision.give_up:
            placement = await self._step(
                conn,
                stop,
                "give_up",
                lambda: give_up(
                    conn,
                    item,
                    attempts=decision.attempts,
                    cause=cause,
                    outcome=outcome,
                    exhausted=decision.why == "maxAttempts",
                ),
                item.id,
            )
            if placement is not None:
                await announce([placement], self.publishers)
            self.observer.gave_up(self.destination, decision.attempts, outcome)
            log.warning(
                "destination %s: gave up on id=%d (%s) after %d attempt(s) (%s): %s",
                self.destination,
                item.id,
                item.control_id,
                decision.attempts,
                decision.why,
                cause,
            )
            return True
        await self._step(
            conn,
            stop,
            "attempt",
            lambda: queue.retry(conn, item.id, decision.attempts, decision.delay_seconds, cause),
            item.id,
        )
        self.observer.retried(self.destination, decision.attempts, outcome)
        if decision.why == "unreachable":
            log.log(
                logging.WARNING if self._unreachable_run == 1 else logging.INFO,
                "destination %s: unreachable (%s); the queue holds at id=%d, no attempt"
                " counted (%d failure(s) in a row); next try in %.0fs",
                self.destination,
                cause,
                item.id,
                self._unreachable_run,
                decision.delay_seconds,
            )
            return False
        log.info(
            "destination %s: attempt %d of id=%d failed (%s); next in %.0fs",
            self.destination,
            attempts,
            item.id,
            cause,
            decision.delay_seconds,
        )
        return False

    async def _step(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        step: Step,
        call: Callable[[], Awaitable[T]],
        item_id: int | None = None,
    ) -> T:
        """Run one statement (or transaction) of the loop; repeat it alone while the session
        lives (:func:`inturn.worker.store.faults.classify_step`).

        A failure on a live session sets ``state.trouble`` (``/readyz`` answers 503 with it),
        is logged, and the step is run again after a backoff from
        :data:`STEP_RETRY_BASE_SECONDS` doubling to :data:`STEP_RETRY_MAX_SECONDS`; the loop
        keeps turning (liveness holds). Each run is under a lock watch (:meth:`_watch`).

        Raises:
            SessionLost: the session is gone; for a ``mark`` step the head may be sent once more
                by the next lock holder.
            _Stopped: stop was asked while the step waited to be repeated (never for the
                delivered mark: a stop waits for it, as for the attempt in flight, and only
                abandoning cancels it).
        """
        failures = 0
        while True:
            self._tick()
            try:
                async with self._watch(conn):
                    result = await call()
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
                            "destination %s: the session was lost while marking id=%d delivered;"
                            " if the mark did not commit, the next lock holder sends it again",
                            self.destination,
                            item_id,
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
                if fault.meaning == "delivered":
                    # Part of the attempt in flight, which a stop lets finish: stopping now would
                    # send the message again. Only abandoning (a second signal) cancels it.
                    await asyncio.sleep(delay)
                    continue
                await _sleep_or_stop(stop, delay)
                if stop.is_set():
                    raise _Stopped from exc
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

    def _watch(self, conn: AsyncConnection[Any]) -> Any:
        """The lock watch of one step (:func:`inturn.worker.store.lockwatch.watch`)."""

        async def side() -> AsyncConnection[Any]:
            return await psycopg.AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                application_name=f"inturn-worker {self.destination} lock watch",
                connect_timeout=lockwatch.CONNECT_TIMEOUT_SECONDS,
                **write_target(self.dsn),  # the locks are the primary's
            )

        return lockwatch.watch(
            conn, side, threshold=self.lock_wait_seconds, on_wait=self._on_lock_wait
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


#: How the log and ``/readyz`` name each step.
_STEP_WORDS: dict[Step, str] = {
    "session": "setting up the session",
    "head": "reading the head",
    "attempt": "recording the failed attempt",
    "mark": "the delivered mark",
    "give_up": "marking the head failed",
}


async def _take_notifies(conn: AsyncConnection[Any]) -> int:
    """Consume the notifications already received or readable now, without waiting; count."""
    taken = 0
    async for _ in conn.notifies(timeout=0):
        taken += 1
    return taken


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
