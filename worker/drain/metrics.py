"""Prometheus metrics of the worker, as an :class:`~inturn.worker.drain.observer.Observer`.

All metrics live in prometheus-client's default registry, so several workers in one process
(``inturn local``) share them, told apart by the ``destination`` label.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

DELIVERED = Counter("inturn_delivered", "Messages accepted by their receiver.", ["destination"])
RETRIES = Counter(
    "inturn_retries",
    "Failed attempts that will be retried, by cause class.",
    ["destination", "cause"],
)
GAVE_UP = Counter(
    "inturn_gave_up", "Messages marked failed, by cause class.", ["destination", "cause"]
)
DELIVERY_WAIT = Histogram(
    "inturn_delivery_wait_seconds",
    "Seconds from enqueue to delivery.",
    ["destination"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400, 86400),
)
ATTEMPT_SECONDS = Histogram(
    "inturn_attempt_seconds",
    "Seconds one attempt took, from the start of the send to its outcome (the receiver's"
    " acknowledgement, a refusal, a timeout or a lost connection), by outcome: 'delivered' or"
    " the failure's cause class.",
    ["destination", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PENDING = Gauge("inturn_queue_pending", "Messages waiting.", ["destination"])
OLDEST = Gauge(
    "inturn_queue_oldest_age_seconds", "Age of the oldest waiting message.", ["destination"]
)
#: Wall-clock time (seconds since the epoch) the oldest waiting message of each destination was
#: enqueued, as last measured; None when nothing waits. The age gauge is computed from it when
#: scraped, so it keeps growing between two depth queries without a query of its own.
_OLDEST_SINCE: dict[str, float | None] = {}
MAX_ATTEMPTS = Gauge(
    "inturn_queue_max_attempts", "Highest attempt count among waiting messages.", ["destination"]
)
HELD = Gauge(
    "inturn_destination_held",
    "1 while the destination's delivery is suspended (queue suspend, the console, a restore"
    " found, or spec.suspend): nothing is sent, and the queue gauges still count what waits.",
    ["destination"],
)
LOCK_HELD = Gauge(
    "inturn_lock_held", "1 while this process holds the destination's lock.", ["destination"]
)
STEP_FAILURES = Counter(
    "inturn_store_step_failures",
    "Statements of the worker's loop that failed on a live session and were repeated, by step"
    " (session, head, attempt, mark, give_up).",
    ["destination", "step"],
)
LOCK_WAIT = Counter(
    "inturn_lock_wait_seconds",
    "Seconds the worker's statements waited on locks held by other sessions (waits longer"
    " than the lock-wait threshold, counted whole).",
    ["destination"],
)

LANES_SENDING = Gauge(
    "inturn_lanes_sending",
    "Lanes sending a message now (spec.lanes.count above 1).",
    ["destination"],
)
LANES_WAITING = Gauge(
    "inturn_lanes_waiting",
    "Messages of the lanes' window that wait for an earlier message of a patient they name, a"
    " barrier, or their own backoff (spec.lanes.count above 1).",
    ["destination"],
)
LANES_WINDOW_FULL = Gauge(
    "inturn_lanes_window_full",
    "1 while the lanes' window (spec.lanes.window) is full of waiting messages: messages past"
    " it cannot go until it moves.",
    ["destination"],
)


#: Every metric above: each is labelled by ``destination`` first, and by at most one more label.
BY_DESTINATION: tuple[Any, ...] = (
    DELIVERED,
    RETRIES,
    GAVE_UP,
    DELIVERY_WAIT,
    ATTEMPT_SECONDS,
    PENDING,
    OLDEST,
    MAX_ATTEMPTS,
    HELD,
    LOCK_HELD,
    STEP_FAILURES,
    LOCK_WAIT,
    LANES_SENDING,
    LANES_WAITING,
    LANES_WINDOW_FULL,
)


def _label_sets(metric: Any, destination: str) -> set[tuple[str, ...]]:
    """The label values of ``metric``'s series for ``destination``, read from what it exports:
    ``destination`` and the one other label of :data:`BY_DESTINATION`'s metrics, if any (a
    histogram's buckets carry ``le`` beside them, left out)."""
    found: set[tuple[str, ...]] = set()
    for family in metric.collect():
        for sample in family.samples:
            if sample.labels.get("destination") == destination:
                rest = [v for k, v in sample.labels.items() if k not in ("destination", "le")]
                found.add((destination, *rest))
    return found


def _oldest_age(destination: str) -> float:
    since = _OLDEST_SINCE.get(destination)
    return 0.0 if since is None else max(0.0, time.time() - since)


class PrometheusObserver:
    """Drives the metrics above from the worker's events.

    The labelled children of the per-message metrics are looked up once per label set and
    kept (a worker has one destination and a handful of outcomes), not on every message.
    """

    _children: dict[tuple[object, tuple[str, ...]], Any] | None = None

    def _child(self, metric: Any, *labels: str) -> Any:
        children = self._children
        if children is None:
            children = self._children = {}
        key = (metric, labels)
        child = children.get(key)
        if child is None:
            child = children[key] = metric.labels(*labels)
        return child

    def delivered(self, destination: str, attempts: int, waited_seconds: float) -> None:
        """Count a delivery and observe its wait."""
        self._child(DELIVERED, destination).inc()
        self._child(DELIVERY_WAIT, destination).observe(waited_seconds)

    def attempted(self, destination: str, outcome: str, seconds: float) -> None:
        """Observe an attempt's duration."""
        self._child(ATTEMPT_SECONDS, destination, outcome).observe(seconds)

    def retried(self, destination: str, attempts: int, cause: str) -> None:
        """Count a retried failure by cause class."""
        RETRIES.labels(destination, cause).inc()

    def gave_up(self, destination: str, attempts: int, cause: str) -> None:
        """Count a give-up by cause class."""
        GAVE_UP.labels(destination, cause).inc()

    def depth(
        self, destination: str, pending: int, oldest_seconds: float, max_attempts: int
    ) -> None:
        """Set the queue gauges."""
        PENDING.labels(destination).set(pending)
        if destination not in _OLDEST_SINCE:
            OLDEST.labels(destination).set_function(lambda: _oldest_age(destination))
        _OLDEST_SINCE[destination] = time.time() - oldest_seconds if pending else None
        MAX_ATTEMPTS.labels(destination).set(max_attempts)

    def held(self, destination: str, held: bool) -> None:
        """Set the hold gauge."""
        HELD.labels(destination).set(1 if held else 0)

    def lock(self, destination: str, held: bool) -> None:
        """Set the lock gauge."""
        LOCK_HELD.labels(destination).set(1 if held else 0)

    def step_failed(self, destination: str, step: str) -> None:
        """Count a step repeated on a live session."""
        STEP_FAILURES.labels(destination, step).inc()

    def lock_wait(self, destination: str, seconds: float) -> None:
        """Count seconds of lock waiting."""
        LOCK_WAIT.labels(destination).inc(max(seconds, 0.0))

    def forget(self, destination: str) -> None:
        """Remove every series of ``destination`` from ``/metrics``: its worker is gone for good
        (its manifest removed from ``inturn local``), so its last queue depth, hold and lock
        values are no longer true and must not keep alerts firing. A destination added again
        starts its series afresh (counters from 0, as a new pod's would)."""
        for metric in BY_DESTINATION:
            for labels in _label_sets(metric, destination):
                metric.remove(*labels)
        _OLDEST_SINCE.pop(destination, None)
        if self._children:
            for key in [k for k in self._children if k[1][:1] == (destination,)]:
                del self._children[key]

    def lanes(self, destination: str, sending: int, waiting: int, window_full: bool) -> None:
        """Set the lanes' gauges."""
        LANES_SENDING.labels(destination).set(sending)
        LANES_WAITING.labels(destination).set(waiting)
        LANES_WINDOW_FULL.labels(destination).set(1 if window_full else 0)
