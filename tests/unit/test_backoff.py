"""Backoff schedule: doubling from the base to the ceiling (pure)."""

import pytest

from inturn.worker.drain.backoff import backoff_seconds, schedule


def test_default_schedule_doubles_to_one_minute() -> None:
    assert schedule(8, 5, 60) == [5, 10, 20, 40, 60, 60, 60, 60]


def test_huge_attempt_counts_stay_at_the_ceiling() -> None:
    assert backoff_seconds(10_000, 5, 60) == 60


def test_zero_base_means_no_wait() -> None:
    assert backoff_seconds(3, 0, 60) == 0


@pytest.mark.parametrize(("attempts", "base", "ceiling"), [(0, 5, 60), (1, -1, 60), (1, 10, 5)])
def test_bad_arguments_are_refused(attempts: int, base: float, ceiling: float) -> None:
    with pytest.raises(ValueError):
        backoff_seconds(attempts, base, ceiling)
