"""A frozen holder behind PgBouncer is replaced within the lease's bound too (issue 40, part 4):
``inturn worker`` SIGSTOPped mid-backlog through a pooler in session mode (its server session
and session lock live on, as on a direct connection) and in transaction mode (no session lock:
the expiry alone); a second worker takes the expired lease over, the woken one sends nothing
more, every message arrives once (at most one duplicate), in order."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.local import manifest, mllp_sender, worker_process
from tests.support.local import message as local_message
from tests.support.pipeline import control_ids, count

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.store, pytest.mark.slow]

DEST = "default/lab"


def _epoch(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT epoch FROM inturn_lease WHERE destination = %s", (DEST,)).fetchone()
    return int(row[0]) if row else 0


async def test_a_stopped_holder_behind_a_pooler_is_replaced(
    pooled: str, fresh_db: str, tmp_path: Path
) -> None:
    total = 150
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as c:
        await queue.enqueue(
            c,
            [NewItem(DEST, "adt", f"M{n:05d}", "ADT^A01", local_message(n)) for n in range(total)],
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_")}
    env.update(
        INTURN_DSN=pooled,
        INTURN_LEASE_TTL_SECONDS="6",
        INTURN_LEASE_RENEW_SECONDS="2",
        INTURN_LEASE_ACQUIRE_SECONDS="1",
        INTURN_POLL_SECONDS="0.5",
    )
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.02
        path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
        first = await worker_process(path, env)
        second: asyncio.subprocess.Process | None = None
        try:
            await rx.wait_for(20, timeout=60)
            epoch = _epoch(fresh_db)
            first.send_signal(signal.SIGSTOP)
            loop = asyncio.get_running_loop()
            stopped_at = loop.time()
            second = await worker_process(path, env)
            async with asyncio.timeout(60):
                while _epoch(fresh_db) == epoch:
                    await asyncio.sleep(0.1)
            took = loop.time() - stopped_at
            assert took < 6 + 1 + 10  # ttl + acquire interval, with a shared machine's margin
            first.send_signal(signal.SIGCONT)
            async with asyncio.timeout(120):
                while await count(fresh_db, "delivered") < total:
                    await asyncio.sleep(0.1)
            assert _epoch(fresh_db) == epoch + 1  # the woken one took nothing back
        finally:
            first.send_signal(signal.SIGCONT)
            for proc in (first, second):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(proc.wait(), 30)
        got = control_ids(rx.received)
    expected = [f"M{n:05d}" for n in range(total)]
    assert sorted(set(got)) == expected
    assert len(got) - len(set(got)) <= 1
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expected
