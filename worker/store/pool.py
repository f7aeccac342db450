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

Imported only where a pool is made (:func:`inturn.worker.store.connect.Pools.open`), so that a
worker, which has one connection and no pool, never loads psycopg_pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from inturn.worker.store.faults import connection_gone

#: Longest wait, in seconds, between two tries to replace a lost pooled connection.
RECONNECT_MAX_DELAY_SECONDS = 2.0


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
