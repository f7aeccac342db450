"""Prometheus metrics of the worklists (prometheus-client's default registry)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from inturn.worker.worklist.model import CountRow

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
