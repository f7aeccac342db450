"""History that leaves by the partition (issue 37; docs/explanation/storage-layout.md).

The maintenance job (``inturn purge``, the purge role) keeps the hot table small and drops
history by the day, through the functions of migration 0034, each call one short transaction
under a ``lock_timeout`` (a call refused by it is tried again, a bounded number of times):

* :func:`move`: finished rows (delivered, failed, skipped) older than the hot window leave
  ``inturn_delivery`` for ``inturn_history`` in batches of at most 5,000, their failed
  attempts folded into the row (``attempt_log``); rows a person still needs stay.
* :func:`turn`: the next epoch's log and history partitions are created ahead, and the epoch
  turns (the log's sequence moves to the next range) when the open one is older than the
  epoch's length.
* :func:`drop_due`: each closed epoch older than the retention is dropped whole, once what a
  person still needs is out of it: destinations whose cursor is behind in it are pulled; hot
  rows that read their payload from its log get a copy (with the binding it was sealed under);
  history rows a pending worklist item names, or whose order reply is awaited, go back to the
  hot table. Then its partitions are detached, and dropped.

Nothing here decides who may (the operations layer does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.errors import Invalid
from inturn.worker.store import audit, notify
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("history.sql")

T = TypeVar("T")

#: Rows per batch of the move, at most (the function's own bound).
MOVE_BATCH_MAX = 5000
#: Default hot window, seconds: longer than ingest's lost-ACK window
#: (``--duplicate-delivered-window``, 600 s), which reads the hot table's delivered rows.
DEFAULT_HOT_SECONDS = 900.0
#: Default length of an epoch (a day of the log and history), seconds.
DEFAULT_EPOCH_SECONDS = 86400.0
#: Default ``lock_timeout`` of the job's statements, milliseconds: the longest ingest and the
#: workers can queue behind a lock the job waits for (a DETACH's).
DEFAULT_LOCK_MS = 500
#: Tries of a statement refused by its ``lock_timeout`` before the step is left for next run.
LOCK_TRIES = 10
#: Seconds between two such tries (doubled each time, at most 5 s).
LOCK_PAUSE_SECONDS = 0.2
#: Rows per batch of a pull on a destination's behalf before a drop.
PULL_BATCH = 500
#: Hot rows looked at per page when copying payloads out of a day's log before its drop.
COPY_PAGE = 10000


@dataclass(frozen=True)
class Settings:
    """What the job is told.

    Attributes:
        retention_seconds: an epoch closed longer ago than this is dropped (>= 0).
        epoch_seconds: the length of an epoch (a day by default; >= 60).
        hot_seconds: how long a finished row stays in the hot table (>= 0); keep it longer
            than ingest's ``--duplicate-delivered-window``.
        batch: rows per batch of the move (1..5000).
        lock_ms: the ``lock_timeout`` of the job's statements (10..60000).
    """

    retention_seconds: float
    epoch_seconds: float = DEFAULT_EPOCH_SECONDS
    hot_seconds: float = DEFAULT_HOT_SECONDS
    batch: int = MOVE_BATCH_MAX
    lock_ms: int = DEFAULT_LOCK_MS

    def __post_init__(self) -> None:
        if self.retention_seconds < 0:
            raise Invalid("the retention must not be negative")
        if self.epoch_seconds < 60:
            raise Invalid("an epoch must last at least 60 s")
        if self.hot_seconds < 0:
            raise Invalid("the hot window must not be negative")
        if not 1 <= self.batch <= MOVE_BATCH_MAX:
            raise Invalid(f"batch must be 1..{MOVE_BATCH_MAX}, got {self.batch}")
        if not 10 <= self.lock_ms <= 60000:
            raise Invalid(f"the lock timeout must be 10..60000 ms, got {self.lock_ms}")


@dataclass(frozen=True)
class Epoch:
    """An id range of the log and history (one partition of each).

    Attributes:
        n: its number (1 for the first).
        lo, hi: its ids, ``lo <= id < hi``.
        opened_at: when it was opened (None: prepared, not open yet).
        closed_at: when the next one was opened (None: open or prepared).
        detached_at, dropped_at: what became of its partitions (None: not yet).
    """

    n: int
    lo: int
    hi: int
    opened_at: datetime | None
    closed_at: datetime | None
    detached_at: datetime | None
    dropped_at: datetime | None


@dataclass(frozen=True)
class Dropped:
    """One epoch dropped, and what was moved out of it first.

    Attributes:
        epoch: the epoch (as it was before the drop).
        log_rows, history_rows: rows of its log and history partitions dropped.
        bytes: their size on disk, indexes and TOAST included.
        pulled: rows pulled for destinations whose cursor was behind in it.
        copied: hot rows given their payload out of its log.
        kept: history rows put back into the hot table (a person still needs them).
        seconds: how long the detach and the drop took (wall clock).
    """

    epoch: Epoch
    log_rows: int
    history_rows: int
    bytes: int
    pulled: int
    copied: int
    kept: int
    seconds: float

    def summary(self) -> str:
        """One line for the audit and the command's output: counts, never ids or content."""
        span = (
            f"{_at(self.epoch.opened_at)} to {_at(self.epoch.closed_at)}"
            if self.epoch.opened_at and self.epoch.closed_at
            else "?"
        )
        return (
            f"epoch {self.epoch.n} ({span}): log {self.log_rows}, history {self.history_rows},"
            f" {self.bytes} bytes; pulled {self.pulled}, payloads copied {self.copied},"
            f" kept {self.kept}"
        )


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


@dataclass
class Upkeep:
    """What one run of the job did.

    Attributes:
        moved: finished rows moved from the hot table to history.
        prepared: epochs whose partitions were created ahead.
        turned: the epoch opened by this run, if it turned.
        dropped: the epochs dropped.
        waiting: one line per step left for the next run (a lock not had in time, a drop
            whose log a hot row still reads).
    """

    moved: int = 0
    prepared: list[int] = field(default_factory=list)
    turned: int | None = None
    dropped: list[Dropped] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


#: Renew the job's singleton; False when another run took it over (stop, it does the rest).
Renew = Callable[[], Awaitable[bool]]


async def _in_transaction(
    conn: AsyncConnection[Any], lock_ms: int, step: Callable[[], Awaitable[T]]
) -> T:
    """``step`` in a transaction of its own whose statements wait ``lock_ms`` at most for a
    lock; refused by that bound, tried again up to :data:`LOCK_TRIES` times.

    Raises:
        psycopg.errors.LockNotAvailable: every try was refused.
    """
    pause = LOCK_PAUSE_SECONDS
    for attempt in range(LOCK_TRIES):
        try:
            async with conn.transaction():
                await conn.execute(Q["lock_timeout"], {"ms": lock_ms})
                return await step()
        except psycopg.errors.LockNotAvailable:
            if attempt == LOCK_TRIES - 1:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)
    raise AssertionError("unreachable")  # pragma: no cover


async def _value(conn: AsyncConnection[Any], query: LiteralString, params: dict[str, Any]) -> Any:
    row = await fetch_one(conn, query, params, row=dict_row)
    assert row is not None
    return next(iter(row.values()))


async def epochs(conn: AsyncConnection[Any]) -> list[Epoch]:
    """Every epoch, oldest first."""
    rows = await fetch_all(conn, Q["epochs"], row=dict_row)
    return [Epoch(**r) for r in rows]


async def move(conn: AsyncConnection[Any], settings: Settings, renew: Renew) -> int:
    """Move finished rows past the hot window to history, batch after batch, until a batch
    comes back short; ``renew`` is called between batches (False: stop). Returns rows moved.

    Raises:
        psycopg.errors.LockNotAvailable: a batch was refused by its lock timeout every try.
    """
    params = {"hot_seconds": float(settings.hot_seconds), "batch": settings.batch}
    total = 0
    while True:
        moved = int(
            await _in_transaction(conn, settings.lock_ms, lambda: _value(conn, Q["move"], params))
        )
        total += moved
        if moved < settings.batch or not await renew():
            return total


async def movable(conn: AsyncConnection[Any], hot_seconds: float) -> int:
    """How many finished rows the move would take now (past the hot window, not kept)."""
    return int(await _value(conn, Q["movable"], {"hot_seconds": float(hot_seconds)}))


async def turn(conn: AsyncConnection[Any], settings: Settings, upkeep: Upkeep) -> None:
    """Create the next epoch's partitions ahead, turn the epoch when the open one is older
    than ``settings.epoch_seconds``, and create the partitions of the one after; recorded in
    ``upkeep``.

    Raises:
        psycopg.errors.LockNotAvailable: an ATTACH was refused by its lock timeout every try.
    """
    lock = {"lock_ms": settings.lock_ms}
    for _ in range(2):
        made = int(
            await _in_transaction(conn, settings.lock_ms, lambda: _value(conn, Q["prepare"], lock))
        )
        if made:
            upkeep.prepared.append(made)
        if upkeep.turned is not None:
            return
        opened = int(
            await _in_transaction(
                conn,
                settings.lock_ms,
                lambda: _value(conn, Q["turn"], {"epoch_seconds": float(settings.epoch_seconds)}),
            )
        )
        if not opened:
            return
        upkeep.turned = opened


async def due(conn: AsyncConnection[Any], retention_seconds: float) -> list[Epoch]:
    """The epochs to drop now: closed longer ago than the retention, not dropped yet."""
    now = await _value(conn, Q["now"], {})
    return [
        e
        for e in await epochs(conn)
        if e.dropped_at is None
        and e.closed_at is not None
        and (now - e.closed_at).total_seconds() > retention_seconds
    ]


async def drop_due(
    conn: AsyncConnection[Any], settings: Settings, upkeep: Upkeep, renew: Renew, who: str
) -> None:
    """Drop every epoch past the retention, oldest first, each after what a person still
    needs is out of it (see the module's text); recorded in ``upkeep``. An epoch that cannot
    go yet (a lock not had in time, a hot row still reading its log) is named in
    ``upkeep.waiting`` and left, with every later one, for the next run. Each drop is
    recorded in the audit trail (action ``drop-day``, by ``who``, its counts: never ids or
    content) in the drop's own transaction.
    """
    for epoch in await due(conn, settings.retention_seconds):
        if not await renew():
            return
        try:
            dropped = await _drop_one(conn, epoch, settings, who)
        except psycopg.errors.LockNotAvailable:
            upkeep.waiting.append(f"epoch {epoch.n}: a lock was not had in time; next run")
            return
        if dropped is None:
            upkeep.waiting.append(
                f"epoch {epoch.n}: a queued message still reads its log; next run"
            )
            return
        upkeep.dropped.append(dropped)


async def _drop_one(
    conn: AsyncConnection[Any], epoch: Epoch, settings: Settings, who: str
) -> Dropped | None:
    lock_ms = settings.lock_ms
    pulled = 0
    copied = 0
    kept = 0
    if epoch.detached_at is None:
        pulled = await _pull_behind(conn, epoch, lock_ms)
        copied = await _copy(conn, epoch, lock_ms)
        kept = int(
            await _in_transaction(
                conn, lock_ms, lambda: _value(conn, Q["keep"], {"epoch": epoch.n})
            )
        )
    started = asyncio.get_running_loop().time()
    await _in_transaction(
        conn, lock_ms, lambda: _value(conn, Q["detach"], {"epoch": epoch.n, "lock_ms": lock_ms})
    )
    detached = asyncio.get_running_loop().time() - started
    # a row that came to read this log while it was being detached gets its copy from the
    # detached table (nothing can come any more: no statement sees it through the log)
    copied += await _copy(conn, epoch, lock_ms)
    began = asyncio.get_running_loop().time()

    async def drop_and_record() -> Dropped | None:
        row = await fetch_one(conn, Q["drop"], {"epoch": epoch.n, "lock_ms": lock_ms}, row=dict_row)
        if row is None or row["log_rows"] is None:
            return None
        dropped = Dropped(
            epoch,
            int(row["log_rows"]),
            int(row["history_rows"]),
            int(row["bytes"]),
            pulled,
            copied,
            kept,
            detached + asyncio.get_running_loop().time() - began,
        )
        # in the drop's own transaction: no drop without its record
        await audit.record(conn, who=who, action="drop-day", why=dropped.summary())
        return dropped

    return await _in_transaction(conn, lock_ms, drop_and_record)


async def _pull_behind(conn: AsyncConnection[Any], epoch: Epoch, lock_ms: int) -> int:
    """Pull, batch after batch, for every destination whose cursor is behind in ``epoch``;
    each one's worker is woken. Bounded: a destination is looked at again only while its
    pull takes rows."""
    total = 0
    params = {"epoch": epoch.n, "limit": PULL_BATCH}
    for _ in range(1_000_000):
        row = await _in_transaction(conn, lock_ms, lambda: _pull_one(conn, params))
        if row is None:
            return total
        total += int(row["pulled"])
    return total


async def _pull_one(conn: AsyncConnection[Any], params: dict[str, Any]) -> dict[str, Any] | None:
    row = await fetch_one(conn, Q["pull_behind"], params, row=dict_row)
    if row is not None:
        await notify.wake(conn, [row["destination"]])
    return row


async def _copy(conn: AsyncConnection[Any], epoch: Epoch, lock_ms: int) -> int:
    """Give every hot row that reads its payload from ``epoch``'s log a copy, page by page."""
    after = 0
    total = 0
    while True:
        params = {"epoch": epoch.n, "after": after, "batch": COPY_PAGE}
        row = await _in_transaction(
            conn, lock_ms, partial(fetch_one, conn, Q["copy"], params, row=dict_row)
        )
        if row is None or row["last_id"] is None:
            return total
        total += int(row["copied"])
        after = int(row["last_id"])


async def upkeep(conn: AsyncConnection[Any], settings: Settings, renew: Renew, who: str) -> Upkeep:
    """One run of the job's partition work: the move, the turn, the drops, and the record of
    what it was told (for the readers' alerts).

    Raises:
        psycopg.errors.LockNotAvailable: the move or an ATTACH was refused by its lock
            timeout every try (a drop refused is left for the next run instead).
    """
    done = Upkeep()
    done.moved = await move(conn, settings, renew)
    await turn(conn, settings, done)
    await drop_due(conn, settings, done, renew, who)
    await record(conn, settings, turned=done.turned is not None, dropped=bool(done.dropped))
    return done


async def record(
    conn: AsyncConnection[Any], settings: Settings, *, turned: bool, dropped: bool
) -> None:
    """Record the job's settings and that it ran now (and turned or dropped)."""
    await conn.execute(
        Q["record"],
        {
            "retention_seconds": float(settings.retention_seconds),
            "epoch_seconds": float(settings.epoch_seconds),
            "hot_seconds": float(settings.hot_seconds),
            "turned": turned,
            "dropped": dropped,
        },
    )


@dataclass(frozen=True)
class Would:
    """What a run would do now (``inturn purge --dry-run``): rows the move would take, whether
    the epoch would turn, the epochs it would drop."""

    movable: int
    turn: bool
    drop: list[Epoch]


async def would(conn: AsyncConnection[Any], settings: Settings) -> Would:
    """What :func:`upkeep` would do now, changing nothing."""
    now = await _value(conn, Q["now"], {})
    held = await epochs(conn)
    open_ = [e for e in held if e.opened_at is not None and e.closed_at is None]
    turns = bool(open_) and (now - open_[-1].opened_at).total_seconds() >= settings.epoch_seconds
    return Would(
        await movable(conn, settings.hot_seconds),
        turns,
        await due(conn, settings.retention_seconds),
    )


@dataclass(frozen=True)
class Status:
    """The history as operators see it (from the catalog: the row counts are the planner's
    estimates).

    Attributes:
        hot_rows, hot_bytes: the hot table (pending rows and the hot window), with indexes.
        history_rows, history_bytes: the history partitions held.
        log_rows, log_bytes: the log partitions held.
        epochs: epochs held (opened, not dropped).
        oldest_at: when the oldest epoch held was opened (the oldest day kept), or None.
        open_since: when the open epoch was opened.
        oldest_closed_at: when the oldest epoch held was closed (its drop is due a retention
            later), or None when only the open one is held.
        retention_seconds, epoch_seconds, hot_seconds: what the job was last told (None: it
            never ran).
        ran_at, turned_at, dropped_at: when it last ran, turned an epoch, dropped one.
    """

    hot_rows: int
    hot_bytes: int
    history_rows: int
    history_bytes: int
    log_rows: int
    log_bytes: int
    epochs: int
    oldest_at: datetime | None
    open_since: datetime | None
    oldest_closed_at: datetime | None
    retention_seconds: float | None
    epoch_seconds: float | None
    hot_seconds: float | None
    ran_at: datetime | None
    turned_at: datetime | None
    dropped_at: datetime | None
    #: which row figures were counted (:func:`status` with ``count_up_to``), not estimated
    hot_exact: bool = False
    history_exact: bool = False
    log_exact: bool = False

    def epoch_overdue_seconds(self, now: datetime) -> float:
        """How long past its length the open epoch is (0 when on time, or when the job never
        ran): the job stopped turning days (its partitions are then made no more either)."""
        if self.open_since is None or self.epoch_seconds is None:
            return 0.0
        return max(0.0, (now - self.open_since).total_seconds() - self.epoch_seconds)

    def drop_overdue_seconds(self, now: datetime) -> float:
        """How long past its retention the oldest closed epoch held is (0 when none is due, or
        when the job never ran): the job stopped dropping days."""
        if self.oldest_closed_at is None or self.retention_seconds is None:
            return 0.0
        age = (now - self.oldest_closed_at).total_seconds()
        return max(0.0, age - self.retention_seconds)

    def describe(self, now: datetime) -> str:
        """One line for people: the history's size and oldest day, the hot table's size, and
        when the maintenance job last ran, with what is overdue."""
        oldest = f", oldest day opened {self.oldest_at:%Y-%m-%d %H:%M}Z" if self.oldest_at else ""
        parts = [
            f"history: {_about(self.history_exact)}{self.history_rows:,} finished item(s), "
            f"{_size(self.history_bytes + self.log_bytes)} with the log, in {self.epochs}"
            f" day(s){oldest}",
            f"hot table: {_about(self.hot_exact)}{self.hot_rows:,} row(s), {_size(self.hot_bytes)}",
        ]
        if self.ran_at is None:
            parts.append("inturn purge has never run")
        else:
            parts.append(f"inturn purge ran {_ago((now - self.ran_at).total_seconds())} ago")
        late = self.epoch_overdue_seconds(now)
        if late > 0:
            parts.append(f"the day is {_ago(late)} late to turn")
        overdue = self.drop_overdue_seconds(now)
        if overdue > 0:
            parts.append(f"a drop is {_ago(overdue)} overdue")
        return "; ".join(parts)


def _about(exact: bool) -> str:
    return "" if exact else "about "


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


#: Rows counted at most per table by people's reads of :func:`status` (``count_up_to``): a
#: bounded read (tens of milliseconds), past which the planner's estimate is right enough.
COUNT_UP_TO = 100_000


async def status(conn: AsyncConnection[Any], count_up_to: int | None = None) -> Status:
    """The history's size, its oldest day and the job's last run, from the catalog (row counts
    are the planner's estimates: 0 before the first ANALYZE).

    Args:
        conn: a connection that may read the catalog; with ``count_up_to``, one that may also
            read the hot table, the history and the log (the console, the CLI).
        count_up_to: count each table's rows exactly, reading no more than this many; a table
            with fewer rows gets its exact count (``*_exact``), a larger one keeps the estimate;
            the history and the log are exact whatever their size where every day held was
            counted as it was written (migration 0052). None (/metrics): the catalog only.
    """
    row = await fetch_one(conn, Q["status"], row=dict_row)
    assert row is not None
    if count_up_to is None:
        return Status(**row)
    try:
        async with conn.transaction():
            counted = await fetch_one(conn, Q["counted"], {"cap": count_up_to}, row=dict_row)
    except psycopg.errors.InsufficientPrivilege:
        return Status(**row)  # a login that may read the catalog only: the estimates
    assert counted is not None
    exact = {}
    for part in ("hot", "history", "log"):
        n = int(counted[f"{part}_rows"])
        if n < count_up_to or (part != "hot" and counted["counters"]):
            exact[f"{part}_rows"] = n
            exact[f"{part}_exact"] = True
    return Status(**{**row, **exact})


async def erase_detached(conn: AsyncConnection[Any], key: str) -> int:
    """Delete the rows naming a patient from the days detached and not dropped yet (between a
    drop's DETACH and its DROP), log and history; ``key``: the identifier index key's forms,
    comma-separated (:func:`inturn.worker.store.identifiers.lookup_text`). Returns rows
    deleted. In the caller's transaction."""
    return int(await _value(conn, Q["erase_detached"], {"key": key}))
