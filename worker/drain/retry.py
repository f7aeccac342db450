"""The retry decision: after a failed attempt, give the head up or try it again, and when.

One pure function, :func:`decide`, of (outcome, attempts so far, retry policy, ACK policy),
returning a small immutable :class:`RetryDecision`; the worker (``inturn.worker.drain.runner``) only
applies it: it records the decision, counts it and logs it. Modelled on procrastinate's
``RetryStrategy.get_retry_decision`` (``procrastinate/retry.py``), and tested the same way, as
a table (``tests/unit/test_retry.py``).

The rules, in order:

1. the destination's ``ackPolicy`` says ``fail`` for the outcome: give up at once (the outcomes
   it does not name, e.g. transport failures, are retried);
2. ``retry.maxAttempts`` attempts have been made (0 means no limit): give up;
3. otherwise retry after the backoff of :func:`inturn.worker.drain.backoff.backoff_seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.spec.config import AckPolicy, RetryPolicy

#: Why a head was given up (also the ``why`` of a decision to give up).
GiveUpWhy = Literal["ackPolicy", "maxAttempts"]


@dataclass(frozen=True)
class RetryDecision:
    """What to do with the head after a failed attempt.

    Attributes:
        give_up: mark the head failed (the next head goes); False: keep it pending.
        delay_seconds: when retried, the seconds before the next attempt (0 when given up).
        attempts: the attempt count to record (the attempts so far; one less when the attempt
            is not to be counted, e.g. a stale pooled connection replaced by a fresh one).
        why: ``ackPolicy`` or ``maxAttempts`` when given up, ``backoff`` when retried.
    """

    give_up: bool
    delay_seconds: float
    attempts: int
    why: GiveUpWhy | Literal["backoff"]

    @classmethod
    def retry_in(cls, seconds: float, attempts: int) -> RetryDecision:
        """Retry after ``seconds`` (>= 0), recording ``attempts``."""
        return cls(give_up=False, delay_seconds=float(seconds), attempts=attempts, why="backoff")

    @classmethod
    def stop(cls, why: GiveUpWhy, attempts: int) -> RetryDecision:
        """Give the head up, recording ``attempts``."""
        return cls(give_up=True, delay_seconds=0.0, attempts=attempts, why=why)


def decide(outcome: str, attempts: int, retry: RetryPolicy, ack: AckPolicy) -> RetryDecision:
    """Decide what follows a failed attempt.

    Args:
        outcome: the failure class (:data:`inturn.worker.senders.base.FailureCause`, e.g. ``AR``,
            ``timeout``, ``connection``).
        attempts: attempts made so far, the failed one included (1 after the first).
        retry: the destination's retry policy (``maxAttempts``, backoff base and ceiling).
        ack: the destination's ACK policy (``retry`` or ``fail`` per outcome).

    Raises:
        ValueError: ``attempts`` < 1.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if ack.action(outcome) == "fail":
        return RetryDecision.stop("ackPolicy", attempts)
    if retry.max_attempts > 0 and attempts >= retry.max_attempts:
        return RetryDecision.stop("maxAttempts", attempts)
    delay = backoff_seconds(attempts, retry.backoff_seconds, retry.max_backoff_seconds)
    return RetryDecision.retry_in(delay, attempts)
