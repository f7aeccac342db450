"""The per-destination worker: holds the destination's lease and drains its head, in order.

One worker drains exactly one destination, one message at a time, through the destination's
real sender. Its single Postgres connection carries everything: the lease
(:mod:`inturn.worker.store.lease`: only its holder sends), LISTEN for enqueue notifications, the
head query, the marks and the depth gauge. When the connection is lost the worker reconnects
with backoff and acquires the lease again (its own lease at once, with a new epoch).

:class:`DestinationWorker` is built from one base class per concern, each in its own module:

- :mod:`inturn.worker.drain.holding`: the lease and the session lock (taken, guarded, renewed,
  lost; a standby's wait);
- :mod:`inturn.worker.drain.idle`: waiting for work (NOTIFY, or a poll behind a pooler), holding
  outside the window or while suspended, the depth gauge;
- :mod:`inturn.worker.drain.outcome`: a failed attempt's retry or give-up;
- :mod:`inturn.worker.drain.stream`: the single stream's loop and its attempt (several lanes:
  :mod:`inturn.worker.drain.lane_runner`).

This module keeps the worker's construction and its session's lifecycle (connect, LISTEN,
acquire and hold, reconnect). Every statement of the loop goes through
:class:`inturn.worker.drain.steps.StepRunner` (the step-fault policy and the lock watch);
waiting for a notification is its :meth:`wait` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import psycopg
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.errors import PayloadKeysMissing
from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.drain.lane_runner import LaneDrain
from inturn.worker.drain.observer import NullObserver, Observer
from inturn.worker.drain.permits import StatementPermits
from inturn.worker.drain.state import WorkerHealth
from inturn.worker.drain.steps import SessionLost, StepRunner, Stopped, sleep_or_stop
from inturn.worker.drain.stream import SingleStream
from inturn.worker.operations import packs
from inturn.worker.senders.base import Sender
from inturn.worker.senders.fingerprint import fingerprint
from inturn.worker.spec.config import (
    LISTEN_DSN_ENV,
    LeaseSettings,
    WorkerConfig,
    lease_settings,
)
from inturn.worker.spec.config import poll_seconds as poll_env
from inturn.worker.store import capacity, delivery, lockwatch, notify, restore
from inturn.worker.store import lease as leases
from inturn.worker.store.connect import connect_worker, detect_pooling
from inturn.worker.store.faults import KeyStoreUnavailable, connection_gone
from inturn.worker.store.keystore import PgKeyStore
from inturn.worker.store.lease import Lease, LeaseLost
from inturn.worker.worklist.publish import Publisher

log = logging.getLogger("inturn.drain")

#: While a restored database waits for the operator's look, how often the worker looks again.
AFTER_RESTORE_POLL_SECONDS = 2.0


#: Reconnect backoff after a lost database connection: first delay and ceiling, seconds. The
#: ceiling is short so that a worker resumes within it of Postgres accepting connections again,
#: however long the outage (one connection attempt every 2 s while it lasts costs nothing).
class DatabaseAway:
    """The database away, as every worker of this process meets it: said once when the first
    worker loses it (naming the cause), once when the last one has it back (how long, how many
    failed tries), at DEBUG in between: a Postgres restart under 200 destinations is two lines,
    not one per destination and try. Keyed by DSN (:data:`AWAY`)."""

    def __init__(self) -> None:
        self.waiting: set[str] = set()
        self.since: float | None = None
        self.tries = 0
        self.cause = ""
        #: the database was found full (53300) in this outage, and said so
        self.full = False

    def failed(self, destination: str, what: str, cause: str, delay: float) -> None:
        """A worker's session failed: the first line of the condition, or a count."""
        self.tries += 1
        self.cause = cause
        first = self.since is None
        self.waiting.add(destination)
        if what == "full" and not self.full:  # said once, also when the outage began otherwise
            self.full = True
            self.since = self.since or time.monotonic()
            log.warning(
                "%s: destination %s has no session, and no worker of this process without"
                " one delivers until a connection is free (each retries every %.1fs to %.0fs):"
                " raise max_connections, or run fewer destinations on this server",
                cause,
                destination,
                delay,
                RECONNECT_MAX_SECONDS,
            )
        elif first:
            self.since = time.monotonic()
            log.warning(
                "database %s (%s): the workers of this process wait for it, each retrying"
                " every %.1fs to %.0fs (first: destination %s); said again when it is back",
                what,
                cause,
                delay,
                RECONNECT_MAX_SECONDS,
                destination,
            )
        else:
            log.debug("destination %s: database %s (%s)", destination, what, cause)

    def back(self, destination: str) -> None:
        """A worker has a session again: the closing line when it is the last one waiting."""
        if destination not in self.waiting:
            return
        self.waiting.discard(destination)
        if self.waiting or self.since is None:
            return
        log.info(
            "database back after %.1fs (%d failed tries by the workers of this process; last: %s)",
            time.monotonic() - self.since,
            self.tries,
            self.cause,
        )
        self.since, self.tries, self.cause, self.full = None, 0, "", False

    def gone(self, destination: str) -> None:
        """A worker stopped while waiting: no longer counted (no closing line for it)."""
        self.waiting.discard(destination)
        if not self.waiting:
            self.since, self.tries, self.cause, self.full = None, 0, "", False


#: The :class:`DatabaseAway` of each database this process's workers use, by DSN.
AWAY: dict[str, DatabaseAway] = {}

RECONNECT_BASE_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 2.0
#: The pause before a new session after an unexpected error (a bug): first and ceiling, seconds.
UNEXPECTED_BASE_SECONDS = 1.0
UNEXPECTED_MAX_SECONDS = 60.0


class DestinationWorker(SingleStream):
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
            passes and an envelope ends the worker with one line naming ``--payload-keys``:
            :meth:`inturn.worker.drain.outcome.Outcomes._open_or_hold`).
        listen_dsn: a direct DSN for LISTEN when ``dsn`` is pooled (``--listen-dsn``); default
            ``$INTURN_LISTEN_DSN``. Without one a pooled worker polls.
        poll_seconds: how often a pooled worker without ``listen_dsn`` looks for work; default
            :func:`inturn.worker.spec.config.poll_seconds` of the environment.
        permits: the bound on statements at once shared by the workers of this process
            (:mod:`inturn.worker.drain.permits`; ``inturn local``); None: no bound.
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
        permits: StatementPermits | None = None,
    ) -> None:
        self.config = config
        self.payloads = payloads or PayloadCodec()
        #: What the rule packs add to each delivered mark (the orders pack's expected replies),
        #: found once: None when no pack adds anything here (nothing is computed per message).
        #: Messages the receiver acknowledged whose delivered mark may not have committed (the
        #: database went away in between): written, only where still pending, before anything
        #: is sent in the next session, so that a database restart sends nothing twice while
        #: this process lives.
        self.unmarked: dict[int, delivery.Delivered] = {}
        self.marker = packs.marker(
            config, self.payloads.order_digest, keys_in_clear=not self.payloads.enabled
        )
        self.dsn = dsn
        self.sender = sender
        self.observer = observer or NullObserver()
        #: Digest of the sender settings (see :mod:`inturn.worker.senders.fingerprint`).
        self.sender_fingerprint = fingerprint(config.sender)
        self.state = WorkerHealth()
        if isinstance(self.payloads.store, PgKeyStore):
            self.state.key_store = self.payloads.store.health
        self.publishers = publishers
        self.peer = sender.describe()
        self._next_depth = 0.0
        #: The highest database clock tick this process saw (a lower one: a restore).
        self._seen_tick = 0
        self.lock_wait_seconds = (
            lockwatch.threshold_from_env() if lock_wait_seconds is None else lock_wait_seconds
        )
        self.steps = StepRunner(
            config.destination, dsn, self.state, self.observer, self.lock_wait_seconds, permits
        )
        self._last_send = None
        self._held_until = None
        self._unreachable_run = 0
        self._init_lease(lease or lease_settings(os.environ))
        self.pooled = pooled
        self.listen_dsn = listen_dsn or os.environ.get(LISTEN_DSN_ENV) or None
        self.poll_seconds = poll_seconds if poll_seconds is not None else poll_env(os.environ)
        self._listen = None

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
                    cause = _first_line(exc)
                    if capacity.too_many(exc):  # up and full: a setting to change, not a wait
                        what, cause = "full", capacity.refused_text(self.dsn)
                        self.state.refused = cause
                    if isinstance(exc, KeyStoreUnavailable):  # not the queue's database
                        log.warning(
                            "destination %s: %s; the head waits for it: next try in %.1fs",
                            self.destination,
                            _first_line(exc),
                            delay,
                        )
                    else:
                        away = AWAY.setdefault(self.dsn, DatabaseAway())
                        away.failed(self.destination, what, cause, delay)
                    await sleep_or_stop(stop, delay)
                except PayloadKeysMissing:  # this process can never send: it stops, once
                    raise
                except Exception as exc:  # a bug: said, seen on /readyz, and not the end of it
                    failures += 1
                    self._set_lock(False)
                    delay = backoff_seconds(
                        failures, UNEXPECTED_BASE_SECONDS, UNEXPECTED_MAX_SECONDS
                    )
                    what = f"{type(exc).__name__}: {_first_line(exc)}"
                    self.state.failure = f"session ended by an unexpected error ({what})"
                    log.error(
                        "destination %s: the worker's session ended by an unexpected error (%s);"
                        " nothing was lost (the head stays pending): a new session in %.0fs"
                        " (the traceback at --log-level DEBUG; please report it)",
                        self.destination,
                        what,
                        delay,
                    )
                    log.debug("destination %s: the error", self.destination, exc_info=exc)
                    await sleep_or_stop(stop, delay)
        finally:
            self._set_lock(False)
            leaving = AWAY.get(self.dsn)
            if leaving is not None:
                leaving.gone(self.destination)
            await self.sender.close()

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
        self.state.refused = None
        self.state.connected_once = True
        away = AWAY.get(self.dsn)
        if away is not None:
            away.back(self.destination)
        try:
            if not self.pooled:
                await self.steps.run(
                    conn,
                    stop,
                    "session",
                    lambda: notify.listen(conn, self.destination, self.config.channel),
                )
            elif self.listen_dsn:
                # LISTEN needs a session: a direct connection of its own (the chart's -rw
                # service), while every statement goes through the pooler.
                self._listen = await connect_worker(
                    self.listen_dsn, application_name=f"{name} listen", pooled=False
                )
                listening = self._listen
                await self.steps.run(
                    listening,
                    stop,
                    "session",
                    lambda: notify.listen(listening, self.destination, self.config.channel),
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
            lambda: delivery.sender_changed(
                conn, self.destination, self.sender_fingerprint, lease=lease, starting=starting
            ),
        )
        self._held_once = True
        self.state.failure = None  # a session after an unexpected error holds its lease again
        if self.unmarked:
            await self._mark_remembered(conn, stop, lease)
        await self._after_restore(conn, stop, lease)
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
        # said at the first holding; a holding again after a lost session (a database restart
        # under 200 destinations) is the database's condition, said once by DatabaseAway
        log.log(
            logging.INFO if starting else logging.DEBUG,
            "destination %s: lease held (epoch %d, %.0fs, takeover within %.0fs), %s %s",
            self.destination,
            lease.epoch,
            self.lease_settings.ttl_seconds,
            self.lease_settings.takeover_bound_seconds(),
            "suspended, sending nothing to" if self.config.suspend else "draining via",
            self.sender.describe(),
        )
        if self.config.lanes > 1:  # spec.lanes: several in flight, each key in order
            await LaneDrain(self, conn, stop, lease=lease).run()
        else:
            await self._drain(conn, stop, lease)

    async def _after_restore(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease
    ) -> None:
        """Before anything is sent in a session: when the database's clock (``inturn_clock``,
        moved on by the operator) is older than one this process saw, the database went back in
        time (restored from a backup). Nothing is sent until the operator has looked (its next
        tick: it then holds the destination unless ``spec.afterRestore`` is ``resend``, see
        docs/howto/backups.md); the lease is kept meanwhile.

        Raises:
            LeaseLost: the lease was taken over meanwhile.
        """
        # the clock's read renews nothing: the lease estimate stays the acquisition's
        tick = await self._guarded(conn, stop, "session", lambda: restore.clock(conn), renews=False)
        if tick >= self._seen_tick:
            self._seen_tick = tick
            return
        log.warning(
            "destination %s: the queue database went back in time (its clock %d, this worker saw"
            " %d): nothing is sent until the operator has looked at it (within its tick)",
            self.destination,
            tick,
            self._seen_tick,
        )
        while not stop.is_set():
            await self._keep_lease(conn, stop, lease)
            await self._hold_still(conn, stop, AFTER_RESTORE_POLL_SECONDS)
            now = await self._guarded(
                conn, stop, "session", lambda: restore.clock(conn), renews=False
            )
            if now > tick:
                log.info(
                    "destination %s: the operator has looked at the restored database; its"
                    " hold (if any) decides from here",
                    self.destination,
                )
                self._seen_tick = now
                return

    async def _mark_remembered(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease
    ) -> None:
        """Write the delivered marks of :attr:`unmarked` (the receiver acknowledged them, the
        database went away before the mark committed, or while it did), guarded by the lease
        just taken, only for rows still pending, in one batch
        (:func:`inturn.worker.store.delivery.mark_remembered`): before the head is read, so
        that none of them is sent again.

        Raises:
            LeaseLost: another holder took the destination over meanwhile.
        """
        remembered = list(self.unmarked.values())
        marked = await self._guarded(
            conn,
            stop,
            "mark",
            partial(delivery.mark_remembered, conn, self.destination, remembered, lease=lease),
        )
        for d in remembered:
            self.unmarked.pop(d.item.id, None)
        log.info(
            "destination %s: marked %d message(s) delivered that the receiver had acknowledged"
            " before the database connection was lost, not sending them again (%d already"
            " marked, or skipped or erased meanwhile)",
            self.destination,
            len(marked),
            len(remembered) - len(marked),
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
