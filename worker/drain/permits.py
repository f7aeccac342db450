"""A bound on the statements a process's workers run at once (``inturn local``).

A process hosting many workers (``inturn local`` runs one per Destination beside ingest)
would otherwise have one Postgres statement in flight per busy destination: with 200
destinations behind a fast feed, 200 backends runnable at once on the same cores as ingest and
its backend, whose commit the AA waits for. :class:`StatementPermits` holds each worker
statement (a head, a pull, the delivered mark and the next head, a failed attempt's record)
to one of ``limit`` permits, so at most ``limit`` worker backends run at once whatever the
number of destinations; the rest wait their turn in this process, where they cost nothing.

A permit is held only around a statement's round trip, never while a receiver answers, a
backoff or a throttle waits, or a worker waits for a notification: a slow or silent receiver
never makes another destination wait. A statement still running after
:data:`RELEASE_AFTER_SECONDS` (one waiting on a lock a person holds) gives its permit back and
runs on unbounded, so no statement can keep the others waiting for long; and a statement that
waited :data:`WAIT_AT_MOST_SECONDS` for a permit runs without one, so the bound never delays a
statement by more than that (a worker's lease, renewed by its statements, cannot run out in
the queue for permits).

The setting is ``INTURN_WORKER_STATEMENTS`` (:func:`permits_from_env`): unset, ``inturn
local`` takes :func:`default_limit` (half the CPUs it may run on, at least one); ``0`` removes
the bound. A worker pod (``inturn worker``) hosts one destination and takes no bound.

Why half the CPUs: measured on two cores with 200 destinations behind a 20 msg/s feed
(``bench/fanout.py``, docs/explanation/performance.md), one and two statements at a time left
the front door its share of the cores (the senders waited 1.4 and 3.1 ms a message for a CPU,
against 5.4 to 9.5 ms at eight, four or none; ACK p99 35 and 31 ms), at the cost of delivery
(494 and 640 a second against about 1,000); half the CPUs is the bound the full run measured.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from inturn.worker.errors import Invalid

#: The environment variable of the bound (a whole number; 0: none).
PERMITS_ENV = "INTURN_WORKER_STATEMENTS"
#: A statement running longer than this gives its permit back (seconds).
RELEASE_AFTER_SECONDS = 1.0
#: A statement that waited this long for a permit runs without one (seconds).
WAIT_AT_MOST_SECONDS = 5.0

T = TypeVar("T")


def default_limit() -> int:
    """Half the CPUs this process may run on (its affinity), at least 1: the other half is
    left to ingest, its Postgres backends and the server's own work."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // 2)


def permits_from_env(environ: Mapping[str, str] | None = None) -> StatementPermits | None:
    """The process's permits from ``INTURN_WORKER_STATEMENTS``: unset or empty,
    :func:`default_limit`; ``0``, None (no bound).

    Raises:
        Invalid: the variable is not a whole number of at least 0.
    """
    env = os.environ if environ is None else environ
    text = env.get(PERMITS_ENV, "").strip()
    if not text:
        return StatementPermits(default_limit())
    try:
        limit = int(text)
    except ValueError:
        raise Invalid(
            f"{PERMITS_ENV}={text!r}: a whole number of statements (0: no bound)"
        ) from None
    if limit < 0:
        raise Invalid(f"{PERMITS_ENV}={text!r}: a whole number of statements (0: no bound)")
    return StatementPermits(limit) if limit else None


class StatementPermits:
    """At most ``limit`` statements at once among the workers that share this object (one
    event loop). See the module docstring.

    Args:
        limit: permits, at least 1.
        release_after: seconds after which a statement still running gives its permit back.
        wait_at_most: seconds a statement waits for a permit before it runs without one.
    """

    def __init__(
        self,
        limit: int,
        release_after: float = RELEASE_AFTER_SECONDS,
        wait_at_most: float = WAIT_AT_MOST_SECONDS,
    ) -> None:
        if limit < 1:
            raise Invalid("statement permits: at least 1")
        self.limit = limit
        self.release_after = release_after
        self.wait_at_most = wait_at_most
        #: Statements that ran without a permit after waiting :attr:`wait_at_most`.
        self.unbounded = 0
        self._free = asyncio.Semaphore(limit)
        #: Statements running under a permit now (for tests and the log).
        self.running = 0
        #: The most that ran under a permit at once.
        self.peak = 0

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()`` holding a permit (waiting for one first, at most
        :attr:`wait_at_most`: then without one), given back when it ends or after
        :attr:`release_after`, whichever comes first."""
        try:
            async with asyncio.timeout(self.wait_at_most):
                await self._free.acquire()  # a cancelled acquire gives back what it got
        except TimeoutError:
            self.unbounded += 1
            return await call()
        held = True
        self.running += 1
        self.peak = max(self.peak, self.running)

        def give_back() -> None:
            nonlocal held
            if held:
                held = False
                self.running -= 1
                self._free.release()

        timer = asyncio.get_running_loop().call_later(self.release_after, give_back)
        try:
            return await call()
        finally:
            timer.cancel()
            give_back()
