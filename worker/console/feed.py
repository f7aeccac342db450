"""The overview feed: one snapshot shared by every page, request and event stream.

One task keeps the snapshot fresh: it LISTENs on every registered destination's channel (the
NOTIFY that ingest, resend and retry send when work arrives) and on :data:`CONSOLE_CHANNEL`,
and rebuilds the snapshot when woken, and at least every ``refresh_seconds`` (a delivery does
not NOTIFY), but never more often than every ``min_interval`` seconds. However many consoles are
open and however fast they poll, the database sees one overview query per interval, on the
read pool, so the console never sits in front of a delivery.

Subscribers (the server-sent event streams) are told of each snapshot that differs from the one
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from inturn.worker.console.overview import (
    DEFAULT_STUCK_AFTER,
    FeedOverviewRow,
    OverviewRow,
    build,
    build_feeds,
)
from inturn.worker.console.trends import History, feed_name
from inturn.worker.store import feeds as feeds_store
from inturn.worker.store import notify, reads, registry
from inturn.worker.store.connect import write_target
from inturn.worker.text.conditions import Condition

log = logging.getLogger("inturn.console")

T = TypeVar("T")

#: A channel anything may NOTIFY to make consoles refresh now.
CONSOLE_CHANNEL = "inturn_console"


@dataclass(frozen=True)
class Snapshot:
    """The overview at one moment: rows worst first, when it was taken, a counter.

    Its renderings (the JSON body, the table's HTML) are made once and shared by every request
    and event stream that shows this snapshot: a thousand rows are serialised per snapshot, not
    per request.
    """

    rows: tuple[OverviewRow, ...] = ()
    feeds: tuple[FeedOverviewRow, ...] = ()
    taken_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    version: int = 0
    _rendered: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """``{"takenAt": ISO 8601, "destinations": [...], "feeds": [...]}``."""
        return {
            "takenAt": self.taken_at.isoformat(),
            "destinations": [r.to_json() for r in self.rows],
            "feeds": [f.to_json() for f in self.feeds],
        }

    def rendered(self, name: str, render: Callable[[Snapshot], T]) -> T:
        """``render(self)``, computed once per snapshot and ``name``."""
        if name not in self._rendered:
            self._rendered[name] = render(self)
        found: T = self._rendered[name]
        return found


async def take(
    read: AsyncConnectionPool,
    *,
    stuck_after: Mapping[str, float] | None = None,
    default_stuck_after: float = DEFAULT_STUCK_AFTER,
    no_worker: Mapping[str, str] | None = None,
) -> tuple[list[OverviewRow], list[FeedOverviewRow]]:
    """Read the registry, the depth, the heads and the feeds on one read connection; build the
    destination rows and the feed rows (``no_worker``: as :func:`.overview.build`)."""
    async with read.connection() as conn:
        listed = await registry.listed(conn)
        depth = await reads.depth(conn)
        names = sorted({e.destination for e in listed} | {d.destination for d in depth})
        heads = await reads.heads(conn, names)
        declared = await feeds_store.overview(conn)
    rows = build(
        listed,
        depth,
        heads,
        stuck_after=stuck_after,
        default_stuck_after=default_stuck_after,
        no_worker=no_worker,
    )
    return rows, build_feeds(declared)


class Feed:
    """Keeps :attr:`snapshot` fresh and tells subscribers (see the module docstring)."""

    def __init__(
        self,
        dsn: str,
        read: AsyncConnectionPool,
        *,
        default_stuck_after: float = DEFAULT_STUCK_AFTER,
        refresh_seconds: float = 2.0,
        min_interval: float = 0.5,
        no_worker: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.dsn = dsn
        #: the destinations the process beside the console runs no worker for (``inturn
        #: local``: :meth:`inturn.worker.local.run.LocalRunner.unrun`), asked at each refresh
        self.no_worker = no_worker
        self.read = read
        self.default_stuck_after = default_stuck_after
        self.refresh_seconds = refresh_seconds
        self.min_interval = min_interval
        self.snapshot = Snapshot()
        #: What the snapshots said over the last hour and day (:mod:`.trends`).
        self.history = History()
        self._subscribers: set[asyncio.Queue[Snapshot]] = set()
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        self._refreshed = 0.0

    def subscribe(self) -> asyncio.Queue[Snapshot]:
        """A queue that receives each new snapshot (only the latest is kept if unread)."""
        q: asyncio.Queue[Snapshot] = asyncio.Queue(maxsize=1)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Snapshot]) -> None:
        """Stop sending to ``q``."""
        self._subscribers.discard(q)

    def poke(self) -> None:
        """Refresh soon (after an action taken through this console)."""
        self._poke.set()

    async def newer_than(self, version: int, timeout: float = 3.0) -> None:
        """Wait (at most ``timeout`` seconds) for a snapshot begun after the one that was
        current at ``version`` ended (two refreshes on: the next may have begun before), so
        that a page shown right after an action shows its effect."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.snapshot.version < version + 2:
                    await asyncio.sleep(0.05)

    async def start(self) -> None:
        """Take the first snapshot, then keep refreshing in a background task."""
        await self._refresh()
        self._task = asyncio.create_task(self._run(), name="inturn-console-feed")

    async def stop(self) -> None:
        """Stop the background task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _refresh(self) -> None:
        self._refreshed = time.monotonic()
        rows, feeds = await take(
            self.read,
            default_stuck_after=self.default_stuck_after,
            no_worker=self.no_worker() if self.no_worker is not None else None,
        )
        self.history.record(
            time.time(),
            ((r.destination, r.pending, r.oldest_seconds) for r in rows),
            ((feed_name(f.channel, f.sender), f.quiet_seconds) for f in feeds),
        )
        changed = tuple(rows) != self.snapshot.rows or tuple(feeds) != self.snapshot.feeds
        version = self.snapshot.version + 1
        self.snapshot = Snapshot(rows=tuple(rows), feeds=tuple(feeds), version=version)
        if changed:
            for q in list(self._subscribers):
                if q.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        q.get_nowait()
                q.put_nowait(self.snapshot)

    async def _run(self) -> None:
        away = Condition(log, "the console feed")
        while True:
            try:
                await self._listen_loop(away)
            except (psycopg.Error, OSError) as exc:
                # said when it begins and when it ends, not every 2 s (issue 39's log storms)
                away.failed(f"database unavailable ({type(exc).__name__})", "every 2s")
                await asyncio.sleep(2.0)

    async def _listen_loop(self, away: Condition) -> None:
        conn = await AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            application_name="inturn-console feed",
            **write_target(self.dsn),  # LISTEN needs the primary
        )
        away.succeeded()
        try:
            listening: set[str] = set()
            while True:
                channels = {CONSOLE_CHANNEL} | {
                    notify.notify_channel(r.destination) for r in self.snapshot.rows
                }
                for channel in sorted(channels - listening):
                    await notify.listen_channel(conn, channel)
                listening |= channels
                await self._wait(conn)
                rest = self.min_interval - (time.monotonic() - self._refreshed)
                if rest > 0:
                    await asyncio.sleep(rest)
                await self._refresh()
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _wait(self, conn: AsyncConnection[Any]) -> None:
        """Until a NOTIFY, a poke, or ``refresh_seconds``, looking in short slices so that a
        poke is seen within a quarter of a second (nothing is ever cancelled mid-read)."""
        deadline = time.monotonic() + self.refresh_seconds
        while not self._poke.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            notified = False
            # Read to the end (stop_after=1): an abandoned generator would keep the lock.
            async for _ in conn.notifies(timeout=min(left, 0.25), stop_after=1):
                notified = True
            if notified:
                return
        self._poke.clear()
