"""What a worker reports as it goes, without the queue code importing a metrics library.

The worker calls an :class:`Observer`; :mod:`inturn.worker.drain.metrics` implements it with
prometheus-client, tests may record the calls. ``cause`` is always a bounded outcome class
(see :data:`inturn.worker.senders.base.FailureCause`), never free text, so it is safe as a label.
"""

from __future__ import annotations

from typing import Protocol


class Observer(Protocol):
    """Receives the worker's events. Every method must return quickly and never raise."""

    def delivered(self, destination: str, attempts: int, waited_seconds: float) -> None:
        """A message was accepted by the receiver after ``attempts`` attempts, ``waited_seconds``
        after it was enqueued."""

    def attempted(self, destination: str, outcome: str, seconds: float) -> None:
        """An attempt ended after ``seconds``: ``outcome`` is ``delivered`` or the failure's
        cause class."""

    def retried(self, destination: str, attempts: int, cause: str) -> None:
        """An attempt failed and will be retried."""

    def gave_up(self, destination: str, attempts: int, cause: str) -> None:
        """A message was marked failed (attempts exhausted, or an ACK policy of ``fail``)."""

    def depth(
        self, destination: str, pending: int, oldest_seconds: float, max_attempts: int
    ) -> None:
        """The destination's queue as last measured (counts, seconds, attempts)."""

    def held(self, destination: str, held: bool) -> None:
        """Whether the destination's delivery is suspended (a hold set by ``queue suspend``,
        the console or a restore found, or ``spec.suspend``), as last seen."""

    def lock(self, destination: str, held: bool) -> None:
        """The worker took (True) or lost/released (False) the destination's lock."""

    def step_failed(self, destination: str, step: str) -> None:
        """A step of the loop (``head``, ``mark``... see
        :data:`inturn.worker.store.faults.Step`) failed on a live session and is repeated."""

    def lock_wait(self, destination: str, seconds: float) -> None:
        """A statement waited ``seconds`` more on another session's lock (counted once it
        waited longer than the lock-wait threshold)."""

    def lanes(self, destination: str, sending: int, waiting: int, window_full: bool) -> None:
        """With ``spec.lanes.count`` above 1, after each turn: lanes sending, messages of the
        window that wait for an earlier one or for their backoff, and whether the window is
        full of waiting messages."""


class NullObserver:
    """An observer that ignores everything."""

    def delivered(self, destination: str, attempts: int, waited_seconds: float) -> None:
        """Ignore."""

    def attempted(self, destination: str, outcome: str, seconds: float) -> None:
        """Ignore."""

    def retried(self, destination: str, attempts: int, cause: str) -> None:
        """Ignore."""

    def gave_up(self, destination: str, attempts: int, cause: str) -> None:
        """Ignore."""

    def depth(
        self, destination: str, pending: int, oldest_seconds: float, max_attempts: int
    ) -> None:
        """Ignore."""

    def held(self, destination: str, held: bool) -> None:
        """Ignore."""

    def lock(self, destination: str, held: bool) -> None:
        """Ignore."""

    def step_failed(self, destination: str, step: str) -> None:
        """Ignore."""

    def lock_wait(self, destination: str, seconds: float) -> None:
        """Ignore."""

    def lanes(self, destination: str, sending: int, waiting: int, window_full: bool) -> None:
        """Ignore."""
