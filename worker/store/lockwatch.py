"""Lock waits that say why: who a statement waits for, found while it waits.

A statement that waits on a lock (a forgotten ``BEGIN; SELECT ... FOR UPDATE``, a ``LOCK
TABLE``) looks from the client like a slow statement. :func:`watch` runs a statement and, once
it has taken longer than a threshold (:data:`DEFAULT_THRESHOLD_SECONDS`, or
``INTURN_LOCK_WAIT_SECONDS``), asks the server on a second, short-lived connection which
sessions the statement's backend waits for (``pg_blocking_pids``, "System Information
Functions" in the PostgreSQL manual) and what they are (``pg_stat_activity``: application
name, user, client address, state and since when; never their query text, which may hold a
payload). It asks again every threshold until the statement ends, and reports each finding to
the caller, which logs it, shows it on ``/readyz`` and counts the seconds.

Nothing is started for a statement that ends within the threshold but a timer handle. The
second connection is opened only when a statement outlasts the threshold, and closed when it
ends. A role without ``pg_read_all_stats`` sees the blocking session's pid, application name
and user, but not its state or times (the server hides them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.errors import Invalid, Unavailable
from inturn.worker.store.queries import fetch_all, load

log = logging.getLogger("inturn.store")

Q = load("locks.sql")

#: Seconds a statement may wait on a lock before it is reported, unless configured.
DEFAULT_THRESHOLD_SECONDS = 2.0
#: The environment variable that sets the threshold (seconds, > 0).
THRESHOLD_ENV = "INTURN_LOCK_WAIT_SECONDS"
#: Seconds to open the second connection that asks who blocks.
CONNECT_TIMEOUT_SECONDS = 5


def threshold_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The threshold in seconds: ``INTURN_LOCK_WAIT_SECONDS`` or
    :data:`DEFAULT_THRESHOLD_SECONDS`.

    Raises:
        Invalid: the variable is set but not a number of seconds above 0.
    """
    env = os.environ if environ is None else environ
    text = env.get(THRESHOLD_ENV, "").strip()
    if not text:
        return DEFAULT_THRESHOLD_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise Invalid(f"{THRESHOLD_ENV} must be a number of seconds above 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Blocker:
    """A session another one waits for.

    Attributes:
        pid: its backend's process id (``pg_terminate_backend(pid)`` ends it).
        application_name: what it called itself (may be empty).
        user: its role, or None when hidden.
        client: its client address, or None (a Unix socket, or hidden).
        state: ``active``, ``idle in transaction``, ..., or None when hidden.
        since: when its transaction began (else when it entered its state), or None.
        held_seconds: seconds since ``since``, or None.
    """

    pid: int
    application_name: str
    user: str | None
    client: str | None
    state: str | None
    since: datetime | None
    held_seconds: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Blocker:
        """Build from a row of the ``blockers`` query."""
        held = row["held_seconds"]
        return cls(
            pid=int(row["pid"]),
            application_name=str(row["application_name"] or ""),
            user=row["user_name"],
            client=row["client"],
            state=row["state"],
            since=row["since"],
            held_seconds=None if held is None else float(held),
        )

    def describe(self) -> str:
        """One line: ``pid 123 (application 'psql', user alice from 10.0.0.7, idle in
        transaction since 2026-12-01 03:40:12 UTC, 35s)``."""
        parts = [f"application {self.application_name!r}"]
        if self.user:
            parts.append(f"user {self.user}" + (f" from {self.client}" if self.client else ""))
        if self.state:
            state = self.state
            if self.since is not None:
                state += f" since {self.since.strftime('%Y-%m-%d %H:%M:%S %Z').strip()}"
            if self.held_seconds is not None:
                state += f", {_seconds(self.held_seconds)}"
            parts.append(state)
        return f"pid {self.pid} ({', '.join(parts)})"


async def blockers(conn: AsyncConnection[Any], pid: int) -> list[Blocker]:
    """The sessions the backend ``pid`` waits for (empty when it waits on no lock).

    Raises:
        psycopg.Error: the query failed.
    """
    rows = await fetch_all(conn, Q["blockers"], {"pid": pid}, row=dict_row)
    return [Blocker.from_row(r) for r in rows]


@dataclass
class LockWait:
    """What a watch found about one statement.

    Attributes:
        started: ``time.monotonic()`` when the statement began.
        blockers: the sessions it waited for at the last look (empty: not waiting on a lock).
        waited_seconds: seconds it is known to have waited on a lock (from its start to the
            last look that found blockers, or to its end).
        counted_seconds: seconds already reported through ``on_wait`` (for counters).
    """

    started: float
    blockers: list[Blocker] = field(default_factory=list)
    waited_seconds: float = 0.0
    counted_seconds: float = 0.0
    ended: bool = False
    _last_seen: float | None = None

    @property
    def waiting(self) -> bool:
        """Whether the last look found the statement waiting on a lock."""
        return bool(self.blockers)

    def describe(self, verb: str = "waiting") -> str:
        """``waiting 12s for a lock held by pid 123 (...)[, pid 456 (...)]`` (``verb`` first)."""
        held = ", ".join(b.describe() for b in self.blockers) or "another session"
        return f"{verb} {_seconds(self.waited_seconds)} for a lock held by {held}"


def _seconds(value: float) -> str:
    """``0.4s``, ``12s``: a tenth below ten seconds, whole seconds above."""
    return f"{value:.1f}s" if value < 10 else f"{value:.0f}s"


class LockWaitError(Unavailable):
    """A statement waited on a lock held by another session and was cancelled by a timeout
    (``statement_timeout``, ``lock_timeout``). The message names the blocking sessions."""


WaitCallback = Callable[[LockWait, float], None]


def watch(
    conn: AsyncConnection[Any],
    open_side: Callable[[], Awaitable[AsyncConnection[Any]]],
    *,
    threshold: float,
    on_wait: WaitCallback | None = None,
) -> Watch:
    """Run the body (statements on ``conn``) and report lock waits longer than ``threshold``:
    ``async with watch(conn, open_side, threshold=2.0): ...``.

    Args:
        conn: the connection whose statement may wait.
        open_side: opens a second autocommit connection to the same server (closed here).
        threshold: seconds (> 0) before the first look, and between two looks.
        on_wait: called after each look that found blockers, and once more when the body ends
            after such a look (then with ``ended`` set), with the :class:`LockWait` and the
            seconds of waiting added since the last call (for a counter). Must not raise.

    Raises:
        LockWaitError: the body raised ``QueryCanceled`` or ``LockNotAvailable`` after a look
            found it waiting on a lock (chained to that error).
    """
    return Watch(conn, open_side, threshold, on_wait)


class Watch:
    """The context manager of :func:`watch`. It runs around every statement of the worker, so
    a statement that ends within the threshold costs one timer handle, set and cancelled; the
    :class:`LockWait` (``found``) and the looks exist only once the threshold has passed."""

    __slots__ = (
        "_conn", "_on_wait", "_open_side", "_started", "_task", "_threshold", "_timer", "found"
    )  # fmt: skip

    def __init__(
        self,
        conn: AsyncConnection[Any],
        open_side: Callable[[], Awaitable[AsyncConnection[Any]]],
        threshold: float,
        on_wait: WaitCallback | None,
    ) -> None:
        self._conn, self._open_side = conn, open_side
        self._threshold, self._on_wait = threshold, on_wait
        self._started = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        #: What the looks found; None until the threshold has passed.
        self.found: LockWait | None = None

    async def __aenter__(self) -> None:
        self._started = time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(self._threshold, self._start)

    def _start(self) -> None:
        self.found = LockWait(started=self._started)
        self._task = asyncio.ensure_future(self._look_repeatedly(self.found))

    async def _look_repeatedly(self, found: LockWait) -> None:
        pid = self._conn.info.backend_pid
        side: AsyncConnection[Any] | None = None
        try:
            while True:
                try:
                    if side is None or side.closed:
                        side = await self._open_side()
                    found.blockers = await blockers(side, pid)
                except (psycopg.Error, OSError) as exc:  # the look is a courtesy: never fatal
                    log.debug("lock watch of pid %d: %s", pid, exc)
                    found.blockers = []
                now = time.monotonic()
                if found.blockers:
                    found.waited_seconds = now - found.started
                    added = found.waited_seconds - found.counted_seconds
                    found.counted_seconds = found.waited_seconds
                    found._last_seen = now
                    if self._on_wait is not None:
                        self._on_wait(found, added)
                await asyncio.sleep(self._threshold)
        finally:
            if side is not None:
                with contextlib.suppress(Exception):
                    await side.close()

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        found = self.found
        if found is None:  # ended within the threshold: nothing was looked at
            return
        try:
            cancelled = psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable
            if isinstance(exc, cancelled) and found.waiting:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                found.waited_seconds = time.monotonic() - found.started
                text = f"{found.describe('waited')}, then was cancelled ({first})"
                raise LockWaitError(text) from exc
        finally:
            task = self._task
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if found._last_seen is not None:
                found.waited_seconds = time.monotonic() - found.started
                added = found.waited_seconds - found.counted_seconds
                found.counted_seconds = found.waited_seconds
                found.ended = True
                if self._on_wait is not None:
                    self._on_wait(found, max(added, 0.0))
