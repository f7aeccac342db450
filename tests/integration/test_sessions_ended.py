"""A session the server ended is a lost session, whatever its SQLSTATE (issue 27, item 6).

Against the real Postgres: a DBA's ``idle_session_timeout`` (57P05) ends every idle pooled
connection of ingest; ``idle_in_transaction_session_timeout`` (25P03) and
``pg_terminate_backend`` (57P01) end a pooled connection under a caller. Each time the next
message is stored (AA, not AE) and the pool hands out live connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
import pytest_asyncio
from psycopg.conninfo import make_conninfo

from inturn.worker.ingest.service import Ingest
from inturn.worker.store.connect import Pools
from inturn.worker.store.faults import classify, connection_gone
from tests.support.ingest import http_post, minimal, mllp_ack, running
from tests.support.pipeline import register, rows

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.store, pytest.mark.slow]

#: Milliseconds of idleness after which the server ends a session, in these tests.
IDLE_MS = 300


@pytest_asyncio.fixture
async def idle_ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    """Ingest whose every session the server ends after :data:`IDLE_MS` of idleness (the
    DSN's own ``options``, as a DBA's ``ALTER ROLE ... SET`` would, for these sessions only)."""
    register(fresh_db, "ward/lab", "c")
    dsn = make_conninfo(fresh_db, options=f"-c idle_session_timeout={IDLE_MS}")
    async with running(dsn) as started:
        yield started


async def test_the_first_messages_after_a_quiet_spell_are_stored(
    idle_ingest: Ingest, fresh_db: str
) -> None:
    for round_ in range(3):
        acks = await asyncio.gather(
            *(mllp_ack(idle_ingest, minimal(f"B{round_}-{i}")) for i in range(3))
        )
        assert {a.code for a in acks} == {"AA"}
        await asyncio.sleep(IDLE_MS / 1000 * 3)  # every pooled session is ended meanwhile
        ack = await mllp_ack(idle_ingest, minimal(f"QUIET-{round_}"))
        assert (ack.code, ack.control_id) == ("AA", f"QUIET-{round_}")
        await asyncio.sleep(IDLE_MS / 1000 * 3)
        status, ack = await http_post(idle_ingest, minimal(f"HTTP-{round_}"))
        assert (status, ack.code) == (200, "AA")
    assert len(rows(fresh_db)) == 3 * 5  # each stored once


async def idle_in_transaction(conn: psycopg.AsyncConnection[object]) -> None:
    await conn.execute("BEGIN")
    await conn.execute("SET LOCAL idle_in_transaction_session_timeout = 200")
    await asyncio.sleep(0.6)
    await conn.execute("SELECT 1")


async def terminated(conn: psycopg.AsyncConnection[object]) -> None:
    async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as other:
        await other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    await asyncio.sleep(0.2)
    await conn.execute("SELECT 1")


async def idle_session(conn: psycopg.AsyncConnection[object]) -> None:
    await conn.execute("SET idle_session_timeout = 200")
    await asyncio.sleep(0.6)
    await conn.execute("SELECT 1")


@pytest.mark.parametrize(
    ("end", "sqlstate"),
    [(idle_in_transaction, "25P03"), (terminated, "57P01"), (idle_session, "57P05")],
    ids=["idle_in_transaction_timeout", "pg_terminate_backend", "idle_session_timeout"],
)
async def test_the_pool_replaces_a_session_the_server_ended(
    fresh_db: str, end: object, sqlstate: str
) -> None:
    async with await Pools.open(fresh_db, write_size=3, read_size=1) as pools:
        # three idle connections, then the server ends every one of them
        async with (
            pools.write.connection() as a,
            pools.write.connection() as b,
            pools.write.connection() as c,
        ):
            pids = [x.info.backend_pid for x in (a, b, c)]
        with pytest.raises(psycopg.Error) as caught:
            async with pools.write.connection() as conn:
                assert conn.info.backend_pid in pids
                async with await psycopg.AsyncConnection.connect(
                    fresh_db, autocommit=True
                ) as admin:  # its two idle siblings die meanwhile
                    for pid in set(pids) - {conn.info.backend_pid}:
                        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                await end(conn)  # type: ignore[operator]
        assert caught.value.sqlstate in {sqlstate, None}
        assert connection_gone(caught.value)
        assert classify(caught.value).fault == "dead"
        # the pool checked its idle connections: every one handed out now is alive
        async with (
            pools.write.connection() as a,
            pools.write.connection() as b,
            pools.write.connection() as c,
        ):
            for x in (a, b, c):
                assert x.info.backend_pid not in pids
                await x.execute("SELECT 1")


async def test_the_worker_reconnects_after_the_server_ends_its_idle_session(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    from inturn.worker.store import queue
    from inturn.worker.store.model import NewItem
    from inturn.worker.testing import MllpReceiver
    from tests.support.lab import DEST, message, running
    from tests.support.lab import config as worker_config
    from tests.support.pipeline import until

    dsn = make_conninfo(fresh_db, options=f"-c idle_session_timeout={IDLE_MS}")
    async with (
        MllpReceiver() as rx,
        running(worker_config(rx.port), dsn),
        await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn,
    ):
        for n in range(3):  # each after a quiet spell longer than the server allows
            await asyncio.sleep(IDLE_MS / 1000 * 4)
            await queue.enqueue(conn, [NewItem(DEST, "adt", f"MSG{n:05d}", "ADT^A01", message(n))])

            async def delivered(count: int = n + 1) -> bool:
                return len(rx.received) >= count

            await until(delivered)
    assert [p.split(b"|")[9] for p in rx.received] == [b"MSG00000", b"MSG00001", b"MSG00002"]
    assert "connection lost" in caplog.text  # it was ended, and it came back each time
