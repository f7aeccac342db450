"""Pooler benchmark: idle workers through PgBouncer in transaction mode on a Postgres with
``max_connections = 50``, beside the same workers on direct connections (issue 29).

    .venv/bin/python bench/pooler.py [--workers 200] [--window 30] [--wakes 20]

Needs root and the PostgreSQL 15 binaries (servers of its own, ``tests/support/pgcluster.py``)
and Debian's ``pgbouncer`` (``tests/support/pgbouncer.py``); says why and prints nothing else
without them. Each mode runs ``--workers`` destination workers in this one process (one
connection each, as many pods would hold), all idle with nothing queued:

* **pooled**: through PgBouncer, transaction mode, its defaults but ``max_client_conn`` (raised
  to hold the workers: its default is 100 clients), on a server with ``max_connections = 50``.
  No LISTEN: each worker polls every ``INTURN_POLL_SECONDS`` (1 s by default).
* **direct**: straight to a server with room for every worker (``max_connections`` = workers
  + 50), each LISTENing on its own session.

Printed per mode: the server connections in use while idle (client backends of the bench
database), statements a second per idle worker (counted where the workers send them, in this
process), the server's transactions a second per idle worker (``pg_stat_database.xact_commit``
over the window, less this script's own: it also counts what the pooler sends itself, such as
the ``SET application_name`` of a server connection that changes clients, and autovacuum's
work), and the wake-up latency of the first message (one message enqueued for one idle
destination at a time until its receiver has it: median and worst of ``--wakes``). Asserts
nothing; the last line is the figures (``bench/figures.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

import psycopg
from figures import emit, parse_args
from psycopg import AsyncConnection

from inturn.worker.drain.observer import NullObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig
from inturn.worker.store import queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import pgbouncer
from tests.support.pgcluster import Cluster
from tests.support.pgcluster import missing as no_cluster

#: The pooled server's connection limit (the issue's figure).
POOLED_MAX_CONNECTIONS = 50

#: Statements sent by cursors of this process (the workers'), counted by :func:`_counting`.
SENT = [0]
_execute = psycopg.AsyncCursor.execute


async def _counting(self: Any, *args: Any, **kwargs: Any) -> Any:
    SENT[0] += 1
    return await _execute(self, *args, **kwargs)


psycopg.AsyncCursor.execute = _counting  # type: ignore[method-assign]


def message(n: int) -> bytes:
    return f"MSH|^~\\&|A|B|C|D|2026||ADT^A01|W{n:05d}|P|2.5\rPID|1||{n}\r".encode()


def config(index: int, port: int) -> WorkerConfig:
    return WorkerConfig(
        destination=f"bench/d{index:04d}",
        channel="adt",
        sender=MllpSenderConfig("127.0.0.1", port),
        retry=RetryPolicy(max_attempts=0, timeout_seconds=5),
    )


def server(max_connections: int) -> Cluster:
    """A Postgres of our own with ``max_connections`` set (restarted once to apply it)."""
    cluster = Cluster()
    cluster.primary.stop()
    cluster.primary.settings["max_connections"] = str(max_connections)
    cluster.primary.start()
    return cluster


async def scalar(conn: AsyncConnection[Any], query: str) -> int:
    cur = await conn.execute(query)  # type: ignore[arg-type]
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def measure(
    label: str, worker_dsn: str, admin_dsn: str, workers: int, window: float, wakes: int
) -> dict[str, float]:
    """Run ``workers`` idle workers on ``worker_dsn``; their figures, read on ``admin_dsn``."""
    async with MllpReceiver() as rx:
        stop = asyncio.Event()
        running = [
            DestinationWorker(
                config(i, rx.port),
                worker_dsn,
                MllpSender(config(i, rx.port).sender),
                NullObserver(),
            )
            for i in range(workers)
        ]
        tasks = [asyncio.create_task(w.run(stop)) for w in running]
        try:
            started = time.monotonic()
            async with asyncio.timeout(300):
                while not all(w.state.lock_held for w in running):
                    await asyncio.sleep(0.2)
            print(f"   {label}: {workers} workers hold their leases after"
                  f" {time.monotonic() - started:.1f} s")  # fmt: skip
            await asyncio.sleep(2.0)  # past their first head queries
            async with await AsyncConnection.connect(admin_dsn, autocommit=True) as admin:
                commits = (
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                )
                backends = (
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                )
                before = await scalar(admin, commits)
                sent = SENT[0]
                await asyncio.sleep(window)
                sent = SENT[0] - sent - 1  # less the SELECT of xact_commit below
                after = await scalar(admin, commits)
                in_use = await scalar(admin, backends)
                own = 3  # the two SELECTs of xact_commit and the stats snapshot between them
                per_worker = max(0, after - before - own) / window / workers
                statements = max(0, sent) / window / workers
                latencies = []
                for n in range(wakes):
                    index = (n * 7919) % workers
                    seen = len(rx.received)
                    sent = time.monotonic()
                    destination = f"bench/d{index:04d}"
                    await queue.enqueue(
                        admin, [NewItem(destination, "adt", f"W{n:05d}", "ADT^A01", message(n))]
                    )
                    async with asyncio.timeout(60):
                        while len(rx.received) == seen:
                            await asyncio.sleep(0.005)
                    latencies.append(time.monotonic() - sent)
                    await asyncio.sleep(0.37)  # off the poll's phase
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    figures = {
        "server_connections": float(in_use),
        "idle_statements_per_s_per_worker": round(statements, 4),
        "idle_server_transactions_per_s_per_worker": round(per_worker, 4),
        "wake_median_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "wake_worst_ms": round(max(latencies) * 1000, 1) if latencies else None,
    }
    print(
        f"   {label}: {in_use} server connections; {statements:.3f} statements/s per idle"
        f" worker ({per_worker:.3f} server transactions/s); first message woken in"
        f" {figures['wake_median_ms']} ms median,"
        f" {figures['wake_worst_ms']} ms worst"
    )
    return {k: v for k, v in figures.items() if v is not None}


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--wakes", type=int, default=20)
    args = parse_args(parser, argv, {"workers": 5, "window": 2.0, "wakes": 2})
    reason = no_cluster() or pgbouncer.missing()
    if reason:
        print(f"pooler: skipped ({reason})")
        emit("pooler", {"skipped": reason})
        return
    print(f"pooler: {args.workers} idle workers, through PgBouncer (transaction mode, server"
          f" max_connections {POOLED_MAX_CONNECTIONS}) and direct")  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    pooled_server = server(POOLED_MAX_CONNECTIONS)
    try:
        dsn = pooled_server.primary.dsn()
        migrate(dsn)
        settings = {"max_client_conn": str(args.workers + 100)}
        with pgbouncer.Bouncer(dsn, "transaction", settings=settings) as bouncer:
            results["pooled"] = await measure(
                "pooled", bouncer.dsn(dsn), dsn, args.workers, args.window, args.wakes
            )
    finally:
        pooled_server.close()
    direct_server = server(args.workers + 50)
    try:
        dsn = direct_server.primary.dsn()
        migrate(dsn)
        results["direct"] = await measure("direct", dsn, dsn, args.workers, args.window, args.wakes)
    finally:
        direct_server.close()
    emit(
        "pooler",
        {
            "workers": args.workers,
            "pooled_max_connections": POOLED_MAX_CONNECTIONS,
            **{f"{mode}_{k}": v for mode, figures in results.items() for k, v in figures.items()},
        },
    )


def _stop_on_sigterm(*_: object) -> None:
    raise SystemExit(143)  # so that the servers are removed on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    asyncio.run(main())
