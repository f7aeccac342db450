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

    def retried(self, destination: str, attempts: int, cause: str) -> None:
        """An attempt failed and will be retried."""

    def gave_up(self, destination: str, attempts: int, cause: str) -> None:
        """A message was marked failed (attempts exhausted, or an ACK policy of ``fail``)."""

    def depth(
        self, destination: str, pending: int, oldest_seconds: float, max_attempts: int
    ) -> None:
        """The destination's queue as last measured (counts, seconds, attempts)."""

    def lock(self, destination: str, held: bool) -> None:
        """The worker took (True) or lost/released (False) the destination's lock."""


class NullObserver:
    """An observer that ignores everything."""

    def delivered(self, destination: str, attempts: int, waited_seconds: float) -> None:
        """Ignore."""

    def retried(self, destination: str, attempts: int, cause: str) -> None:
        """Ignore."""

    def gave_up(self, destination: str, attempts: int, cause: str) -> None:
        """Ignore."""

    def depth(
        self, destination: str, pending: int, oldest_seconds: float, max_attempts: int
    ) -> None:
        """Ignore."""

    def lock(self, destination: str, held: bool) -> None:
        """Ignore."""
