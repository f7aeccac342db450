"""Order expectations (``spec.replies``) in the store: what the sweeper's orders pack writes.

The worker records expectations in its delivered mark (:func:`inturn.worker.store.queue.
succeeded_next`) and ingest answers them in its store statement; the rule's reads are in
``sql/order_rules.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store.queries import load

Q = load("order_rules.sql")


async def mark_raised(conn: AsyncConnection[Any], ids: Sequence[int]) -> None:
    """Record that these expectations were placed on a worklist (in the caller's transaction):
    the due scan skips them from now on."""
    await conn.execute(Q["mark_raised"], {"ids": list(ids)})
