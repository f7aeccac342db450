"""Prometheus gauges of the history and its maintenance (issue 37, migration 0034), refreshed
by ingest (which serves ``/metrics`` on its ops port) every :data:`GAUGE_INTERVAL_SECONDS`
from catalog reads (:func:`inturn.worker.store.history.status`): no table is scanned.

The two ``overdue`` gauges are what to alert on when the maintenance job (``inturn purge``,
the chart's purge CronJob) stops: a day not turned (its next partitions are no longer made
either; the open epoch's range still takes every id, so nothing is refused) and a drop
overdue (the history grows past its retention).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client import Gauge

from inturn.worker.store import history

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

#: Seconds between two refreshes.
GAUGE_INTERVAL_SECONDS = 30.0

BYTES = Gauge(
    "inturn_history_bytes",
    "Bytes on disk, indexes and TOAST included, of the hot table (part=hot: pending rows and"
    " the hot window), of the history partitions held (part=history) and of the channel log's"
    " (part=log).",
    ["part"],
)
ROWS = Gauge(
    "inturn_history_rows",
    "Rows of each part (as inturn_history_bytes), the planner's estimate.",
    ["part"],
)
DAYS = Gauge("inturn_history_days", "Days (epochs) of the log and history held, the open one too.")
OLDEST = Gauge(
    "inturn_history_oldest_seconds", "Age of the oldest day held: since it was opened, seconds."
)
EPOCH_OVERDUE = Gauge(
    "inturn_history_epoch_overdue_seconds",
    "How long past its length (inturn purge --epoch) the open day is: 0 while the maintenance"
    " job turns days on time.",
)
DROP_OVERDUE = Gauge(
    "inturn_history_drop_overdue_seconds",
    "How long past the retention the oldest day held is: 0 while the maintenance job drops"
    " days on time.",
)
LAST_RUN = Gauge(
    "inturn_maintenance_last_run_seconds",
    "Seconds since inturn purge last ran (-1: never).",
)


def set_from(status: history.Status, now: datetime) -> None:
    """Set every gauge from one :class:`~inturn.worker.store.history.Status` read at ``now``."""
    for part, rows, size in (
        ("hot", status.hot_rows, status.hot_bytes),
        ("history", status.history_rows, status.history_bytes),
        ("log", status.log_rows, status.log_bytes),
    ):
        BYTES.labels(part).set(size)
        ROWS.labels(part).set(rows)
    DAYS.set(status.epochs)
    OLDEST.set((now - status.oldest_at).total_seconds() if status.oldest_at else 0)
    EPOCH_OVERDUE.set(status.epoch_overdue_seconds(now))
    DROP_OVERDUE.set(status.drop_overdue_seconds(now))
    LAST_RUN.set((now - status.ran_at).total_seconds() if status.ran_at else -1)


async def refresh(pool: AsyncConnectionPool) -> None:
    """Read the history's status once and set the gauges.

    Raises:
        psycopg.Error, psycopg_pool.PoolTimeout: the database could not answer.
    """
    async with pool.connection(timeout=10) as conn:
        status = await history.status(conn)
    set_from(status, datetime.now(UTC))
