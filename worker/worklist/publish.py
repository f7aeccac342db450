"""Publishers: announce work that is already stored, after its COMMIT, never instead of it.

A placement is written first and announced second. If an announcement fails the work still
exists and the next reader finds it; an announcement sent before the write could name work that
nobody can look up. So a publisher's failure is logged and counted
(``inturn_worklist_publish_failures_total``) and never raised to the caller.

Usage, for a caller with its own transaction::

    async with conn.transaction():
        ...  # the caller's own writes
        placement = await worklist.place(conn, queue=..., ...)
    await worklist.announce([placement], publishers)   # after COMMIT returned
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from inturn.worker.store.worklist_model import Placement, WorklistItem
from inturn.worker.worklist.metrics import PLACEMENTS, PUBLISH_FAILURES

log = logging.getLogger("inturn.worklist.publish")


class Publisher(Protocol):
    """Something to tell that a worklist item was created (a broker, a webhook, a channel).

    Attributes:
        name: a short label for logs and the failure counter (``notify``, ``webhook``, ``nats``).
    """

    name: str

    async def publish(self, item: WorklistItem) -> None:
        """Announce one committed item. May raise; :func:`announce` logs and counts it."""

    async def close(self) -> None:
        """Release connections. Called once when the process is done announcing."""


async def announce(placements: Iterable[Placement], publishers: Sequence[Publisher] = ()) -> int:
    """Count and announce every placement that created an item, to every publisher.

    Call only after the transaction that placed them has committed. Repeat placements
    (``created`` False) are not announced. Publishers run concurrently per item; a failing
    one is logged (item id, queue and reason only: never details) and counted.

    Returns:
        The number of failed announcements.
    """
    failures = 0
    for placement in placements:
        if not placement.created:
            continue
        item = placement.item
        PLACEMENTS.labels(item.queue, item.reason).inc()
        if not publishers:
            continue
        results = await asyncio.gather(
            *(p.publish(item) for p in publishers), return_exceptions=True
        )
        for publisher, result in zip(publishers, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                failures += 1
                PUBLISH_FAILURES.labels(publisher.name).inc()
                log.warning(
                    "publisher %s failed to announce worklist item %d (%s/%s): %s",
                    publisher.name,
                    item.id,
                    item.queue,
                    item.reason,
                    str(result).splitlines()[0] if str(result) else type(result).__name__,
                )
    return failures
