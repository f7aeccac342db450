"""AE means nothing was kept (issue 18, kind 2), against a real Postgres.

The queue table is locked by a second session past ingest's store timeout, with the duplicate
window off (``--duplicate-window 0``): ingest cancels its transaction and answers AE (HTTP 503)
only once the rollback is seen, so nothing of the message appears when the lock goes, and the
sender's resend after AE is delivered exactly once. A backend that cannot even be cancelled
(stopped with SIGSTOP) gets no answer at all: its outcome is unknown.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import psycopg
import pytest
import pytest_asyncio
from psycopg import AsyncConnection

from inturn.worker.hl7.ack import Ack, parse_ack
from inturn.worker.hl7.mllp import frame
from inturn.worker.ingest.service import Ingest
from inturn.worker.testing import MllpReceiver
from tests.support.ingest import minimal, running
from tests.support.local import exchange
from tests.support.pipeline import register, rows, worker, worker_config

pytestmark = pytest.mark.store

DEST = "ward/lab"


@pytest_asyncio.fixture
async def ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    register(fresh_db, DEST, "c")
    async with running(fresh_db, duplicate_window=0, store_timeout=1.0) as started:
        yield started


async def mllp_exchange(ingest: Ingest, payload: bytes) -> Ack | None:
    """Send one message; its ACK, or None when ingest closed the connection unanswered."""
    reply = await exchange(ingest.mllp_ports["c"], payload, timeout=60)
    return None if reply is None else parse_ack(reply)


async def http_post(ingest: Ingest, payload: bytes) -> int:
    url = f"http://127.0.0.1:{ingest.http_port}/channels/c/messages"
    async with aiohttp.ClientSession() as session, session.post(url, data=payload) as response:
        await response.read()
        return response.status


async def lock_table(dsn: str) -> AsyncConnection[Any]:
    holder = await AsyncConnection.connect(dsn, application_name="table-locker")
    # blocks every INSERT into the channel log (where ingest stores a message)
    await holder.execute("LOCK TABLE inturn_message IN SHARE MODE")
    return holder


def ingest_statements_running(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'inturn-ingest' AND state <> 'idle'"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_ae_after_a_store_timeout_means_nothing_was_kept(
    ingest: Ingest, fresh_db: str
) -> None:
    holder = await lock_table(fresh_db)
    try:
        ack = await mllp_exchange(ingest, minimal("LOCKED-1"))
        assert ack is not None and (ack.code, ack.error_code) == ("AE", "207")
        assert await http_post(ingest, minimal("LOCKED-2")) == 503
        # the answers came after the rollbacks: no storing statement is left to commit
        assert ingest_statements_running(fresh_db) == 0
        # named (not fatal) while it holds: /readyz lists the process's conditions
        assert ingest.acceptor is not None and ingest.acceptor.storing.active
        assert ingest.acceptor.storing.tries == 2
    finally:
        await holder.rollback()
        await holder.close()
    assert rows(fresh_db) == []
    # the sender sends again after AE: stored once, delivered once
    ack = await mllp_exchange(ingest, minimal("LOCKED-1"))
    assert ack is not None and ack.code == "AA"
    assert not ingest.acceptor.storing.active
    assert len(rows(fresh_db)) == 1
    async with MllpReceiver() as rx, worker(worker_config(DEST, rx.port), fresh_db):
        await rx.wait_for(1)
        await asyncio.sleep(1.0)  # a second copy would have come by now
    assert [p.split(b"|")[9] for p in rx.received] == [b"LOCKED-1"]


async def test_a_store_whose_end_cannot_be_seen_gets_no_answer(
    ingest: Ingest, fresh_db: str
) -> None:
    """The backend is stopped (SIGSTOP): the cancel cannot act, so ingest cannot know whether
    the transaction will commit, and answers nothing rather than AE."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        server = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert server is not None
        # asked while the session lives: its backend ends with it (once seen gone, and skipped)
        here = os.path.exists(f"/proc/{server[0]}")
    if os.geteuid() != 0 or not here:
        pytest.skip("needs root and the Postgres server on this machine")
    assert ingest.acceptor is not None
    ingest.acceptor.committer.confirm_seconds = 1.0
    holder = await lock_table(fresh_db)
    stopped: list[int] = []
    try:
        exchange = asyncio.create_task(mllp_exchange(ingest, minimal("FROZEN-1")))
        async with asyncio.timeout(10):
            while not stopped:
                await asyncio.sleep(0.05)
                with psycopg.connect(fresh_db, autocommit=True) as conn:
                    found = conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name ="
                        " 'inturn-ingest' AND wait_event_type = 'Lock'"
                    ).fetchall()
                for (pid,) in found:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
        assert await exchange is None  # no AE: the connection closed unanswered
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        await holder.rollback()
        await holder.close()


async def test_a_batch_answered_ae_after_a_store_timeout_kept_nothing(
    ingest: Ingest, fresh_db: str
) -> None:
    fhs = b"FHS|^~\\&|LAB|HOSP|EHR|HOSP|20261201||||F-9\r"
    fhs += b"BHS|^~\\&|LAB|HOSP|EHR|HOSP|20261201||||B-9\r"
    payload = fhs + minimal("BATCHED-1") + minimal("BATCHED-2") + b"BTS|2\rFTS|1\r"
    holder = await lock_table(fresh_db)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingest.mllp_ports["c"])
        writer.write(frame(payload))
        await writer.drain()
        answer = b""
        async with asyncio.timeout(60):
            while b"FTS|" not in answer:
                chunk = await reader.read(65536)
                assert chunk, "closed without an answer"
                answer += chunk
        writer.close()
        assert ingest_statements_running(fresh_db) == 0
    finally:
        await holder.rollback()
        await holder.close()
    msa = [line for line in answer.split(b"\r") if line.startswith(b"MSA|")]
    assert [line.split(b"|")[1] for line in msa] == [b"AE", b"AE"]
    assert rows(fresh_db) == []
