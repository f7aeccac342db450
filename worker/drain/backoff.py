"""Retry backoff: pure arithmetic, no clock.

The delay after the n-th failed attempt starts at ``backoffSeconds`` and doubles per attempt up
to ``maxBackoffSeconds`` (by default 5 s doubling to a one-minute ceiling, so a receiver that
comes back is noticed within a minute).
"""

from __future__ import annotations


def backoff_seconds(attempts: int, base: float, ceiling: float) -> float:
    """Return the delay in seconds before the next attempt, after ``attempts`` failures.

    ``attempts`` counts failed attempts so far (1 after the first failure). The result is
    ``min(ceiling, base * 2 ** (attempts - 1))``; it never overflows, however large ``attempts``.

    Raises:
        ValueError: ``attempts`` < 1, ``base`` < 0, or ``ceiling`` < ``base``.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if base < 0 or ceiling < base:
        raise ValueError(f"need 0 <= base <= ceiling, got base={base} ceiling={ceiling}")
    if base == 0:
        return 0.0
    delay = float(base)
    for _ in range(attempts - 1):
        delay *= 2
        if delay >= ceiling:
            return float(ceiling)
    return min(delay, float(ceiling))


def schedule(attempts: int, base: float, ceiling: float) -> list[float]:
    """Return the delays after failures 1..``attempts``, e.g. ``[5, 10, 20, 40, 60, 60]``."""
    return [backoff_seconds(n, base, ceiling) for n in range(1, attempts + 1)]
