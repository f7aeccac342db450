"""Connections and pools: how every process talks to Postgres.

* ``connect_worker``: the one dedicated connection a worker uses for everything (its advisory
  lock, LISTEN, the head query, its updates and its depth gauge).
* :class:`Pools`: two pools for ingest, the CLI and the operator: one for writes, and one
  read-only with a short statement timeout for listings and dashboards, so that a slow page
  never holds up a delivery.

The DSN comes from ``--dsn`` or ``INTURN_DSN`` (libpq connection string or URI).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

#: Statement timeout (milliseconds) of the read-only pool.
READ_STATEMENT_TIMEOUT_MS = 5000


class DsnMissing(Exception):
    """Neither ``--dsn`` nor ``INTURN_DSN`` says where the database is."""


def resolve_dsn(dsn: str | None) -> str:
    """Return ``dsn`` or ``$INTURN_DSN``.

    Raises:
        DsnMissing: neither is set.
    """
    value = dsn or os.environ.get("INTURN_DSN")
    if not value:
        raise DsnMissing("no database: pass --dsn or set INTURN_DSN")
    return value


async def connect_worker(dsn: str, application_name: str = "inturn-worker") -> AsyncConnection[Any]:
    """Open one autocommit connection with synchronous commit on and TCP keepalives.

    Keepalives make a dead peer noticed within about a minute, so a lost connection (and with
    it the advisory lock) is detected rather than waited on.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    return await AsyncConnection.connect(
        dsn,
        autocommit=True,
        application_name=application_name,
        keepalives=1,
        keepalives_idle=30,
        keepalives_interval=10,
        keepalives_count=3,
        options="-c synchronous_commit=on",
    )


@dataclass(frozen=True)
class Pools:
    """The write pool and the read-only pool: where ingest, the CLI and the operator take a
    connection from, and hand it to a store function (:mod:`inturn.worker.store.queue`, ...)::

        async with await Pools.open(dsn) as pools:
            async with pools.write.connection() as conn:
                await queue.skip(conn, item_id, who="cli")

    Both pools hold autocommit connections with ``synchronous_commit`` on; the read pool's are
    read-only with a statement timeout of :data:`READ_STATEMENT_TIMEOUT_MS`, for listings and
    dashboards.
    """

    write: AsyncConnectionPool
    read: AsyncConnectionPool

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        write_size: int = 4,
        read_size: int = 2,
        application_name: str = "inturn",
    ) -> Pools:
        """Open both pools against ``dsn`` and wait until each has a connection.

        Raises:
            psycopg_pool.PoolTimeout: the database could not be reached within 10 seconds.
        """
        write = _pool(dsn, "inturn-write", write_size, application_name, "")
        read_options = (
            f" -c default_transaction_read_only=on -c statement_timeout={READ_STATEMENT_TIMEOUT_MS}"
        )
        read = _pool(dsn, "inturn-read", read_size, application_name, read_options)
        await write.open(wait=True, timeout=10)
        try:
            await read.open(wait=True, timeout=10)
        except BaseException:
            await write.close()
            raise
        return cls(write, read)

    async def close(self) -> None:
        """Close both pools."""
        await self.write.close()
        await self.read.close()

    async def __aenter__(self) -> Pools:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _pool(
    dsn: str, name: str, size: int, application_name: str, options: str
) -> AsyncConnectionPool:
    kwargs = {
        "application_name": application_name,
        "options": "-c synchronous_commit=on" + options,
        "autocommit": True,
    }
    return AsyncConnectionPool(dsn, min_size=1, max_size=size, kwargs=kwargs, open=False, name=name)
