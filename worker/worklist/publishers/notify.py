"""Announce worklist items with Postgres NOTIFY, for listeners on the same database."""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import worklist as store
from inturn.worker.store.connect import write_target
from inturn.worker.store.worklist_model import WorklistItem

#: Default channel name (``LISTEN inturn_worklist``).
CHANNEL = "inturn_worklist"


def notification(item: WorklistItem) -> str:
    """The NOTIFY payload: compact JSON of the item's identity, without its details.

    Shape: ``{"id", "queue", "reason", "recordKind", "recordKey", "placedAt"}``; at most about
    400 bytes, well inside Postgres's 8,000-byte payload limit. A listener reads the rest from
    the store.
    """
    return json.dumps(
        {
            "id": item.id,
            "queue": item.queue,
            "reason": item.reason,
            "recordKind": item.record_kind,
            "recordKey": item.record_key,
            "placedAt": item.placed_at.isoformat(),
        },
        separators=(",", ":"),
    )


class NotifyPublisher:
    """Sends ``pg_notify(channel, json)`` on a connection of its own, opened on first use.

    Args:
        dsn: the database to notify on (the store's).
        channel: the NOTIFY channel (default ``inturn_worklist``).
    """

    name = "notify"

    def __init__(self, dsn: str, channel: str = CHANNEL) -> None:
        self.dsn = dsn
        self.channel = channel
        self._conn: AsyncConnection[Any] | None = None

    async def publish(self, item: WorklistItem) -> None:
        """NOTIFY one item (autocommit: delivered at once).

        Raises:
            psycopg.Error: the database could not be reached; the next call reconnects.
        """
        if self._conn is None or self._conn.closed:
            self._conn = await AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                application_name="inturn-worklist-notify",
                prepare_threshold=None,  # behind a transaction pooler a prepared one would be lost
                **write_target(self.dsn),  # NOTIFY needs the primary
            )
        try:
            await store.announce(self._conn, self.channel, notification(item))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the connection, if open."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
