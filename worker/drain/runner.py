"""The per-destination worker: holds the destination's lease and drains its head, in order.

One worker drains exactly one destination, one message at a time, through the destination's
real sender. Its single Postgres connection carries everything: the lease
(:mod:`inturn.worker.store.lease`: only its holder sends), LISTEN for enqueue notifications, the
head query, the marks and the depth gauge.

The lease. The worker takes it (a standby tries every ``acquire_seconds``), and every statement
it runs per message (the head query, the marks) carries the lease's epoch and renews it; an idle
worker renews it at least every ``renew_seconds``. An attempt starts only while the lease is
valid for longer than the attempt's timeout (counted from the moment the statement that renewed
it was sent, so the worker's estimate is never later than the database's expiry). A statement
whose guard fails raises :class:`~inturn.worker.store.lease.LeaseLost`: the worker sends
nothing more and goes back to acquiring. When the connection is lost it reconnects with backoff
and acquires again (its own lease at once, with a new epoch).

On a direct connection the worker also takes the destination's session advisory lock, before
the lease, and the lease records its backend (never behind a pooler, where a session lock would
belong to whichever backend the pooler picked): while the holder's session lives nobody else
gets the lock, and once it ends (a killed process's socket is closed by the kernel) a successor
takes the lease over at once instead of waiting for its expiry. Behind a pooler the expiry is
the only rule. A worker of an earlier version fences with the lock alone; this keeps the two
apart during an upgrade.

There is no in-flight state: a crash between the receiver's ACK and the delivered mark leaves
the head pending, so the next lease holder sends it again (at most one duplicate per lost
holder, never a reorder).

Every statement of the loop goes through :class:`inturn.worker.drain.steps.StepRunner` (the
step-fault policy and the lock watch); waiting for a notification is its :meth:`wait` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from inturn.worker import tracing
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.drain.gate import Gate, may_send
from inturn.worker.drain.lane_runner import LaneDrain
from inturn.worker.drain.observer import NullObserver, Observer
from inturn.worker.drain.retry import decide
from inturn.worker.drain.state import WorkerHealth
from inturn.worker.drain.steps import SessionLost, StepRunner, Stopped, sleep_or_stop
from inturn.worker.orders.keys import expectations
from inturn.worker.senders.base import DeliveryError, FailureCause, Sender
from inturn.worker.senders.fingerprint import fingerprint
from inturn.worker.spec.config import (
    LISTEN_DSN_ENV,
    LeaseSettings,
    WorkerConfig,
    lease_settings,
)
from inturn.worker.spec.config import poll_seconds as poll_env
from inturn.worker.store import lease as leases
from inturn.worker.store import locks, lockwatch, queue, reads
from inturn.worker.store.connect import connect_worker, detect_pooling
from inturn.worker.store.faults import KeyStoreUnavailable, Step, connection_gone
from inturn.worker.store.keystore import PgKeyStore
from inturn.worker.store.lease import Lease, LeaseLost
from inturn.worker.store.model import Head
from inturn.worker.worklist.delivery_failed import give_up
from inturn.worker.worklist.publish import Publisher, announce

log = logging.getLogger("inturn.drain")

#: Outcomes whose detail is the receiver's own text (MSA-3, ERR-8, ERR-3.2 of its ACK), which
#: may quote the message: with payload keys it is not stored (``WITHHELD`` instead).
RECEIVER_TEXT = frozenset({"AE", "AR", "CE", "CR"})
WITHHELD = "the receiver's text is not stored (payload keys are on: it may quote the message)"
#: Most characters of a failure cause stored in ``last_error``.
CAUSE_MAX_CHARS = 500
#: Seconds between two depth queries while the queue holds something (an empty queue is known
#: from the head query alone and costs none).
DEPTH_EVERY_SECONDS = 5.0
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
        lease: how the destination's lease is held; default
            :func:`inturn.worker.spec.config.lease_settings` of the environment. Its lifetime is
            raised to outlive the attempt timeout when it is shorter (said once at start).
        pooled: whether statements go through a pooler that moves sessions between backends
            (then no session advisory lock is taken, no statement is prepared, and LISTEN runs
            on ``listen_dsn`` or not at all); None: the worker finds out at start
            (:func:`inturn.worker.store.connect.detect_pooling`).
        payloads: opens stored payloads right before the send (default: no keys, plaintext
            passes and an envelope stops the worker with one line naming ``--payload-keys``:
            :data:`inturn.worker.crypto.errors.REFUSALS` end :meth:`run`).
        listen_dsn: a direct DSN for LISTEN when ``dsn`` is pooled (``--listen-dsn``); default
            ``$INTURN_LISTEN_DSN``. Without one a pooled worker polls.
        poll_seconds: how often a pooled worker without ``listen_dsn`` looks for work; default
            :func:`inturn.worker.spec.config.poll_seconds` of the environment.
    """

    def __init__(
        self,
        config: WorkerConfig,
        dsn: str,
        sender: Sender,
        observer: Observer | None = None,
        publishers: Sequence[Publisher] = (),
        lock_wait_seconds: float | None = None,
        lease: LeaseSettings | None = None,
        pooled: bool | None = None,
        payloads: PayloadCodec | None = None,
        listen_dsn: str | None = None,
        poll_seconds: float | None = None,
    ) -> None:
        self.config = config
        self.payloads = payloads or PayloadCodec()
        self.dsn = dsn
        self.sender = sender
        self.observer: Observer = observer or NullObserver()
        #: Digest of the sender settings (see :mod:`inturn.worker.senders.fingerprint`).
        self.sender_fingerprint = fingerprint(config.sender)
        self.state = WorkerHealth()
        if isinstance(self.payloads.store, PgKeyStore):
            self.state.key_store = self.payloads.store.health
        self.publishers = publishers
        #: The sender's credential-free summary, as traces name the peer.
        self.peer = sender.describe()
        self._wake = asyncio.Event()
        self._next_depth = 0.0
        self.lock_wait_seconds = (
            lockwatch.threshold_from_env() if lock_wait_seconds is None else lock_wait_seconds
        )
        #: Runs every statement of the loop under the step-fault policy (:mod:`.steps`).
        self.steps = StepRunner(
            config.destination, dsn, self.state, self.observer, self.lock_wait_seconds
        )
        #: ``time.monotonic()`` when the last attempt started (the throttle paces from it).
        self._last_send: float | None = None
        #: While held outside the window: when it opens (for saying so once).
        self._held_until: datetime | None = None
        #: Consecutive failures that said the destination is unreachable (the backoff of a held
        #: queue grows with it; any answer from the receiver ends the run).
        self._unreachable_run = 0
        wanted = lease or lease_settings(os.environ)
        #: The lease settings in force (lifetime raised for the attempt timeout if need be).
        self.lease_settings = wanted.for_timeout(config.retry.timeout_seconds)
        if self.lease_settings != wanted:
            log.info(
                "destination %s: lease lifetime %.0fs (raised from %.0fs to outlive the attempt"
                " timeout of %ds); takeover within %.0fs",
                config.destination,
                self.lease_settings.ttl_seconds,
                wanted.ttl_seconds,
                config.retry.timeout_seconds,
                self.lease_settings.takeover_bound_seconds(),
            )
        #: This worker's identity in the lease table.
        self.holder = leases.holder_id()
        #: The lease held now, or None.
        self.lease: Lease | None = None
        #: This process has held the destination's lease before (a later acquisition, after a
        #: lost connection, keeps the backoff it persisted itself).
        self._held_once = False
        #: Monotonic time before which the lease is surely valid, and when to renew it.
        self._lease_until = 0.0
        self._renew_at = 0.0
        self.pooled = pooled
        self.listen_dsn = listen_dsn or os.environ.get(LISTEN_DSN_ENV) or None
        self.poll_seconds = poll_seconds if poll_seconds is not None else poll_env(os.environ)
        #: The direct LISTEN connection of a pooled worker, while a session lasts.
        self._listen: AsyncConnection[Any] | None = None

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
                except (psycopg.Error, SessionLost) as exc:
                    if not isinstance(exc, SessionLost | psycopg.OperationalError) and not (
                        connection_gone(exc)  # e.g. 25P03, an InternalError: the session ended
                    ):
                        raise
                    failures += 1
                    self._set_lock(False)
                    self.state.db_ok = False
                    delay = backoff_seconds(failures, RECONNECT_BASE_SECONDS, RECONNECT_MAX_SECONDS)
                    what = "connection lost" if self.state.connected_once else "unreachable"
                    if isinstance(exc, KeyStoreUnavailable):  # not the queue's database
                        log.warning(
                            "destination %s: %s; the head waits for it: next try in %.1fs",
                            self.destination,
                            _first_line(exc),
                            delay,
                        )
                    else:
                        log.warning(
                            "destination %s: database %s (%s); workers wait for it: next try"
                            " in %.1fs",
                            self.destination,
                            what,
                            _first_line(exc),
                            delay,
                        )
                    await sleep_or_stop(stop, delay)
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
        if self.pooled is None:
            pooling = await detect_pooling(self.dsn)
            self.pooled = pooling.pooled
            self.state.pooling = pooling.note or None
        name = f"inturn-worker {self.destination}"
        # Behind a pooler one name for every worker: PgBouncer sets a server connection's
        # application_name again whenever it passes to a client with another (a statement more).
        shared = "inturn-worker" if self.pooled else name
        conn = await connect_worker(self.dsn, application_name=shared, pooled=self.pooled)
        self.state.db_ok = True
        self.state.connected_once = True
        try:
            if not self.pooled:
                await self.steps.run(
                    conn, stop, "session", lambda: queue.listen(conn, self.destination)
                )
            elif self.listen_dsn:
                # LISTEN needs a session: a direct connection of its own (the chart's -rw
                # service), while every statement goes through the pooler.
                self._listen = await connect_worker(
                    self.listen_dsn, application_name=f"{name} listen", pooled=False
                )
                listening = self._listen
                await self.steps.run(
                    listening, stop, "session", lambda: queue.listen(listening, self.destination)
                )
            while not stop.is_set():
                lease = await self._acquire(conn, stop)
                if lease is None:
                    return
                try:
                    await self._hold(conn, stop, lease)
                except LeaseLost as exc:
                    self._lost(exc)
        except Stopped:
            pass
        finally:
            self.state.trouble = self.state.lock_wait = None
            held, self.lease = self.lease, None
            self._set_lock(False)
            if held is not None and not (conn.closed or conn.broken):
                with contextlib.suppress(Exception):  # a clean stop: the successor need not wait
                    await leases.release(conn, held)
            # Closing the session releases the advisory lock on the server.
            with contextlib.suppress(Exception):
                await conn.close()
            listener, self._listen = self._listen, None
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()

    async def _wait(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, timeout: float, *, empty: bool
    ) -> None:
        """Wait up to ``timeout`` seconds for something to send (``empty``: the head query found
        nothing pending), or until stopped.

        On a direct connection, and with a LISTEN connection of its own behind a pooler, a
        NOTIFY wakes the worker (:meth:`StepRunner.wait`). Behind a pooler without one, it
        polls every ``poll_seconds`` with a read that changes nothing
        (:func:`inturn.worker.store.queue.poll_head`) and wakes when the head is new or due.

        Raises:
            SessionLost: a connection was lost (the caller reconnects).
        """
        if not self.pooled:
            await self.steps.wait(conn, stop, timeout)
            return
        if self._listen is not None:
            await self.steps.wait(self._listen, stop, timeout)
            return
        deadline = time.monotonic() + timeout
        seen: int | None = None
        first = True
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not first:
                await sleep_or_stop(stop, min(left, self.poll_seconds))
                if stop.is_set() or time.monotonic() >= deadline:
                    return
            head_id, due = await self.steps.run(
                conn, stop, "head", partial(queue.poll_head, conn, self.destination)
            )
            if due or (head_id is not None and (empty or (not first and head_id != seen))):
                return
            seen, first = head_id, False

    def _lost(self, exc: LeaseLost) -> None:
        """The lease was taken over (this worker was cut off or paused past its expiry)."""
        self.lease = None
        self._lease_until = self._renew_at = 0.0
        self._set_lock(False)
        log.warning(
            "destination %s: %s; sending nothing more, taking the lease again when it is free",
            self.destination,
            exc,
        )

    async def _hold(self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease) -> None:
        """Drain while holding ``lease``.

        Raises:
            LeaseLost: a guarded statement found the lease taken over.
        """
        starting = not self._held_once  # a backoff on the rows is a previous process's
        changed, made_due = await self._guarded(
            conn,
            stop,
            "session",
            lambda: queue.sender_changed(
                conn, self.destination, self.sender_fingerprint, lease=lease, starting=starting
            ),
        )
        self._held_once = True
        if changed:
            log.info(
                "destination %s: sender settings changed since the last worker;"
                " %d backing-off item(s) made due now (attempts and last error kept)",
                self.destination,
                made_due,
            )
        elif made_due:
            log.info(
                "destination %s: a starting worker tries its head at once: %d item(s) were"
                " waiting out a backoff of an earlier process (attempts and last error kept)",
                self.destination,
                made_due,
            )
        log.info(
            "destination %s: lease held (epoch %d, %.0fs, takeover within %.0fs), %s %s",
            self.destination,
            lease.epoch,
            self.lease_settings.ttl_seconds,
            self.lease_settings.takeover_bound_seconds(),
            "suspended, sending nothing to" if self.config.suspend else "draining via",
            self.sender.describe(),
        )
        await self._drain(conn, stop, lease)

    async def _acquire(self, conn: AsyncConnection[Any], stop: asyncio.Event) -> Lease | None:
        """Wait for the destination's lease (on a direct connection, its session lock first);
        None when stopped first.

        On a direct connection the session lock is taken before the lease, and the lease
        records this backend: while a holder's session lives nobody else gets the lock, and
        once it ends (a killed process: the kernel closes its socket) the next taker gets the
        lock and takes the lease over at once, raising the epoch. Behind a pooler only the
        lease's expiry lets a successor in."""
        announced = False
        settings = self.lease_settings
        direct = not self.pooled
        while not stop.is_set():
            self._tick()
            started = time.monotonic()
            lease: Lease | None = None
            if await self._session_lock(conn, stop):
                lease = await self.steps.run(
                    conn,
                    stop,
                    "session",
                    partial(
                        leases.acquire,
                        conn,
                        self.destination,
                        self.holder,
                        settings.ttl_seconds,
                        direct=direct,
                    ),
                )
                if lease is None and direct:
                    # a holder behind a pooler (no session lock) still holds it: let go
                    await self.steps.run(
                        conn,
                        stop,
                        "session",
                        partial(locks.release_component_lock, conn, "worker", self.destination),
                    )
            if lease is not None:
                self.lease = lease
                self._renewed(started)
                self._set_lock(True)
                return lease
            if not announced:
                log.info(
                    "destination %s: another worker holds the lease; trying every %.0fs"
                    " (taken over when it expires%s)",
                    self.destination,
                    settings.acquire_seconds,
                    "" if not direct else ", or at once when its holder's session ends",
                )
                announced = True
            await sleep_or_stop(stop, settings.acquire_seconds)
        return None

    async def _session_lock(self, conn: AsyncConnection[Any], stop: asyncio.Event) -> bool:
        """On a direct connection, the destination's session advisory lock (while a holder's
        session lives nobody else gets it; its lease records the backend that holds it); always
        True behind a pooler, where a session lock would belong to whichever backend the pooler
        picked."""
        if self.pooled:
            return True
        return bool(
            await self.steps.run(
                conn,
                stop,
                "session",
                partial(locks.try_component_lock, conn, "worker", self.destination),
            )
        )

    def _renewed(self, sent: float) -> None:
        """A statement sent at ``sent`` (monotonic) renewed the lease: it is valid for its
        lifetime from then at least (the database renewed it later than that)."""
        self._lease_until = sent + self.lease_settings.ttl_seconds
        self._renew_at = sent + self.lease_settings.renew_seconds

    async def _guarded(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        step: Step,
        call: Callable[[], Awaitable[T]],
        item_id: int | None = None,
    ) -> T:
        """Run a statement guarded by (and renewing) the lease under the step policy.

        Raises:
            LeaseLost: the lease was taken over.
        """
        sent = time.monotonic()
        result = await self.steps.run(
            conn, stop, step, call, item_id, between=partial(self._renew_between, conn)
        )
        self._renewed(sent)
        return result

    async def _renew_between(self, conn: AsyncConnection[Any]) -> None:
        """Between two tries of a failed guarded statement (which renewed nothing): renew the
        lease on its own, so that a mark repeated on a full disk or behind a lock is not taken
        over meanwhile.

        Raises:
            LeaseLost: another worker took the destination over (the repeats stop).
        """
        if self.lease is None:
            return
        sent = time.monotonic()
        await leases.renew(conn, self.lease, self.lease_settings.ttl_seconds)
        self._renewed(sent)

    async def _keep_lease(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease
    ) -> None:
        """Renew the lease when it is due (a worker that holds without reading its head:
        suspended, or outside its delivery window)."""
        if time.monotonic() < self._renew_at:
            return
        ttl = self.lease_settings.ttl_seconds
        await self._guarded(conn, stop, "head", partial(leases.renew, conn, lease, ttl))

    async def _hold_still(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, timeout: float
    ) -> None:
        """Wait while sending nothing (suspended, outside the window): a notification may still
        end it early on a connection that LISTENs; behind a pooler without one, a plain sleep
        (a poll would find nothing to do)."""
        if self.pooled and self._listen is None:
            await sleep_or_stop(stop, timeout)
        else:
            await self._wait(conn, stop, timeout, empty=False)

    def _idle_for(self, seconds: float) -> float:
        """``seconds`` capped at the next renewal (an idle worker renews by reading its head)."""
        return max(0.0, min(seconds, self._renew_at - time.monotonic()))

    async def _drain(self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease) -> None:
        """Send heads until stopped, holding ``lease``.

        ``after`` is the id this lock holder finished last: the head query starts above it, so
        its cost stays flat however many rows were delivered since the statistics were taken.
        When the queue looks empty it is looked at once more from the start, so that nothing
        can stay hidden below the bound.

        Idle cost. An enqueue's NOTIFY (sent in its transaction, delivered at COMMIT to this
        session, which LISTENs before its first head query) wakes the worker at once; without
        one, an idle worker looks at its queue every ``idle_seconds`` (60 by default) or when its
        lease is due for renewal, whichever comes first: one head query (which renews the lease),
        and no depth query, since "nothing pending" is what the head query said.

        Raises:
            LeaseLost: a guarded statement found the lease taken over.
        """
        if self.config.lanes > 1:  # spec.lanes: several in flight, each key in order
            await LaneDrain(self, conn, stop, lease=lease).run()
            return
        idle = float(self.config.idle_seconds)
        after = 0
        prefetched: queue.HeadResult | None = None
        while not stop.is_set():
            self._tick()
            if self.config.suspend:
                await self._keep_lease(conn, stop, lease)
                await self._report_depth(conn, stop)
                await self._hold_still(conn, stop, self._idle_for(idle))
                continue
            gate = self._gate()
            if gate.hold == "window":  # outside spec.schedule: hold, spend no attempt
                self._say_held(gate)
                await self._keep_lease(conn, stop, lease)
                await self._report_depth(conn, stop)
                await self._hold_still(conn, stop, self._idle_for(gate.wait_seconds))
                continue
            self._say_held(None)
            if prefetched is not None:
                (head, wait), prefetched = prefetched, None
            else:
                head, wait = await self._guarded(
                    conn,
                    stop,
                    "head",
                    partial(queue.next_head, conn, self.destination, after=after, lease=lease),
                )
                if head is None and wait is None and after:
                    after = 0
                    head, wait = await self._guarded(
                        conn,
                        stop,
                        "head",
                        partial(queue.next_head, conn, self.destination, lease=lease),
                    )
            self.state.db_ok = True
            if head is None and wait is None:
                self._report_empty()
                await self._wait(conn, stop, self._idle_for(idle), empty=True)
                continue
            await self._report_depth(conn, stop)
            if head is None:
                await self._wait(
                    conn,
                    stop,
                    self._idle_for(idle if wait is None else min(wait, idle)),
                    empty=False,
                )
                continue
            gate = self._gate()
            if gate.hold == "throttle":  # spec.throttle: the head waits, nothing overtakes it
                await sleep_or_stop(stop, gate.wait_seconds)
                if stop.is_set():
                    break
            elif gate.hold == "window":
                prefetched = (head, wait)  # the window closed meanwhile: keep the head
                continue
            timeout = float(self.config.retry.timeout_seconds)
            if self._lease_until - time.monotonic() <= timeout:
                # The attempt could outlive the lease (a throttle wait, a slow mark): renew first.
                ttl = self.lease_settings.ttl_seconds
                await self._guarded(conn, stop, "head", partial(leases.renew, conn, lease, ttl))
                if self._lease_until - time.monotonic() <= timeout:
                    prefetched = (head, wait)  # the renewal itself was too slow: look again
                    continue
            self._last_send = time.monotonic()
            finished, prefetched = await self._attempt(conn, stop, head, lease)
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
        rows = await self.steps.run(conn, stop, "head", lambda: reads.depth(conn, self.destination))
        if rows:
            r = rows[0]
            self.observer.depth(self.destination, r.pending, r.oldest_seconds, r.max_attempts)
        else:
            self.observer.depth(self.destination, 0, 0.0, 0)

    async def _attempt(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, head: Head, lease: Lease
    ) -> tuple[bool, queue.HeadResult | None]:
        """Send ``head`` once and record the outcome (the marks guarded by ``lease``).

        Returns whether the head is finished (delivered or given up) and, after a delivery,
        the next head read in the same round trip as the delivered mark.
        """
        item = head.item
        attempts = item.attempts + 1
        outcome: FailureCause
        # Opened here, right before the send (an envelope this process cannot open ends the
        # worker: ciphertext is never sent). Plaintext rows pass unchanged.
        payload = await self.payloads.open(item.id, item.destination, head.payload)
        sent = self.state.sending_since = time.monotonic()
        trace = tracing.attempt_started(
            self.destination, item.id, item.control_id, head.traceparent, attempts, self.peer
        )
        try:
            async with asyncio.timeout(self.config.retry.timeout_seconds):
                await self.sender.send(payload, item_id=item.id)
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
                expectations(
                    self.destination,
                    self.config.replies,
                    item.message_type,
                    payload,
                    self.payloads.order_digest,
                )
                if self.config.replies
                else []
            )
            waited, following = await self._guarded(
                conn,
                stop,
                "mark",
                lambda: queue.succeeded_next(conn, item, attempts, expecting, lease=lease),
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
        gave_up = await self._failed(conn, stop, head, attempts, outcome, detail, lease)
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
        lease: Lease,
    ) -> bool:
        """Apply the retry decision (:func:`inturn.worker.drain.retry.decide`) to a failed attempt:
        give up (returns True) or schedule a retry (False)."""
        item = head.item
        if self.payloads.enabled and outcome in RECEIVER_TEXT:
            detail = WITHHELD  # a receiver's AE text can quote the message: not kept in clear
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
            placement = await self._guarded(
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
                    lease=lease,
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
        await self._guarded(
            conn,
            stop,
            "attempt",
            lambda: queue.retry(
                conn, item.id, decision.attempts, decision.delay_seconds, cause, lease=lease
            ),
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
