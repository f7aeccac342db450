"""What a worker does between sends: waits for work (a notification, or a poll behind a
pooler), holds outside its delivery window or while suspended, and reports its depth.

:class:`Idling` is the part of :class:`inturn.worker.drain.runner.DestinationWorker` that does
this (a base class beside :class:`inturn.worker.drain.holding.LeaseHolding`); the single stream
(:mod:`inturn.worker.drain.stream`) and the lanes (:mod:`inturn.worker.drain.lane_runner`) both
use it.

Idle cost. An enqueue's NOTIFY (sent in its transaction, delivered at COMMIT to the worker's
session, which LISTENs before its first head query) wakes the worker at once; without one, an
idle worker looks at its queue every ``idle_seconds`` or when its lease is due for renewal,
whichever comes first. The depth gauge costs one query at most every
:data:`DEPTH_EVERY_SECONDS` while the queue holds something, and none when the head query said
it is empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from functools import partial
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.drain.gate import OPEN, Gate, may_send
from inturn.worker.drain.holding import LeaseHolding
from inturn.worker.drain.steps import sleep_or_stop
from inturn.worker.store import delivery, reads
from inturn.worker.store.periodic import Periodic
from inturn.worker.store.sealing import INDEX_FORM_EVERY_SECONDS

log = logging.getLogger("inturn.drain")

#: Seconds between two depth queries while the queue holds something (an empty queue is known
#: from the head query alone and costs none).
DEPTH_EVERY_SECONDS = 5.0


class Idling(LeaseHolding):
    """Waiting, holding and the depth gauge of one destination's worker (see the module
    docstring).

    Attributes:
        poll_seconds: how often a pooled worker without a LISTEN connection looks for work.
    """

    poll_seconds: float
    #: The direct LISTEN connection of a pooled worker, while a session lasts.
    _listen: AsyncConnection[Any] | None
    #: ``time.monotonic()`` when the last attempt started (the throttle paces from it).
    _last_send: float | None
    #: While held outside the window: when it opens (for saying so once).
    _held_until: datetime | None
    #: Monotonic time of the next depth query (0: at once).
    _next_depth: float
    #: Monotonic time of the next look at the key store's blind index key (0: at once).
    _next_index_check: float = 0.0
    #: That look, a periodic statement (made at the first look).
    _index_look: Periodic | None = None
    payloads: PayloadCodec

    async def _refresh_index(self) -> None:
        """Take a rotated blind index key (``inturn keys rotate-index``) within
        :data:`~inturn.worker.store.sealing.INDEX_FORM_EVERY_SECONDS`: the order digests this
        worker records are then under the key the rotation re-indexes to. A periodic statement
        (:class:`~inturn.worker.store.periodic.Periodic`): a key store that refuses or does not
        answer (read-only, a lock timeout, its session gone, away) or a folder that cannot
        unwrap the new key is said once when it begins and once when it ends, shown on
        ``/readyz``, tried again after a bounded backoff; the worker goes on with the key it
        has (delivery does not need the blind index key)."""
        now = time.monotonic()
        if not self.payloads.enabled or now < self._next_index_check:
            return
        look = self._index_look
        if look is None:
            look = self._index_look = Periodic(
                log,
                "the key store's look for a rotated blind index key",
                INDEX_FORM_EVERY_SECONDS,
                self._take_index,
                cure="the key in use is kept",
            )
        await look.turn()
        self._next_index_check = time.monotonic() + look.wait()

    async def _take_index(self) -> None:
        if await self.payloads.refresh_index():
            log.info("blind index key: generation %d taken", self.payloads.generation)

    async def _wait(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, timeout: float, *, empty: bool
    ) -> None:
        """Wait up to ``timeout`` seconds for something to send (``empty``: the head query found
        nothing pending), or until stopped.

        On a direct connection, and with a LISTEN connection of its own behind a pooler, a
        NOTIFY wakes the worker (:meth:`StepRunner.wait`). Behind a pooler without one, it
        polls every ``poll_seconds`` with a read that changes nothing
        (:func:`inturn.worker.store.delivery.poll_head`) and wakes when the head is new or due.

        Raises:
            SessionLost: a connection was lost (the caller reconnects).
        """
        await self._refresh_index()
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
                conn, stop, "head", partial(delivery.poll_head, conn, self.destination)
            )
            if due or (head_id is not None and (empty or (not first and head_id != seen))):
                return
            seen, first = head_id, False

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

    def _gate(self) -> Gate:
        """The destination's window and throttle, judged now (:mod:`inturn.worker.drain.gate`);
        open without asking the clock when the destination has neither (twice per message)."""
        if self.config.schedule is None and self.config.messages_per_second is None:
            return OPEN
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

        The next depth query keeps its time (at most one every :data:`DEPTH_EVERY_SECONDS`):
        a queue that empties after each message at a steady trickle would otherwise query its
        depth before nearly every send (``bench/latency.py --hops`` counted 2,808 depth queries
        for 4,416 sends at 200 msg/s over five destinations), a round trip on each message's way.
        """
        self.observer.depth(self.destination, 0, 0.0, 0)
        self.observer.held(self.destination, self.config.suspend)
        self.state.unreadable = None  # a head held for its payload was skipped or erased

    async def _report_depth(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        force: bool = False,
        *,
        held: bool = False,
    ) -> None:
        """Query the destination's depth, at most every :data:`DEPTH_EVERY_SECONDS`: what
        waits, held or not (a destination on hold counts its rows and its channel log's
        messages not pulled, as ``queue depth`` does). ``held``: the head query said the
        destination is on hold (the depth's own ``held_at`` says so too when it lists it)."""
        await self._refresh_index()
        now = time.monotonic()
        if not force and now < self._next_depth:
            return
        self._next_depth = now + DEPTH_EVERY_SECONDS
        rows = await self.steps.run(
            conn, stop, "head", lambda: reads.own_depth(conn, self.destination)
        )
        if rows is None:
            return  # a schema before the depth's functions: an upgrade's migrations are running
        if rows:
            r = rows[0]
            self.observer.depth(self.destination, r.pending, r.oldest_seconds, r.max_attempts)
            held = held or r.held_at is not None
        else:
            self.observer.depth(self.destination, 0, 0.0, 0)
        self.observer.held(self.destination, held or self.config.suspend)
