"""What a worker knows of itself, for its health endpoints (:mod:`inturn.worker.drain.health`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inturn.worker.drain.lanes import LaneView


@dataclass
class WorkerHealth:
    """What the health endpoints read.

    Attributes:
        lock_held: this worker holds the destination's lock.
        db_ok: the last database round trip succeeded.
        connected_once: the worker has reached the database at least once.
        last_tick: ``time.monotonic()`` of the last loop turn.
        sending_since: monotonic start of the attempt in flight, or None.
        trouble: why a step is being repeated on a live session (e.g. the delivered mark on a
            full disk), or None.
        lock_wait: the lock wait in progress past the threshold (blocking sessions), or None.
        lanes: what the lanes are doing (``spec.lanes.count`` above 1), or None.
        pooling: the one line saying the worker's DSN is pooled (and what is not used then),
            or None on a direct connection; ``/readyz`` shows it.
        key_store: the key store's health (``PgKeyStore.health``: None while it answers, else
            why not), with payload keys; ``/readyz`` shows it first.
        unreadable: why the queue holds at a head this process cannot decrypt (its id and
            the cure), or None.
        failure: the unexpected error that ended the worker's last session (it opens a new
            one after a pause), or None once it holds its lease again.
        refused: why the database refuses the worker a session while it is up (too many
            connections, SQLSTATE 53300), or None once it has one: the worker cannot run.
    """

    lock_held: bool = False
    db_ok: bool = False
    connected_once: bool = False
    last_tick: float = field(default_factory=time.monotonic)
    sending_since: float | None = None
    trouble: str | None = None
    lock_wait: str | None = None
    lanes: LaneView | None = None
    pooling: str | None = None
    key_store: Callable[[], str | None] | None = None
    unreadable: str | None = None
    failure: str | None = None
    refused: str | None = None

    def alive(self, stale_after: float) -> bool:
        """Whether the loop turned within ``stale_after`` seconds (the attempt in flight counts)."""
        now = time.monotonic()
        if self.sending_since is not None:
            return True
        return now - self.last_tick <= stale_after

    def ready(self) -> bool:
        """Holds the lock, the database answered, no step is being repeated, no lock wait."""
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why the worker is not ready (one line), or None when it is."""
        down = self.key_store() if self.key_store is not None else None
        if down is not None:
            return down
        if self.failure is not None:
            return self.failure
        if self.refused is not None:
            return self.refused
        if not self.lock_held or not self.db_ok:
            return "not holding the lock or no database"
        if self.lock_wait is not None:
            return self.lock_wait
        return self.trouble or self.unreadable
