"""A whole delivery path for integration tests: registry rows, ingest, workers, the CLI.

Tests import it as ``from tests.support.pipeline import ...``. Everything is
real: the Postgres of the test session, sockets on free ports, the ``inturn`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.observer import Observer
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.kind import SenderConfig
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.senders.registry import make_sender
from inturn.worker.spec.config import LeaseSettings, RetryPolicy, WorkerConfig
from inturn.worker.store import lease as leases
from inturn.worker.store.model import Item
from inturn.worker.store.worklist_model import Placement
from inturn.worker.worklist.delivery_failed import give_up
from tests.support.ingest import pull_all

INTURN = str(Path(sys.executable).with_name("inturn"))
#: Retries forever, 1 s apart, each attempt bounded at 5 s.
FAST_RETRY = RetryPolicy(
    max_attempts=0, backoff_seconds=1, max_backoff_seconds=1, timeout_seconds=5
)
#: :data:`FAST_RETRY` with attempts bounded at 1 s (a silent receiver costs a second).
SHORT_ATTEMPTS = dataclasses.replace(FAST_RETRY, timeout_seconds=1)
#: Short leases (3 s, renewed every second, taken within 0.2 s of their expiry), so that a test
#: waits seconds for a takeover, not the default 45.
QUICK_LEASE = LeaseSettings(ttl_seconds=3, renew_seconds=1, acquire_seconds=0.2)


def register(
    dsn: str,
    destination: str,
    channel: str,
    message_types: Sequence[str] = (),
    sender_kind: str | None = None,
    stuck_after_seconds: int = 900,
    *,
    suspended: bool = False,
    deleted: bool = False,
) -> None:
    """Write (or overwrite) one destination of the registry, as the operator would: live
    unless ``deleted``, held if ``suspended``."""
    namespace, name = destination.split("/")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel,"
            " message_types, sender_kind, stuck_after_seconds, suspended, deleted_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, CASE WHEN %s THEN now() END)"
            " ON CONFLICT (destination) DO UPDATE"
            " SET channel = excluded.channel, message_types = excluded.message_types,"
            " sender_kind = excluded.sender_kind, suspended = excluded.suspended,"
            " deleted_at = excluded.deleted_at, updated_at = now(),"
            " stuck_after_seconds = excluded.stuck_after_seconds",
            (
                destination,
                namespace,
                name,
                channel,
                list(message_types),
                sender_kind,
                stuck_after_seconds,
                suspended,
                deleted,
            ),
        )


def rows(dsn: str, destination: str | None = None) -> list[dict[str, Any]]:
    """Every delivery row (or one destination's), oldest first, as dicts, the channel log
    pulled first (:func:`tests.support.ingest.pull_all`); ``payload`` is the row's own or its
    log row's (as stored)."""
    pull_all(dsn)
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            # the last "payload" column is the one a dict keeps
            "SELECT d.*, coalesce(d.payload, m.payload) AS payload FROM inturn_delivery d"
            " LEFT JOIN inturn_message m ON m.id = d.message_id"
            " WHERE %(d)s::text IS NULL OR d.destination = %(d)s ORDER BY d.id",
            {"d": destination},
        ).fetchall()


def worker_config(destination: str, sender: SenderConfig | int, **changes: Any) -> WorkerConfig:
    """A worker configuration for ``destination`` with quick retries (:data:`FAST_RETRY`), a
    1 s idle wait and channel ``c``; ``changes`` are more (or other) :class:`WorkerConfig`
    fields. ``sender`` is a sender configuration, or the port of an MLLP receiver on
    127.0.0.1."""
    if isinstance(sender, int):
        sender = MllpSenderConfig("127.0.0.1", sender)
    changes.setdefault("retry", FAST_RETRY)
    changes.setdefault("idle_seconds", 1)
    changes.setdefault("channel", "c")
    return WorkerConfig(destination=destination, sender=sender, **changes)


@contextlib.asynccontextmanager
async def worker(
    cfg: WorkerConfig,
    dsn: str,
    observer: Observer | None = None,
    stop_seconds: float = 15,
    **options: Any,
) -> AsyncIterator[DestinationWorker]:
    """Run a destination worker (with its real sender, a :class:`PrometheusObserver` unless
    ``observer`` is given) in the background until the block ends, then stop it and wait up
    to ``stop_seconds`` s for it (TimeoutError past that; what the worker raised, raised).
    ``options`` are more of :class:`DestinationWorker`'s keywords (``lease``, ``payloads``,
    ``lock_wait_seconds``, ``poll_seconds``, ...)."""
    stop = asyncio.Event()
    running = DestinationWorker(
        cfg,
        dsn,
        make_sender(cfg.sender, body_charset=cfg.body_charset),
        observer or PrometheusObserver(),
        **options,
    )
    task = asyncio.create_task(running.run(stop))
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_seconds)


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


async def refused(conn: AsyncConnection[Any], item: Item, attempts: int = 3) -> Placement | None:
    """Give ``item`` up as a worker does once its receiver refused it ``attempts`` times (``AR:
    no``, attempts exhausted): the failed mark and the ``delivery-failed`` item, under the
    destination's lease taken as ``test`` for 600 s; what
    :func:`inturn.worker.worklist.delivery_failed.give_up` returns."""
    lease = await leases.acquire(conn, item.destination, "test", 600)
    return await give_up(
        conn, item, attempts=attempts, cause="AR: no", outcome="AR", exhausted=True, lease=lease
    )


def control_ids(payloads: Sequence[bytes]) -> list[str]:
    """The MSH-10 of each payload (the tenth ``|`` field), in order."""
    return [p.split(b"|")[9].decode() for p in payloads]


async def count(dsn: str, state: str, destination: str | None = None) -> int:
    """How many delivery rows (of ``destination``, or of all) are in ``state``."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE state = %s"
            " AND (%s::text IS NULL OR destination = %s)",
            (state, destination, destination),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def cli(dsn: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``inturn <args> --dsn <dsn>`` as a subprocess; stdout and stderr as bytes."""
    return subprocess.run(
        [INTURN, *args, "--dsn", dsn], capture_output=True, check=check, timeout=60
    )
