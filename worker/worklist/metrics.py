"""Prometheus metrics of the worklists (prometheus-client's default registry).

The counters are incremented where placements are announced (any process that places work);
the pending gauge is refreshed by a long-running process with a database pool (ingest, which
serves ``/metrics`` on its ops port) every :data:`GAUGE_INTERVAL_SECONDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from inturn.worker.store.worklist import count
from inturn.worker.store.worklist_model import CountRow

if TYPE_CHECKING:  # the worker imports this module and opens no pool
    from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("inturn.worklist")

#: Seconds between two refreshes of the pending gauge.
GAUGE_INTERVAL_SECONDS = 30.0

PLACEMENTS = Counter(
    "inturn_worklist_placements",
    "Worklist items created (a repeat placement of a pending item is not counted).",
    ["queue", "reason"],
)
PUBLISH_FAILURES = Counter(
    "inturn_worklist_publish_failures",
    "Announcements of a committed placement that a publisher failed to deliver.",
    ["publisher"],
)
PENDING = Gauge(
    "inturn_worklist_pending", "Worklist items waiting to be cleared.", ["queue", "reason"]
)


_gauged: set[tuple[str, str]] = set()


def set_pending(rows: Iterable[CountRow]) -> None:
    """Set the pending gauges from a full count; pairs no longer counted drop to 0."""
    counts = {(r.queue, r.reason): r.items for r in rows}
    for key in _gauged - counts.keys():
        counts[key] = 0
    for (queue, reason), items in counts.items():
        PENDING.labels(queue, reason).set(items)
    _gauged.update(counts)


async def refresh_pending(pool: AsyncConnectionPool) -> None:
    """Count pending items per queue and reason once and set the gauges.

    Raises:
        psycopg.Error, psycopg_pool.PoolTimeout: the database could not answer.
    """
    async with pool.connection(timeout=10) as conn:
        set_pending(await count(conn))
