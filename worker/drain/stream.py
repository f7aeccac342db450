"""The drain loop of a destination with one lane: its head, one message at a time, in order.

Each turn reads the head (guarded by the lease, which it renews when due), waits when there is
nothing to send or the head is not due, keeps the window and the throttle (:mod:`.gate`), and
sends the head once (:func:`inturn.worker.drain.attempt.send_once`, as every lane does). A
delivery is marked in the same round trip that reads the next head
(:func:`inturn.worker.store.delivery.succeeded_next`); a failure is recorded by
:meth:`inturn.worker.drain.outcome.Outcomes._failed`.

There is no in-flight state: a crash between the receiver's ACK and the delivered mark leaves
the head pending, so the next lease holder sends it again (at most one duplicate per lost
holder, never a reorder).

:class:`SingleStream` is the part of :class:`inturn.worker.drain.runner.DestinationWorker` that
does this; several lanes (``spec.lanes.count`` above 1) are
:class:`inturn.worker.drain.lane_runner.LaneDrain` instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from psycopg import AsyncConnection

from inturn.worker import tracing
from inturn.worker.drain.attempt import send_once
from inturn.worker.drain.idle import DEPTH_EVERY_SECONDS, Idling
from inturn.worker.drain.outcome import Outcomes
from inturn.worker.drain.steps import sleep_or_stop
from inturn.worker.senders.base import FailureCause, Sender
from inturn.worker.store import delivery
from inturn.worker.store import lease as leases
from inturn.worker.store.lease import Lease
from inturn.worker.store.model import Head
from inturn.worker.worklist.hooks import Marker

log = logging.getLogger("inturn.drain")

#: While the head waits out a backoff for an unreachable receiver, the receiver is probed this
#: often (seconds): the first delivery follows its return within about this long.
PROBE_SECONDS = 2.0
#: Bound of one probe (a connect that hangs is a failed probe).
PROBE_TIMEOUT_SECONDS = 3.0


class SingleStream(Idling, Outcomes):
    """The single-stream drain of one destination's worker (see the module docstring).

    Attributes:
        sender: the destination's real sender.
        peer: the sender's credential-free summary, as traces name the peer.
        marker: what the rule packs add to a delivered mark here
            (:func:`inturn.worker.operations.packs.marker`), None when nothing.
        unmarked: acknowledged messages whose delivered mark has not committed yet, by id.
    """

    sender: Sender
    peer: str
    marker: Marker | None
    unmarked: dict[int, delivery.Delivered]

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
        idle = float(self.config.idle_seconds)
        after = 0
        prefetched: delivery.HeadResult | None = None
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
                head, wait = await self._guarded_due(
                    conn,
                    stop,
                    "head",
                    partial(delivery.next_head, conn, self.destination, after=after, lease=lease),
                )
                if head is None and wait is None and after:
                    after = 0
                    head, wait = await self._guarded_due(
                        conn,
                        stop,
                        "head",
                        partial(delivery.next_head, conn, self.destination, lease=lease),
                    )
            self.state.db_ok = True
            if head is None and wait is None:
                if await self._pull(conn, stop, lease):  # the channel log had messages for it
                    continue
                self._report_empty()
                await self._wait(conn, stop, self._idle_for(idle), empty=True)
                continue
            if wait == delivery.ON_HOLD:
                # held by a person or a restore found: what waits is still counted (log
                # messages not pulled included), at most every DEPTH_EVERY_SECONDS; a resume
                # wakes the worker
                await self._report_depth(conn, stop, held=True)
                await self._wait(
                    conn, stop, self._idle_for(min(idle, DEPTH_EVERY_SECONDS)), empty=False
                )
                continue
            if head is None:
                await self._report_depth(conn, stop)
                wait_for = self._idle_for(idle if wait is None else min(wait, idle))
                if self._unreachable_run and await self._probe_until(stop, wait_for):
                    # the receiver is back: its head goes now, not at the end of its backoff
                    await self._guarded(
                        conn,
                        stop,
                        "head",
                        partial(delivery.make_due, conn, self.destination, lease=lease),
                    )
                    continue
                await self._wait(conn, stop, wait_for, empty=False)
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
            if self._lease_left() <= timeout:
                # The attempt could outlive the lease (a throttle wait, a slow mark): renew first.
                ttl = self.lease_settings.ttl_seconds
                await self._guarded(conn, stop, "head", partial(leases.renew, conn, lease, ttl))
                if self._lease_left() <= timeout:
                    prefetched = (head, wait)  # the renewal itself was too slow: look again
                    continue
            self._last_send = time.monotonic()
            finished, prefetched = await self._attempt(conn, stop, head, lease)
            if finished:
                after = head.item.id
            if prefetched is None or prefetched != (None, None):  # empty: reported at the top
                # When due, after the send: a depth query never delays the message at hand.
                await self._report_depth(conn, stop)

    async def _probe_until(self, stop: asyncio.Event, seconds: float) -> bool:
        """While the head waits out its backoff for an unreachable receiver: probe the receiver
        every :data:`PROBE_SECONDS` (a connect, TLS where configured, no message), for up to
        ``seconds``; True as soon as it accepts one (the head then goes at once: the first
        delivery follows a receiver's return within a probe interval, whatever the outage's
        length). False when the time is up, or the sender cannot probe (then the backoff
        rules, as for a receiver that answers but refuses)."""
        probe = getattr(self.sender, "probe", None)
        if probe is None or seconds <= PROBE_SECONDS:
            return False
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await sleep_or_stop(stop, min(PROBE_SECONDS, left))
            if stop.is_set():
                return False
            self._tick()
            try:
                if await asyncio.wait_for(probe(), PROBE_TIMEOUT_SECONDS):
                    log.info(
                        "destination %s: the receiver accepts connections again", self.destination
                    )
                    return True
            except TimeoutError:
                pass
        return False

    async def _attempt(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, head: Head, lease: Lease
    ) -> tuple[bool, delivery.HeadResult | None]:
        """Send ``head`` once and record the outcome (the marks guarded by ``lease``).

        Returns whether the head is finished (delivered or given up) and, after a delivery,
        the next head read in the same round trip as the delivered mark.
        """
        item = head.item
        attempts = item.attempts + 1
        # Opened here, right before the send (an envelope this process cannot open holds the
        # queue at it: ciphertext is never sent). Plaintext rows pass unchanged.
        payload = await self._open_or_hold(conn, stop, head, lease)
        if not isinstance(payload, bytes):
            return False, None  # held: looked at again after its backoff
        shaped: bytes | tuple[FailureCause, str] = payload
        if self.config.profile is not None:  # spec.profile: the receiver's shape, or a refusal
            shaped = await self._for_receiver(conn, stop, head, payload, lease)
        sent = self.state.sending_since = time.monotonic()
        trace = tracing.attempt_started(
            self.destination, item.id, item.control_id, head.traceparent, attempts, self.peer
        )
        try:
            if isinstance(shaped, bytes):
                payload = shaped  # what the receiver gets: its ACK and the order's reply name it
                failure = await send_once(
                    self.sender, payload, item.id, self.config.retry.timeout_seconds
                )
            else:
                failure = shaped  # refused by the profile: nothing is written to the receiver
            if failure is None:
                self._attempted(trace, None, sent)
                held, self._unreachable_run = self._unreachable_run, 0
                # what the packs add to its mark (spec.replies: the replies it now waits for)
                mark = self.marker
                expecting = () if mark is None else mark(item.message_type, payload)
                # remembered until the mark commits: a lost session writes it first next time
                self.unmarked[item.id] = delivery.Delivered(item, attempts, expecting)
                waited, following = await self._guarded_due(
                    conn,
                    stop,
                    "mark",
                    lambda renew: delivery.succeeded_next(
                        conn, item, attempts, expecting, lease=lease, renew=renew
                    ),
                    item.id,
                )
                del self.unmarked[item.id]
                if attempts > 1 or held:  # the recovery is news as much as the failures were
                    log.info(
                        "destination %s: delivering again after %d failed attempt(s)%s (id=%d)",
                        self.destination,
                        attempts - 1,
                        f" and {held} unreachable" if held else "",
                        item.id,
                    )
                log.debug(
                    "destination %s: delivered id=%d attempts=%d",
                    self.destination,
                    item.id,
                    attempts,
                )
                if waited is not None:
                    self.observer.delivered(self.destination, attempts, waited)
                tracing.finished(trace, "delivered", attempts)
                return True, following
        finally:
            self.state.sending_since = None  # a delivery's mark counts as in flight too
        outcome, detail = failure
        self._attempted(trace, outcome, sent)
        decision = await self._failed(conn, stop, head, attempts, outcome, detail, lease)
        if decision.give_up:
            tracing.finished(trace, "failed", attempts)
        return decision.give_up, None
