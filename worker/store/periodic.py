"""A periodic statement of a long-running process, under one rule for refusals.

A long-running process (ingest, ``inturn local``, the console, the operator, a worker) runs
statements on a timer: a lease's renewal, a purge of the duplicate window, a sweep, a gauge's
count, a registry refresh, a registry write. The database may refuse any of them for a while: it
is read-only for maintenance or a standby (SQLSTATE 25006), a lock or statement timeout ends the
statement (55P03, 57014), the connection is gone (a restart, ``pg_terminate_backend``), there
are too many connections (53300), it is starting up (57P03). The rule, the same as the worker's
steps (:func:`inturn.worker.store.faults.classify_step`):

* the process goes on (a refusal never ends it), and so does what it serves meanwhile;
* one WARNING when the refusal begins and one INFO when it ends (how long, how many tries),
  never a line per try (:class:`inturn.worker.text.conditions.Condition`);
* the statement is tried again after a bounded backoff (:attr:`Periodic.first_backoff`
  doubling up to :attr:`Periodic.max_backoff`, never later than its own interval), so that it
  works again within seconds of the database taking writes again, whatever its interval;
* the process's ``/readyz`` says so while it holds (:func:`inturn.worker.text.conditions.notes`).

Which errors are refusals is decided in one place, :func:`inturn.worker.store.faults.refusal`.
Anything else (a bug, a database without the inturn schema) is either counted the same way
(the default: the loop is a courtesy, such as a gauge) or raised (``fatal=True``: the process
cannot go on without it, and ends with the one-line error it always had).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from inturn.worker.errors import Invalid
from inturn.worker.store import faults
from inturn.worker.text.conditions import Condition

__all__ = ["Periodic"]

T = TypeVar("T")

#: First retry after a refusal, seconds; doubled per failed try up to :data:`MAX_BACKOFF`.
FIRST_BACKOFF = 0.5
#: Longest wait between two tries of a refused statement, seconds (its interval if shorter).
MAX_BACKOFF = 30.0


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class Periodic:
    """One periodic statement of a process (see the module docstring).

    Args:
        log: where the condition's two lines go.
        what: what the statement does, for those lines and ``/readyz`` ("the duplicate
            window's purge").
        every: its interval while it works, seconds (> 0).
        call: one try of the statement (what :meth:`turn` and :meth:`forever` run); None for
            a statement given to :meth:`run` each time.
        cure: a short note for the first line ("every 300s"); default: none.
        fatal: a failure that is not a refusal is raised (the process ends) instead of counted.
        first_backoff, max_backoff: the backoff after a failed try, seconds.

    Attributes:
        condition: the refusal as it holds now (``condition.active``).
    """

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        every: float,
        call: Callable[[], Awaitable[object]] | None = None,
        *,
        cure: str = "",
        fatal: bool = False,
        first_backoff: float = FIRST_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        if not every > 0:
            raise Invalid(f"a periodic statement's interval must be > 0, got {every}")
        self.condition = Condition(log, what)
        self.every = float(every)
        self.call = call
        self.cure = cure
        self.fatal = fatal
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff

    @property
    def failing(self) -> bool:
        """Whether the last try failed (the condition holds)."""
        return self.condition.active

    def wait(self) -> float:
        """Seconds until the next try: the interval while the statement works, else the
        backoff after ``tries`` failures (``first_backoff * 2**(tries-1)``, at most
        ``max_backoff``, never more than the interval)."""
        tries = self.condition.tries
        if tries == 0:
            return self.every
        backoff = self.first_backoff * 2.0 ** min(tries - 1, 30)
        return min(self.every, self.max_backoff, backoff)

    def failed(self, exc: BaseException) -> str:
        """Count a failed try of ``exc`` (the first line when the condition begins) and return
        its one-line description.

        Raises:
            exc: when it is not a refusal and this statement is ``fatal``.
        """
        cause = faults.refusal(exc)
        if cause is None:
            if self.fatal:
                raise exc
            cause = f"{type(exc).__name__}: {_first_line(exc)}"
        self.condition.failed(cause, self.cure)
        return cause

    def succeeded(self) -> None:
        """A try worked: the closing line when the condition held."""
        self.condition.succeeded()

    async def run(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """One try of the statement: its result, or None when it failed (counted; see
        :attr:`failing`).

        Raises:
            Exception: a failure that is not a refusal, when ``fatal``.
        """
        try:
            result = await call()
        except Exception as exc:
            self.failed(exc)
            return None
        self.succeeded()
        return result

    async def turn(self) -> bool:
        """One try of the statement given at construction; True when it worked.

        Raises:
            Exception: a failure that is not a refusal, when ``fatal``.
        """
        assert self.call is not None, "a Periodic without a call runs what run() is given"
        await self.run(self.call)
        return not self.failing

    async def forever(self, stop: asyncio.Event | None = None) -> None:
        """Wait :meth:`wait`, :meth:`turn`, again, until ``stop`` is set (or cancelled).

        Raises:
            Exception: a failure that is not a refusal, when ``fatal``.
        """
        stop = stop or asyncio.Event()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.wait())
            if not stop.is_set():
                await self.turn()
