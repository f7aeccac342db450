"""The connection pool every pooled process uses, with a reconnect delay that stops growing.

psycopg_pool replaces a lost connection by trying again after 1 s, then doubling the wait
(``AttemptWithBackoff``: 1, 2, 4, ... 128 s within its five-minute ``reconnect_timeout``). After an
outage of three minutes the next try could be two minutes away: ingest went on answering AE for
50 s after Postgres was back. :class:`Pool` keeps the library's first try and its jitter and
caps every later wait at :data:`RECONNECT_MAX_DELAY_SECONDS`, so the pool is whole again within
that time of the server accepting connections, however long it was away. The cost is one
connection attempt per lost connection every two seconds while the server is down.

**A lost session is a lost session, whatever its code.** When a statement on a pooled
connection fails with an error :func:`inturn.worker.store.faults.connection_gone` calls gone
(a restart, ``pg_terminate_backend``, a DBA's ``idle_session_timeout`` or
``idle_in_transaction_session_timeout``: their siblings idle in the pool died of the same
cause), the connection is discarded and the pool's idle connections are checked at once
(``check()``), before the error reaches the caller: a caller that tries again gets a live
connection, not the next dead one.

**One warning per pool and kind per interval.** While the server is away, every try to replace
a connection logs a warning (``error connecting in 'ingest-write': ...``): one every two seconds
per pool, for as long as the outage lasts. :class:`PoolWarningLimiter`, on the ``psycopg.pool``
logger of every process that makes a :class:`Pool`, lets the first of a kind through, drops the
same kind of the same pool for :data:`POOL_WARNING_INTERVAL_SECONDS`, and then lets the next one
through with how many it dropped meanwhile (``... (12 more like it in the last 30 s)``).

Imported only where a pool is made (:func:`inturn.worker.store.connect.Pools.open`), so that a
worker, which has one connection and no pool, never loads psycopg_pool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from inturn.worker.store.faults import connection_gone

#: Longest wait, in seconds, between two tries to replace a lost pooled connection.
RECONNECT_MAX_DELAY_SECONDS = 2.0


#: Seconds during which a pool's repeated warnings of one kind are counted, not logged.
POOL_WARNING_INTERVAL_SECONDS = 30.0


class PoolWarningLimiter(logging.Filter):
    """A :class:`logging.Filter` that lets through one record per pool and kind per interval.

    The kind is the record's message template (``"error connecting in %r: %s"``); the pool is
    its first argument when that is a string (psycopg_pool names the pool there), else the
    kind alone is the key. The first record of a key passes; later ones within ``interval``
    seconds are dropped and counted; the first after it passes with the count appended to its
    message. Records below WARNING always pass (their level already hides them).

    Args:
        interval: seconds, > 0.
        clock: monotonic seconds (for tests); :func:`time.monotonic` by default.
    """

    def __init__(
        self,
        interval: float = POOL_WARNING_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        #: key -> (monotonic time the last record passed, records dropped since)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True to log ``record`` (possibly with the dropped count appended), False to drop."""
        if record.levelno < logging.WARNING:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        pool = args[0] if args and isinstance(args[0], str) else ""
        key = (str(record.msg), pool)
        now = self.clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.interval:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            self._seen[key] = (now, 0)
            if len(self._seen) > 1000:  # bounded: forget the oldest keys
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:500]:
                    del self._seen[old]
        if last is not None and last[1] and isinstance(record.args, tuple | type(None)):
            text = str(record.msg) if args else str(record.msg).replace("%", "%%")
            record.msg = f"{text} (%d more like it in the last %.0f s)"
            record.args = (*args, last[1], now - last[0])
        return True


#: The one limiter of this process, added once to the ``psycopg.pool`` logger by :class:`Pool`.
POOL_WARNINGS = PoolWarningLimiter()


class CappedAttempt(AttemptWithBackoff):
    """psycopg_pool's reconnect attempt whose delay doubles only up to
    :data:`RECONNECT_MAX_DELAY_SECONDS` (it still gives up after the pool's
    ``reconnect_timeout``, after which the next request for a connection starts a new one)."""

    def update_delay(self, now: float) -> None:
        """Set ``delay`` (seconds) before the next try, as the library does, then cap it."""
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MAX_DELAY_SECONDS)


class Pool(AsyncConnectionPool[AsyncConnection[Any]]):
    """An :class:`psycopg_pool.AsyncConnectionPool` whose lost connections are replaced with
    :class:`CappedAttempt` delays, and whose idle connections are checked as soon as one is found
    gone (see the module docstring); same arguments, same behaviour otherwise.

    Args:
        read_only: each use of a connection (:meth:`connection`) is one read-only transaction
            with the read statement timeout (:func:`inturn.worker.store.connect.begin_read`),
            committed when the body returns, rolled back when it raises: no session state.
    """

    def __init__(self, *args: Any, read_only: bool = False, **kwargs: Any) -> None:
        logging.getLogger("psycopg.pool").addFilter(POOL_WARNINGS)  # once: addFilter dedups
        super().__init__(*args, **kwargs)
        self.read_only = read_only

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection from the pool, as :meth:`AsyncConnectionPool.connection` gives it (in a
        read-only transaction for a ``read_only`` pool).

        Raises:
            psycopg_pool.PoolTimeout: no connection within ``timeout`` seconds.
            Exception: whatever the body raised; when it says the connection is gone, the
                pool's idle connections were checked (dead ones replaced) first.
        """
        try:
            async with super().connection(timeout) as conn:
                if not self.read_only:
                    yield conn
                    return
                from inturn.worker.store.connect import begin_read

                await conn.execute(begin_read())
                try:
                    yield conn
                except BaseException:
                    if not (conn.closed or conn.broken):
                        await conn.rollback()
                    raise
                await conn.commit()
        except Exception as exc:
            if connection_gone(exc):
                await self.check()
            raise

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = CappedAttempt(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing)
