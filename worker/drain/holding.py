"""How a worker holds its destination: the lease, taken, guarded, renewed and lost.

The lease (:mod:`inturn.worker.store.lease`: only its holder sends). The worker takes it (a
standby tries every ``acquire_seconds``), and every statement it runs per message (the head
query, the marks, the pull, the lanes' window and take) carries the lease's epoch; the one that
runs once the renewal is due (:meth:`LeaseHolding._renew_due`: ``renew_seconds`` since the last
renewal, or the lease no longer surely outliving an attempt started after it) renews it in the
same statement, the others check holder and epoch without writing the lease row (issue 43: a
write of the row per message was about a sixth of the backend's work on the delivered mark).
An idle worker renews at least every ``renew_seconds``. An attempt starts only while the lease
is valid for longer than the attempt's timeout (counted from the moment the statement that
renewed it was sent, so the worker's estimate is never later than the database's expiry). A
statement whose guard fails raises :class:`~inturn.worker.store.lease.LeaseLost`: the worker
sends nothing more and goes back to acquiring.

On a direct connection the worker also takes the destination's session advisory lock, before
the lease, and the lease records its backend (never behind a pooler, where a session lock would
belong to whichever backend the pooler picked): while the holder's session lives nobody else
gets the lock, and once it ends (a killed process's socket is closed by the kernel) a successor
takes the lease over at once instead of waiting for its expiry. Behind a pooler the expiry is
the only rule. A worker of an earlier version fences with the lock alone; this keeps the two
apart during an upgrade.

:class:`LeaseHolding` is the part of :class:`inturn.worker.drain.runner.DestinationWorker` that
does this (a base class, so that the per-message statements call it with no indirection); the
lanes (:mod:`inturn.worker.drain.lane_runner`) use the same methods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from psycopg import AsyncConnection

from inturn.worker.drain.observer import Observer
from inturn.worker.drain.state import WorkerHealth
from inturn.worker.drain.steps import StepRunner, sleep_or_stop
from inturn.worker.spec.config import LeaseSettings, WorkerConfig
from inturn.worker.store import delivery, locks
from inturn.worker.store import lease as leases
from inturn.worker.store.faults import Step
from inturn.worker.store.lease import Lease, LeaseLost

log = logging.getLogger("inturn.drain")

T = TypeVar("T")

#: A per-message statement renews the lease when less than the attempt timeout and this many
#: seconds are left of it (:meth:`LeaseHolding._renew_due`): the head it reads can then be sent
#: without a renewal of its own, unless the statement itself took longer than this.
RENEW_AHEAD_SECONDS = 1.0

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """Seconds on the clock the worker's lease estimate runs on: one that keeps counting while
    the process or its machine is not running (``CLOCK_BOOTTIME`` on Linux counts a suspended
    host or VM, which ``CLOCK_MONOTONIC`` leaves out; elsewhere the monotonic clock). A holder
    that wakes from a stop, a suspend or a frozen VM then finds its estimate run out and renews
    (the database says whether its epoch is still current) before it starts anything new."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


class LeaseHolding:
    """The lease of one destination, as its worker holds it (see the module docstring).

    Attributes:
        lease_settings: the lease settings in force (lifetime raised for the attempt timeout
            if need be).
        holder: this worker's identity in the lease table.
        lease: the lease held now, or None.
    """

    config: WorkerConfig
    state: WorkerHealth
    observer: Observer
    #: Runs every statement of the loop under the step-fault policy (:mod:`.steps`).
    steps: StepRunner
    #: Whether statements go through a pooler (no session lock then); None until found out.
    pooled: bool | None
    lease_settings: LeaseSettings
    holder: str
    lease: Lease | None
    #: This process has held the destination's lease before (a later acquisition, after a
    #: lost connection, keeps the backoff it persisted itself).
    _held_once: bool
    #: :func:`lease_clock` time before which the lease is surely valid, and when to renew it.
    _lease_until: float
    _renew_at: float

    def _init_lease(self, wanted: LeaseSettings) -> None:
        """Set the lease state up (no lease held), with ``wanted``'s lifetime raised to
        outlive the attempt timeout when it is shorter (said once)."""
        config = self.config
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
        self.holder = leases.holder_id()
        self.lease = None
        self._held_once = False
        self._lease_until = 0.0
        self._renew_at = 0.0

    @property
    def destination(self) -> str:
        """The queue key, ``namespace/name``."""
        return self.config.destination

    def _set_lock(self, held: bool) -> None:
        if self.state.lock_held != held:
            self.state.lock_held = held
            self.observer.lock(self.destination, held)

    def _tick(self) -> None:
        self.state.last_tick = time.monotonic()

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

    async def _acquire(self, conn: AsyncConnection[Any], stop: asyncio.Event) -> Lease | None:
        """Wait for the destination's lease (on a direct connection, its session lock first);
        None when stopped first.

        On a direct connection the session lock is taken before the lease, and the lease
        records this backend: while a holder's session lives nobody else gets the lock, and
        once it ends (a killed process: the kernel closes its socket) the next taker gets the
        lock and takes the lease over at once, raising the epoch. Whatever the connection, an
        expired lease is taken over (within ``ttl + acquire`` seconds of the holder's last
        renewal), even when its holder's session lives on (SIGSTOP, a frozen VM): the epoch,
        not the session, fences."""
        announced = False
        settings = self.lease_settings
        direct = not self.pooled
        while not stop.is_set():
            self._tick()
            started = lease_clock()
            locked = await self._session_lock(conn, stop)
            # Without the session lock (its holder's session lives: a stopped or frozen process,
            # a partition that left its socket open) the lease is still taken once it has
            # expired: the expiry is the rule on every connection, the session lock only lets a
            # successor in earlier. The old holder's statements then match no epoch, and it
            # starts nothing new when it wakes.
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
                    direct=direct and locked,
                ),
            )
            if lease is None and direct and locked:
                # a holder behind a pooler (no session lock) still holds it: let go
                await self.steps.run(
                    conn,
                    stop,
                    "session",
                    partial(locks.release_component_lock, conn, "worker", self.destination),
                )
            if lease is not None:
                if direct and not locked:
                    log.warning(
                        "destination %s: took the lease over from a holder whose lease expired"
                        " while its session lives (a stopped or frozen process?); it sends"
                        " nothing more once it wakes",
                        self.destination,
                    )
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

    def _renew_due(self) -> bool:
        """Whether the next guarded statement should renew the lease rather than only check it:
        ``renew_seconds`` have passed since the last renewal, or less than the attempt timeout
        and :data:`RENEW_AHEAD_SECONDS` are left of the lease (so that the head it reads may be
        sent at once)."""
        now = lease_clock()
        ahead = float(self.config.retry.timeout_seconds) + RENEW_AHEAD_SECONDS
        return now >= self._renew_at or self._lease_until - now <= ahead

    def _renewed(self, sent: float) -> None:
        """A statement sent at ``sent`` (:func:`lease_clock`) renewed the lease: it is valid for its
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
        *,
        renews: bool = True,
    ) -> T:
        """Run a statement guarded by the lease under the step policy; ``renews``: the
        statement renews the lease (the estimate then runs from when it was sent), else it only
        checks it or does not touch it.

        Raises:
            LeaseLost: the lease was taken over.
        """
        sent = lease_clock()
        result = await self.steps.run(
            conn, stop, step, call, item_id, between=partial(self._renew_between, conn)
        )
        if renews:
            self._renewed(sent)
        return result

    async def _guarded_due(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        step: Step,
        call: Callable[..., Awaitable[T]],
        item_id: int | None = None,
    ) -> T:
        """Run a per-message statement, ``call(renew=...)``, guarded by the lease under the step
        policy: renewing it when the renewal is due (:meth:`_renew_due`), else checking holder
        and epoch only.

        Raises:
            LeaseLost: the lease was taken over.
        """
        renew = self._renew_due()
        return await self._guarded(
            conn, stop, step, partial(call, renew=renew), item_id, renews=renew
        )

    async def _pull(self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease) -> int:
        """Pull this destination's messages from its channel's log into its queue (one batch,
        :func:`inturn.worker.store.delivery.pull`), guarded by ``lease``; returns how many rows
        it added. Run when the queue looks empty and when woken, so that nothing accepted stays
        in the log unseen.

        Raises:
            LeaseLost: the lease was taken over.
        """
        destination, channel = self.destination, self.config.channel
        pulled = await self._guarded_due(
            conn,
            stop,
            "head",
            lambda renew: delivery.pull(conn, destination, channel, lease=lease, renew=renew),
        )
        return pulled.count

    async def _renew_between(self, conn: AsyncConnection[Any]) -> None:
        """Between two tries of a failed guarded statement (which renewed nothing): renew the
        lease on its own, so that a mark repeated on a full disk or behind a lock is not taken
        over meanwhile.

        Raises:
            LeaseLost: another worker took the destination over (the repeats stop).
        """
        if self.lease is None:
            return
        sent = lease_clock()
        await leases.renew(conn, self.lease, self.lease_settings.ttl_seconds)
        self._renewed(sent)

    async def _keep_lease(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, lease: Lease
    ) -> None:
        """Renew the lease when it is due (a worker that holds without reading its head:
        suspended, or outside its delivery window)."""
        if lease_clock() < self._renew_at:
            return
        ttl = self.lease_settings.ttl_seconds
        await self._guarded(conn, stop, "head", partial(leases.renew, conn, lease, ttl))

    def _idle_for(self, seconds: float) -> float:
        """``seconds`` capped at the next renewal (an idle worker renews by reading its head)."""
        return max(0.0, min(seconds, self._renew_at - lease_clock()))

    def _lease_left(self) -> float:
        """Seconds the lease is surely still valid for (negative: maybe not at all)."""
        return self._lease_until - lease_clock()
