"""A whole delivery path for integration tests: registry rows, ingest, workers, the CLI.

Tests import it as ``from tests.support.pipeline import ...``. Everything is
real: the Postgres of the test session, sockets on free ports, the ``inturn`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.kind import SenderConfig
from inturn.worker.senders.registry import make_sender
from inturn.worker.spec.config import RetryPolicy, WorkerConfig

INTURN = str(Path(sys.executable).with_name("inturn"))
FAST_RETRY = RetryPolicy(
    max_attempts=0, backoff_seconds=1, max_backoff_seconds=1, timeout_seconds=5
)


def register(
    dsn: str,
    destination: str,
    channel: str,
    message_types: Sequence[str] = (),
    sender_kind: str | None = None,
    stuck_after_seconds: int = 900,
) -> None:
    """Write one live destination into the registry, as the operator would."""
    namespace, name = destination.split("/")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel,"
            " message_types, sender_kind, stuck_after_seconds)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (destination) DO UPDATE"
            " SET channel = excluded.channel, message_types = excluded.message_types,"
            " sender_kind = excluded.sender_kind, deleted_at = NULL, updated_at = now(),"
            " stuck_after_seconds = excluded.stuck_after_seconds",
            (
                destination,
                namespace,
                name,
                channel,
                list(message_types),
                sender_kind,
                stuck_after_seconds,
            ),
        )


def rows(dsn: str, destination: str | None = None) -> list[dict[str, Any]]:
    """Every delivery row (or one destination's), oldest first, as dicts."""
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT * FROM inturn_delivery WHERE %(d)s::text IS NULL OR destination = %(d)s"
            " ORDER BY id",
            {"d": destination},
        ).fetchall()


def worker_config(destination: str, sender: SenderConfig, **changes: Any) -> WorkerConfig:
    """A worker configuration with quick retries (1 s backoff, 5 s attempts)."""
    changes.setdefault("retry", FAST_RETRY)
    changes.setdefault("idle_seconds", 1)
    return WorkerConfig(destination=destination, channel="c", sender=sender, **changes)


@contextlib.asynccontextmanager
async def worker(cfg: WorkerConfig, dsn: str) -> AsyncIterator[DestinationWorker]:
    """Run a destination worker (with its real sender) in the background until the block ends."""
    stop = asyncio.Event()
    running = DestinationWorker(cfg, dsn, make_sender(cfg.sender), PrometheusObserver())
    task = asyncio.create_task(running.run(stop))
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def until(predicate: Any, timeout: float = 20.0, every: float = 0.05) -> None:
    """Wait until ``predicate()`` (sync or async) is true; TimeoutError after ``timeout`` s."""
    async with asyncio.timeout(timeout):
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(every)


def cli(dsn: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``inturn <args> --dsn <dsn>`` as a subprocess; stdout and stderr as bytes."""
    return subprocess.run(
        [INTURN, *args, "--dsn", dsn], capture_output=True, check=check, timeout=60
    )
