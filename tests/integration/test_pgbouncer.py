"""The PgBouncer harness (tests/support/pgbouncer.py) and the lease through a real PgBouncer, in
session and in transaction mode, with PgBouncer's defaults everywhere but the pool mode."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import lease
from tests.support import pgbouncer

pytestmark = pytest.mark.skipif(bool(pgbouncer.missing()), reason=str(pgbouncer.missing()))

DEST = "hospital/lab"


def test_the_harness_keeps_every_default_but_the_pool_mode(bouncer: pgbouncer.Bouncer) -> None:
    settings = {
        line.split("=", 1)[0].strip()
        for line in bouncer.config().splitlines()
        if "=" in line and not line.startswith("*")
    }
    plumbing = {"listen_addr", "listen_port", "unix_socket_dir", "auth_file", "logfile", "pidfile"}
    assert settings - plumbing == {"pool_mode"}


def test_a_stock_pgbouncer_refuses_startup_options(
    bouncer: pgbouncer.Bouncer, fresh_db: str
) -> None:
    """What issue 29 met: a session that sets its settings as startup ``options`` is refused."""
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(
            bouncer.dsn(fresh_db), options="-c synchronous_commit=on", prepare_threshold=None
        ).close()


def test_statements_reach_the_database(pooled: str, fresh_db: str) -> None:
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as c:
        row = c.execute("SELECT current_database()").fetchone()
    assert row is not None and row[0] == psycopg.conninfo.conninfo_to_dict(fresh_db)["dbname"]


def test_transaction_mode_moves_a_session_between_backends(
    bouncer: pgbouncer.Bouncer, pooled: str
) -> None:
    """Two statements of one client run on two backends when another client holds the first
    one in a transaction: what makes a session advisory lock meaningless there."""
    with (
        psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as a,
        psycopg.connect(pooled, prepare_threshold=None) as b,
    ):
        first = a.execute("SELECT pg_backend_pid()").fetchone()
        b.execute("SELECT 1")  # b's transaction now holds a backend (the idle one: first's)
        second = a.execute("SELECT pg_backend_pid()").fetchone()
        b.rollback()
    assert first is not None and second is not None
    assert (first[0] != second[0]) == (bouncer.pool_mode == "transaction")


async def test_the_lease_fences_through_the_pooler(pooled: str) -> None:
    async with await AsyncConnection.connect(pooled, autocommit=True, prepare_threshold=None) as c:
        old = await lease.acquire(c, DEST, "a", 0.2)
        assert old is not None
        assert await lease.acquire(c, DEST, "b", 30) is None
        await asyncio.sleep(0.3)
        new = await lease.acquire(c, DEST, "b", 30)
        assert new is not None and new.epoch == old.epoch + 1
        with pytest.raises(lease.LeaseLost):
            await lease.renew(c, old, 30)
        assert await lease.renew(c, new, 30) > 29
