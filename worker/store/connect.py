"""Connections and pools: how every process talks to Postgres.

* ``connect_worker``: the one dedicated connection a worker uses for everything (its advisory
  lock, LISTEN, the head query, its updates and its depth gauge).
* ``Store.open``: two pools for ingest, the CLI and the operator: one for writes, and one
  read-only with a short statement timeout for listings and dashboards, so that a slow page
  never holds up a delivery.

The DSN comes from ``--dsn`` or ``INTURN_DSN`` (libpq connection string or URI).
"""

from __future__ import annotations

import os
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


async def _configure_write(conn: AsyncConnection[Any]) -> None:
    await conn.set_autocommit(True)


async def _configure_read(conn: AsyncConnection[Any]) -> None:
    await conn.set_autocommit(True)
    await conn.execute("SET default_transaction_read_only = on")
    await conn.execute(f"SET statement_timeout = {READ_STATEMENT_TIMEOUT_MS}")


async def open_pools(
    dsn: str, *, write_size: int = 4, read_size: int = 2, application_name: str = "inturn"
) -> tuple[AsyncConnectionPool, AsyncConnectionPool]:
    """Open the write pool and the read-only pool (autocommit connections).

    Raises:
        psycopg_pool.PoolTimeout: the database could not be reached within 10 seconds.
    """
    kwargs = {"application_name": application_name, "options": "-c synchronous_commit=on"}
    write = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=write_size,
        kwargs=kwargs,
        configure=_configure_write,
        open=False,
        name="inturn-write",
    )
    read = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=read_size,
        kwargs=kwargs,
        configure=_configure_read,
        open=False,
        name="inturn-read",
    )
    await write.open(wait=True, timeout=10)
    try:
        await read.open(wait=True, timeout=10)
    except BaseException:
        await write.close()
        raise
    return write, read
