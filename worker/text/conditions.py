"""A condition is logged when it begins and when it ends, not on every try.

A periodic statement that meets a refusal (the database read-only for maintenance, a lock or
statement timeout, the connection gone) tries again at its next turn; logging every try turns a
20-second outage into a storm of identical lines. :class:`Condition` logs one WARNING when the
condition begins (naming it and what cures it) and one INFO when it ends (how long it lasted
and how many tries failed), and keeps the counts for probes: :func:`notes` gives one line per
condition that holds now in this process, which the processes' ``/readyz`` show; an owner
that stops forgets its conditions (:meth:`Condition.forget`), so that another one in the same
process (a later run of ``inturn local``, a test after another) does not show them.

Pure: logging only, on the monotonic clock.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field

__all__ = ["Condition", "notes"]

#: Every condition of this process (weakly: a condition goes with what made it).
_ALL: weakref.WeakSet[Condition] = weakref.WeakSet()


def notes() -> list[str]:
    """One line per condition that holds now in this process, sorted: ``<what> failing for
    <seconds> s (<tries> tries): <cause>`` (the ``/readyz`` of ingest, ``inturn local``, the
    worker and the console show them)."""
    return sorted(c.note() for c in list(_ALL) if c.active)


@dataclass(eq=False)
class Condition:
    """One condition of one process (``what``: e.g. "renewing the inturn local lease").

    Attributes:
        log: where its two lines go.
        what: what is being tried, for both lines.
        since: monotonic time it began, None while it does not hold.
        tries: failed tries since it began.
        cause: the last failure's one-line description.
    """

    log: logging.Logger
    what: str
    since: float | None = None
    tries: int = 0
    cause: str = ""
    _clock: object = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        _ALL.add(self)

    def note(self) -> str:
        """The condition as ``/readyz`` shows it (meaningful while :attr:`active`)."""
        age = 0.0 if self.since is None else self._now() - self.since
        return f"{self.what} failing for {age:.0f} s ({self.tries} tries): {self.cause}"

    @property
    def active(self) -> bool:
        """Whether the condition holds now."""
        return self.since is not None

    def failed(self, cause: str, cure: str = "") -> None:
        """A try failed with ``cause``: the first line when the condition begins, else only a
        count (and a DEBUG line)."""
        self.tries += 1
        self.cause = cause
        if self.since is None:
            self.since = self._now()
            self.log.warning(
                "%s failed: %s; trying again%s", self.what, cause, f" ({cure})" if cure else ""
            )
        else:
            self.log.debug("%s failed again (%d tries): %s", self.what, self.tries, cause)

    def succeeded(self) -> float | None:
        """A try succeeded: the closing line when the condition held (its length in seconds
        returned), else nothing (None)."""
        if self.since is None:
            return None
        lasted = self._now() - self.since
        self.log.info(
            "%s works again after %.1f s (%d failed tries, last: %s)",
            self.what,
            lasted,
            self.tries,
            self.cause,
        )
        self.since, self.tries, self.cause = None, 0, ""
        return lasted

    def forget(self) -> None:
        """Its owner stopped (an ingest, a registrar, a run of ``inturn local``): the condition
        holds no more and leaves :func:`notes`, with no closing line (what failed was not seen
        to work again). Another owner of this process must not show it as its own on
        ``/readyz``."""
        self.since, self.tries, self.cause = None, 0, ""

    def _now(self) -> float:
        clock = self._clock
        assert callable(clock)
        return float(clock())
