"""Clearing, as ``system``, the pending items whose condition no longer holds, each with why.

A rule's stale query returns ``record_key`` and ``why`` per pending item to clear (the note a
person reads); items are cleared in one :func:`~inturn.worker.store.worklist.clear_where` per
distinct note, audited like every clear.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store.worklist import clear_where


async def clear_stale(
    conn: AsyncConnection[Any],
    rows: Iterable[Mapping[str, Any]],
    *,
    record_kind: str,
    queue: str,
    reason: str,
) -> int:
    """Clear the pending ``queue``/``reason`` items of ``rows`` (``record_key``, ``why``) by
    ``system`` with ``why`` as the note; return how many were cleared (an item cleared by
    someone meanwhile is not counted)."""
    by_why: dict[str, list[str]] = {}
    for row in rows:
        by_why.setdefault(str(row["why"]), []).append(str(row["record_key"]))
    cleared = 0
    for why, keys in sorted(by_why.items()):
        done = await clear_where(
            conn, record_kind=record_kind, record_keys=keys, queue=queue, reason=reason, note=why
        )
        cleared += len(done)
    return cleared
