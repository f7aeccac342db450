"""What a worker records of a failed attempt: a retry, or a give-up onto ``delivery-failed``.

The decision is :func:`inturn.worker.drain.retry.decide` (pure); this applies it: the retry mark
with its backoff, or the give-up (:func:`inturn.worker.worklist.delivery_failed.give_up`) and,
after its COMMIT, the worklist publishers. A failure cause is stored in ``last_error`` cut to
:data:`CAUSE_MAX_CHARS`; with payload keys on, a receiver's own text (which may quote the
message) is not stored. Every attempt's end also goes to the metrics and its trace span.

:class:`Outcomes` is the part of :class:`inturn.worker.drain.runner.DestinationWorker` that does
this (a base class beside :class:`inturn.worker.drain.idle.Idling`); the single stream
(:mod:`inturn.worker.drain.stream`) and the lanes (:mod:`inturn.worker.drain.lane_runner`) both
use it. A delivered mark is written where the next head is read (the stream's attempt, the
lanes' take), in the same statement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from inturn.worker import tracing
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.errors import REFUSALS, PayloadErased, PayloadKeysMissing
from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.drain.holding import LeaseHolding
from inturn.worker.drain.retry import RetryDecision, decide
from inturn.worker.drain.shaping import for_receiver
from inturn.worker.senders.base import FailureCause
from inturn.worker.store import delivery
from inturn.worker.store.lease import Lease
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


class Outcomes(LeaseHolding):
    """The failed attempts of one destination's worker, recorded (see the module docstring).

    Attributes:
        payloads: the payload codec (whether keys are on decides what a cause keeps).
        publishers: told of each message placed on ``delivery-failed``, after its COMMIT.
    """

    payloads: PayloadCodec
    publishers: Sequence[Publisher]
    #: Consecutive failures that said the destination is unreachable (the backoff of a held
    #: queue grows with it; any answer from the receiver ends the run).
    _unreachable_run: int

    #: The head that cannot be opened (its id) and how many looks at it failed in a row.
    _unreadable_run: tuple[int, int] = (0, 0)

    async def _open_or_hold(
        self, conn: AsyncConnection[Any], stop: asyncio.Event, head: Head, lease: Lease
    ) -> bytes | float:
        """The head's plaintext, opened right before its send (:meth:`PayloadCodec.open`), or,
        when this process cannot open it, the seconds the head is held for.

        An undecryptable head (:data:`inturn.worker.crypto.errors.REFUSALS`: a key erased, the
        wrong keys, a malformed envelope) is never sent and never given up: it is held like a
        head whose receiver is unreachable. One line says which item and the cure,
        ``last_error`` and ``/readyz`` say it too, no attempt is counted, and it is looked at
        again after a backoff (``spec.retry``), so a skip (``inturn queue skip ID``) or the
        keys (a worker restarted with ``--payload-keys``) resume delivery; nothing behind it
        is sent meanwhile (in the lanes: nothing of its lane keys).

        A process started with no payload keys at all can never send a sealed message: it does
        not hold, it raises :class:`PayloadKeysMissing`, which ends the worker with one line
        and a non-zero exit (``inturn worker``) or ends that destination's task with one line
        (``inturn local``); the head stays pending, untouched.

        Raises:
            LeaseLost: the lease was taken over while its hold was recorded.
            PayloadKeysMissing: a sealed head, and this process has no payload keys.
        """
        try:
            payload = await self.payloads.open(*head.binding, head.payload)
        except REFUSALS as exc:
            if isinstance(exc, PayloadKeysMissing) and not self.payloads.enabled:
                # no keys at all: nothing sealed can ever be sent by this process; it stops,
                # saying so once, and Kubernetes shows it (the head stays pending, untouched)
                raise
            return await self._unreadable(conn, stop, head, exc, lease)
        if self._unreadable_run[0] and self.config.lanes == 1:  # skipped: the queue moves
            self._unheld()
        return payload

    async def _for_receiver(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        head: Head,
        payload: bytes,
        lease: Lease,
    ) -> bytes | tuple[FailureCause, str]:
        """The opened ``payload`` of ``head`` as the destination's profile shapes it for its
        receiver, or ``("profile", detail)`` when the profile refuses it
        (:func:`inturn.worker.drain.shaping.for_receiver`; its MSH-13 number reserved under
        ``lease``). Called only when the destination has a profile.

        Raises:
            LeaseLost: the lease was taken over while the number was reserved.
        """
        profile = self.config.profile
        assert profile is not None
        item_id = head.item.id

        async def reserve() -> int | None:
            return await self._guarded(
                conn,
                stop,
                "head",
                lambda: delivery.reserve_sequence(conn, item_id, lease=lease),
                item_id,
            )

        return await for_receiver(payload, profile, reserve, reveal=not self.payloads.enabled)

    def _unheld(self) -> None:
        """The head held for its payload is gone (skipped, erased) or was opened."""
        self._unreadable_run = (0, 0)
        self.state.unreadable = None

    async def _unreadable(
        self,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        head: Head,
        exc: Exception,
        lease: Lease,
    ) -> float:
        item = head.item
        seen, run = self._unreadable_run
        run = run + 1 if seen == item.id else 1
        self._unreadable_run = (item.id, run)
        retry = self.config.retry
        delay = backoff_seconds(run, retry.backoff_seconds, retry.max_backoff_seconds)
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, PayloadErased):
            cure = f"it can never be delivered: `inturn queue skip {item.id}` moves on"
        elif "--payload-keys" in text:
            cure = f"or `inturn queue skip {item.id}` to move on without it"
        else:
            cure = (
                "restart the worker with the --payload-keys it was sealed under,"
                f" or `inturn queue skip {item.id}`"
            )
        why = f"id={item.id}: {text}; {cure}"
        self.state.unreadable = f"held at {why}"
        await self._guarded(
            conn,
            stop,
            "attempt",
            lambda: delivery.retry(
                conn, item.id, item.attempts, delay, why[:CAUSE_MAX_CHARS], lease=lease
            ),
            item.id,
        )
        log.log(
            logging.WARNING if run == 1 else logging.INFO,
            "destination %s: the queue holds at %s; nothing behind it is sent; next look in %.0fs",
            self.destination,
            why,
            delay,
        )
        return delay

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
        *,
        same_outage: bool = False,
    ) -> RetryDecision:
        """Apply the retry decision (:func:`inturn.worker.drain.retry.decide`) to a failed attempt:
        give up or schedule a retry; returns the decision (``give_up``, ``delay_seconds``...).

        ``same_outage``: an ``unreachable`` failure of an attempt that began before the
        destination was held for the same outage (another lane's attempt met it first): it
        neither lengthens the unreachable run nor logs a line of its own (the step has one)."""
        item = head.item
        if self.payloads.enabled and outcome in RECEIVER_TEXT:
            detail = WITHHELD  # a receiver's AE text can quote the message: not kept in clear
        cause = f"{outcome}: {detail}"[:CAUSE_MAX_CHARS]
        outage = same_outage and outcome == "unreachable" and self._unreachable_run > 0
        if not outage:
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
            return decision
        await self._guarded(
            conn,
            stop,
            "attempt",
            lambda: delivery.retry(
                conn, item.id, decision.attempts, decision.delay_seconds, cause, lease=lease
            ),
            item.id,
        )
        self.observer.retried(self.destination, decision.attempts, outcome)
        if decision.why == "unreachable":
            log.log(
                logging.DEBUG
                if outage
                else logging.WARNING
                if self._unreachable_run == 1
                else logging.INFO,
                "destination %s: unreachable (%s); the queue holds at id=%d, no attempt"
                " counted (%d failure(s) in a row); next try in %.0fs",
                self.destination,
                cause,
                item.id,
                self._unreachable_run,
                decision.delay_seconds,
            )
            return decision
        log.info(
            "destination %s: attempt %d of id=%d failed (%s); next in %.0fs",
            self.destination,
            attempts,
            item.id,
            cause,
            decision.delay_seconds,
        )
        return decision
