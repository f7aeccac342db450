"""The retry decision as a table (pure): outcome x attempts x policies -> give up or retry when."""

import pytest

from inturn.worker.drain.retry import RetryDecision, decide
from inturn.worker.spec.config import AckPolicy, RetryPolicy

FOREVER = RetryPolicy(max_attempts=0, backoff_seconds=5, max_backoff_seconds=60)
FIVE = RetryPolicy(max_attempts=5, backoff_seconds=5, max_backoff_seconds=60)
NO_WAIT = RetryPolicy(max_attempts=3, backoff_seconds=0, max_backoff_seconds=0)
THREE = RetryPolicy(max_attempts=3, backoff_seconds=1, max_backoff_seconds=4)
THREE_COUNTED = RetryPolicy(
    max_attempts=3, backoff_seconds=1, max_backoff_seconds=4, unreachable="count"
)
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
        # a profile's refusal (or an unsendable message) is deterministic: unset, it follows
        # maxAttempts: at once above 0; held at the head at 0, which never lets one go (a new
        # user's trial: an A01 given up under maxAttempts 0 let its A03 through)
        ("profile", 1, FOREVER, RETRY_ALL, RetryDecision.retry_in(5, 1)),
        ("profile", 7, FOREVER, RETRY_ALL, RetryDecision.retry_in(60, 7)),
        ("profile", 1, FIVE, RETRY_ALL, RetryDecision.stop("ackPolicy", 1)),
        ("unsendable", 1, FOREVER, RETRY_ALL, RetryDecision.retry_in(5, 1)),
        ("unsendable", 1, THREE, RETRY_ALL, RetryDecision.stop("ackPolicy", 1)),
        # set, it applies whatever maxAttempts says
        ("profile", 1, FOREVER, AckPolicy(profile="fail"), RetryDecision.stop("ackPolicy", 1)),
        (
            "unsendable",
            1,
            FOREVER,
            AckPolicy(unsendable="fail"),
            RetryDecision.stop("ackPolicy", 1),
        ),
        ("profile", 1, FOREVER, AckPolicy(profile="retry"), RetryDecision.retry_in(5, 1)),
        ("profile", 5, FIVE, AckPolicy(profile="retry"), RetryDecision.stop("maxAttempts", 5)),
        # outcomes the ACK policy does not name (transport failures) are always retried
        ("timeout", 1, FOREVER, FAIL_ALL, RetryDecision.retry_in(5, 1)),
        ("connection", 1, FOREVER, FAIL_ALL, RetryDecision.retry_in(5, 1)),
        ("http", 3, FOREVER, FAIL_ALL, RetryDecision.retry_in(20, 3)),
        # a zero backoff retries at once until the limit
        ("AE", 2, NO_WAIT, RETRY_ALL, RetryDecision.retry_in(0, 2)),
        ("AE", 3, NO_WAIT, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
        # answers about the message count towards maxAttempts, whatever their kind
        ("timeout", 3, THREE, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
        ("connection", 3, THREE, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
        ("http", 3, THREE, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
        ("controlIdMismatch", 3, THREE, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
    ],
)
def test_decide(
    outcome: str, attempts: int, retry: RetryPolicy, ack: AckPolicy, expected: RetryDecision
) -> None:
    assert decide(outcome, attempts, retry, ack) == expected


@pytest.mark.parametrize(
    ("attempts", "run", "retry", "ack", "expected"),
    [
        # held: the failed attempt is not recorded (one less), however many came before
        (1, 1, THREE, RETRY_ALL, RetryDecision.hold(1, 0)),
        (3, 1, THREE, RETRY_ALL, RetryDecision.hold(1, 2)),
        (4, 1, THREE, RETRY_ALL, RetryDecision.hold(1, 3)),
        (1, 1_000, THREE, RETRY_ALL, RetryDecision.hold(4, 0)),
        (1, 1, FOREVER, RETRY_ALL, RetryDecision.hold(5, 0)),
        # the backoff of a held queue follows the run of unreachable failures
        (1, 2, THREE, RETRY_ALL, RetryDecision.hold(2, 0)),
        (1, 3, THREE, RETRY_ALL, RetryDecision.hold(4, 0)),
        (2, 9, FOREVER, RETRY_ALL, RetryDecision.hold(60, 1)),
        # the ACK policy has no say over it: nothing was answered
        (1, 1, THREE, FAIL_ALL, RetryDecision.hold(1, 0)),
        # unreachable: count is the old behaviour, an attempt like any other
        (1, 1, THREE_COUNTED, RETRY_ALL, RetryDecision.retry_in(1, 1)),
        (2, 2, THREE_COUNTED, RETRY_ALL, RetryDecision.retry_in(2, 2)),
        (3, 3, THREE_COUNTED, RETRY_ALL, RetryDecision.stop("maxAttempts", 3)),
    ],
)
def test_an_unreachable_destination_holds_the_queue_without_counting(
    attempts: int, run: int, retry: RetryPolicy, ack: AckPolicy, expected: RetryDecision
) -> None:
    assert decide("unreachable", attempts, retry, ack, unreachable_run=run) == expected


def test_a_run_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        decide("unreachable", 1, THREE, RETRY_ALL, unreachable_run=0)


def test_a_decision_is_immutable() -> None:
    decision = decide("AE", 1, FOREVER, RETRY_ALL)
    with pytest.raises(AttributeError):
        decision.give_up = True  # type: ignore[misc]


def test_attempts_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        decide("AE", 0, FOREVER, RETRY_ALL)
