"""The retry decision as a table (pure): outcome x attempts x policies -> give up or retry when."""

import pytest

from inturn.worker.drain.retry import RetryDecision, decide
from inturn.worker.spec.config import AckPolicy, RetryPolicy

FOREVER = RetryPolicy(max_attempts=0, backoff_seconds=5, max_backoff_seconds=60)
FIVE = RetryPolicy(max_attempts=5, backoff_seconds=5, max_backoff_seconds=60)
NO_WAIT = RetryPolicy(max_attempts=3, backoff_seconds=0, max_backoff_seconds=0)
RETRY_ALL = AckPolicy()
FAIL_AR = AckPolicy(AR="fail")
FAIL_ALL = AckPolicy(
    AE="fail", AR="fail", CE="fail", CR="fail", invalidAck="fail", controlIdMismatch="fail"
)


@pytest.mark.parametrize(
    ("outcome", "attempts", "retry", "ack", "expected"),
    [
        # the backoff doubles from the base to the ceiling, forever
        ("AE", 1, FOREVER, RETRY_ALL, RetryDecision.retry_in(5, 1)),
        ("AE", 2, FOREVER, RETRY_ALL, RetryDecision.retry_in(10, 2)),
        ("timeout", 4, FOREVER, RETRY_ALL, RetryDecision.retry_in(40, 4)),
        ("connection", 5, FOREVER, RETRY_ALL, RetryDecision.retry_in(60, 5)),
        ("connection", 10_000, FOREVER, RETRY_ALL, RetryDecision.retry_in(60, 10_000)),
        # maxAttempts: the attempt that reaches it gives up
        ("AE", 4, FIVE, RETRY_ALL, RetryDecision.retry_in(40, 4)),
        ("AE", 5, FIVE, RETRY_ALL, RetryDecision.stop("maxAttempts", 5)),
        ("timeout", 6, FIVE, RETRY_ALL, RetryDecision.stop("maxAttempts", 6)),
        # ackPolicy fail gives up on the first attempt, whatever maxAttempts says
        ("AR", 1, FOREVER, FAIL_AR, RetryDecision.stop("ackPolicy", 1)),
        ("AR", 1, FIVE, FAIL_AR, RetryDecision.stop("ackPolicy", 1)),
        ("AE", 1, FOREVER, FAIL_AR, RetryDecision.retry_in(5, 1)),
        ("controlIdMismatch", 2, FOREVER, FAIL_ALL, RetryDecision.stop("ackPolicy", 2)),
        ("invalidAck", 1, FOREVER, FAIL_ALL, RetryDecision.stop("ackPolicy", 1)),
        # outcomes the ACK policy does not name (transport failures) are always retried
        ("timeout", 1, FOREVER, FAIL_ALL, RetryDecision.retry_in(5, 1)),
        ("connection", 1, FOREVER, FAIL_ALL, RetryDecision.retry_in(5, 1)),
        ("http", 3, FOREVER, FAIL_ALL, RetryDecision.retry_in(20, 3)),
        # a zero backoff retries at once until the limit
        ("AE", 2, NO_WAIT, RETRY_ALL, RetryDecision.retry_in(0, 2)),
        ("AE", 3, NO_WAIT, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
    ],
)
def test_decide(
    outcome: str, attempts: int, retry: RetryPolicy, ack: AckPolicy, expected: RetryDecision
) -> None:
    assert decide(outcome, attempts, retry, ack) == expected


def test_a_decision_is_immutable() -> None:
    decision = decide("AE", 1, FOREVER, RETRY_ALL)
    with pytest.raises(AttributeError):
        decision.give_up = True  # type: ignore[misc]


def test_attempts_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        decide("AE", 0, FOREVER, RETRY_ALL)
