"""The retry decision: after a failed attempt, give the head up or try it again, and when.

One pure function, :func:`decide`, of (outcome, attempts so far, retry policy, ACK policy),
returning a small immutable :class:`RetryDecision`; the worker
(``inturn.worker.drain.outcome``) only applies it: it records the decision, counts it and logs
it. Modelled on procrastinate's ``RetryStrategy.get_retry_decision``
(``procrastinate/retry.py``), and tested the same way, as a table (``tests/unit/test_retry.py``).

The rules, in order:

1. the destination is ``unreachable`` (nothing about this message was heard: DNS, refused,
   reset or closed before any reply, TLS handshake, no connection within the attempt's
   timeout) and ``retry.unreachable`` is ``hold`` (the default): the queue waits, the attempt
   is not counted (the recorded count stays one less), and the backoff grows with the run of
   unreachable failures, not with the message's attempts. A destination that stays down is
   raised as stuck by the sweeper (``spec.alerting.stuckAfterSeconds``); it never spends a
   message's ``maxAttempts``, so no message leaves its place in the stream because a receiver
   was down (a person's resend of a failed message would arrive after later ones about the
   same patient). With ``count``, it is counted like any failure (the behaviour before);
2. the destination's ``ackPolicy`` says ``fail`` for the outcome: give up at once (the outcomes
   it does not name, e.g. transport failures, are retried);
3. ``retry.maxAttempts`` attempts have been made (0 means no limit): give up;
4. otherwise retry after the backoff of :func:`inturn.worker.drain.backoff.backoff_seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.spec.config import AckPolicy, RetryPolicy

#: Why a head was given up (also the ``why`` of a decision to give up).
GiveUpWhy = Literal["ackPolicy", "maxAttempts"]
#: Why a head is kept: ``backoff`` (an attempt counted) or ``unreachable`` (held, not counted).
RetryWhy = Literal["backoff", "unreachable"]
#: The failure cause that says the destination, not the message, failed.
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class RetryDecision:
    """What to do with the head after a failed attempt.

    Attributes:
        give_up: mark the head failed (the next head goes); False: keep it pending.
        delay_seconds: when retried, the seconds before the next attempt (0 when given up).
        attempts: the attempt count to record (the attempts so far; one less when the attempt
            is not to be counted, e.g. a stale pooled connection replaced by a fresh one).
        why: ``ackPolicy`` or ``maxAttempts`` when given up; ``backoff`` when retried with the
            attempt counted, ``unreachable`` when the queue is held without counting it.
    """

    give_up: bool
    delay_seconds: float
    attempts: int
    why: GiveUpWhy | RetryWhy

    @classmethod
    def retry_in(cls, seconds: float, attempts: int) -> RetryDecision:
        """Retry after ``seconds`` (>= 0), recording ``attempts``."""
        return cls(give_up=False, delay_seconds=float(seconds), attempts=attempts, why="backoff")

    @classmethod
    def hold(cls, seconds: float, attempts: int) -> RetryDecision:
        """Hold the queue and try again after ``seconds``, recording ``attempts`` (the attempt
        that failed is not among them)."""
        return cls(
            give_up=False, delay_seconds=float(seconds), attempts=attempts, why="unreachable"
        )

    @classmethod
    def stop(cls, why: GiveUpWhy, attempts: int) -> RetryDecision:
        """Give the head up, recording ``attempts``."""
        return cls(give_up=True, delay_seconds=0.0, attempts=attempts, why=why)


def decide(
    outcome: str,
    attempts: int,
    retry: RetryPolicy,
    ack: AckPolicy,
    *,
    unreachable_run: int = 1,
) -> RetryDecision:
    """Decide what follows a failed attempt.

    Args:
        outcome: the failure class (:data:`inturn.worker.senders.base.FailureCause`, e.g. ``AR``,
            ``timeout``, ``unreachable``).
        attempts: attempts made so far, the failed one included (1 after the first).
        retry: the destination's retry policy (``maxAttempts``, backoff base and ceiling,
            ``unreachable``: ``hold`` or ``count``).
        ack: the destination's ACK policy (``retry`` or ``fail`` per outcome).
        unreachable_run: consecutive ``unreachable`` failures of the destination, this one
            included (>= 1); the backoff of a held queue grows with it.

    Raises:
        ValueError: ``attempts`` < 1 or ``unreachable_run`` < 1.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if unreachable_run < 1:
        raise ValueError(f"unreachable_run must be >= 1, got {unreachable_run}")
    if outcome == UNREACHABLE and retry.unreachable == "hold":
        delay = backoff_seconds(unreachable_run, retry.backoff_seconds, retry.max_backoff_seconds)
        return RetryDecision.hold(delay, attempts - 1)
    if ack.action(outcome, retry.max_attempts) == "fail":
        return RetryDecision.stop("ackPolicy", attempts)
    if retry.max_attempts > 0 and attempts >= retry.max_attempts:
        return RetryDecision.stop("maxAttempts", attempts)
    delay = backoff_seconds(attempts, retry.backoff_seconds, retry.max_backoff_seconds)
    return RetryDecision.retry_in(delay, attempts)
