"""inturn's processes through a real PgBouncer in session and transaction mode, PgBouncer's
defaults but the pool mode (issue 29): ``inturn local`` (ingest over MLLP, its workers, its
sweeper and its console) answers AA and delivers every message once, in order; ``inturn sweep``
and ``inturn purge`` run; an ``inturn worker`` killed while it holds the lease is replaced by
another (in transaction mode only once the lease expires), and nothing is lost or reordered."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import pgbouncer
from tests.support.local import (
    INTURN,
    LocalProcess,
    free_port,
    manifest,
    message,
    mllp_sender,
    send,
    worker_process,
)
from tests.support.pipeline import control_ids
from tests.support.pipeline import until as pipeline_until

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.skipif(bool(pgbouncer.missing()), reason=str(pgbouncer.missing())),
    pytest.mark.slow,
]

#: Short leases, so that a takeover takes seconds here (the default bound is 50 s).
QUICK_LEASE = {
    "INTURN_LEASE_TTL_SECONDS": "6",
    "INTURN_LEASE_RENEW_SECONDS": "1",
    "INTURN_LEASE_ACQUIRE_SECONDS": "0.5",
    "INTURN_POLL_SECONDS": "0.2",
}


async def count(dsn: str, where: str) -> int:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT count(*) FROM inturn_delivery WHERE {where}")  # type: ignore[arg-type]
        row = await cur.fetchone()
    return int(row[0]) if row else -1


until = functools.partial(pipeline_until, timeout=60, every=0.1)


async def test_inturn_local_ingests_delivers_sweeps_and_serves_the_console(
    bouncer: pgbouncer.Bouncer, pooled: str, tmp_path: Path
) -> None:
    listen, console, ops = free_port(), free_port(), free_port()
    async with MllpReceiver() as rx:
        path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
        local = LocalProcess(
            tmp_path / "local.log",
            ["-f", str(path), "--listen", f"adt={listen}", "--console", f"127.0.0.1:{console}",
             "--sweep-every", "1s", "--ops", f"127.0.0.1:{ops}", "--dsn", pooled],
            env=QUICK_LEASE,
        )  # fmt: skip
        try:
            await local.start(listen)
            await local.wait_log("lease held", timeout=30)
            codes = await send(listen, [message(n) for n in range(40)])
            assert codes == ["AA"] * 40  # no AE from a setting leaked by a read
            await until(lambda: _is(count(pooled, "state = 'delivered'"), 40))
            with urllib.request.urlopen(
                f"http://127.0.0.1:{console}/api/v1/overview", timeout=10
            ) as r:
                assert r.status == 200
            await local.wait_log("sweep", timeout=30)
            with urllib.request.urlopen(f"http://127.0.0.1:{ops}/readyz", timeout=10) as r:
                ready = r.read().decode()
            # detection: said at start and on /readyz when the pooler moves sessions
            pooled_mode = bouncer.pool_mode == "transaction"
            assert ("pooled connection" in ready) == pooled_mode, ready
            assert ("pooled connection" in local.log()) == pooled_mode
            assert await local.interrupt() == 0
        finally:
            await local.kill()
        assert control_ids(rx.received) == [f"M{n:05d}" for n in range(40)]
    assert "Traceback" not in local.log(), local.log()


async def _is(value: object, expected: int) -> bool:
    return await value == expected  # type: ignore[misc]


def test_sweep_and_purge_run_through_the_pooler(pooled: str) -> None:
    env = {**os.environ, "INTURN_DSN": pooled}
    for args in (["sweep"], ["purge", "--older-than", "1s"], ["sweep"], ["purge"]):
        done = subprocess.run([str(INTURN), *args], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0, (args, done.stderr)
        assert "another" not in (done.stdout + done.stderr), (args, done.stdout, done.stderr)


async def test_a_killed_worker_is_replaced_once_its_lease_expires(
    bouncer: pgbouncer.Bouncer, pooled: str, tmp_path: Path
) -> None:
    """Behind a transaction pooler the lease's expiry is the only rule (no backend of the
    holder's own to check). In session mode the worker is a session of its own: the pooler
    resets the server connection when the killed client goes (DISCARD ALL drops its lock), and
    the successor may take over at once."""
    total = 300
    dest = "default/lab"
    async with await AsyncConnection.connect(pooled, autocommit=True, prepare_threshold=None) as c:
        await queue.enqueue(
            c, [NewItem(dest, "adt", f"M{n:05d}", "ADT^A01", message(n)) for n in range(total)]
        )
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.005
        path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
        env = {**os.environ, "INTURN_DSN": pooled, **QUICK_LEASE}

        first = await worker_process(path, env)
        await rx.wait_for(60, timeout=60)
        async with await AsyncConnection.connect(
            pooled, autocommit=True, prepare_threshold=None
        ) as c:
            cur = await c.execute(
                "SELECT backend_pid FROM inturn_lease WHERE destination = %s", (dest,)
            )
            recorded = await cur.fetchone()
        first.send_signal(signal.SIGKILL)  # mid-stream, holding the lease
        await asyncio.wait_for(first.wait(), 30)
        async with await AsyncConnection.connect(
            pooled, autocommit=True, prepare_threshold=None
        ) as c:
            cur = await c.execute(
                "SELECT expires_at FROM inturn_lease WHERE destination = %s AND epoch = 1", (dest,)
            )
            dead_row = await cur.fetchone()
        assert dead_row is not None
        second = await worker_process(path, env)
        try:
            await until(lambda: _is(count(pooled, "state = 'delivered'"), total), timeout=120)
        finally:
            second.send_signal(signal.SIGTERM)
            await asyncio.wait_for(second.wait(), 30)
        got = control_ids(rx.received)
    expected = [f"M{n:05d}" for n in range(total)]
    assert sorted(set(got)) == expected  # nothing lost
    assert len(got) - len(set(got)) <= 1  # at most the message in flight, twice
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expected  # first copies in order
    async with await AsyncConnection.connect(pooled, autocommit=True, prepare_threshold=None) as c:
        cur = await c.execute(
            "SELECT epoch, acquired_at FROM inturn_lease WHERE destination = %s", (dest,)
        )
        epoch, acquired_at = await cur.fetchone() or (0, None)
    assert epoch == 2  # the second worker took it over, once
    if bouncer.pool_mode == "transaction":
        # no stable backend: the holder recorded none, and its successor waited for the expiry
        assert recorded == (None,)
        assert acquired_at >= dead_row[0]  # not taken over while the dead one's lease was live
