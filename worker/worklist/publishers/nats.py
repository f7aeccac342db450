"""Announce worklist items on NATS (core publish, with nats-py).

Each item is published as the JSON of ``WorklistItem.to_json()`` on
``<subject_prefix>.<queue>`` (default ``inturn.worklist.delivery-failed`` and so on), so a
subscriber can take one queue or all (``inturn.worklist.>``). After publishing, the client
flushes: the call returns once the server has the message (NATS protocol PING/PONG).
"""

from __future__ import annotations

import json

import nats
from nats.aio.client import Client

from inturn.worker.store.worklist_model import WorklistItem

#: Default subject prefix.
SUBJECT_PREFIX = "inturn.worklist"


def subject(prefix: str, item: WorklistItem) -> str:
    """The subject an item is published on: ``<prefix>.<queue>``."""
    return f"{prefix}.{item.queue}"


class NatsPublisher:
    """Publishes on a NATS server, connecting on first use.

    Args:
        servers: NATS URL(s), e.g. ``nats://127.0.0.1:4222``.
        subject_prefix: subjects are ``<prefix>.<queue>``.
        timeout_seconds: limit for connecting and for each flush.
    """

    name = "nats"

    def __init__(
        self,
        servers: str | list[str],
        *,
        subject_prefix: str = SUBJECT_PREFIX,
        timeout_seconds: float = 5.0,
    ) -> None:
        self.servers = servers
        self.subject_prefix = subject_prefix
        self.timeout_seconds = timeout_seconds
        self._client: Client | None = None

    async def publish(self, item: WorklistItem) -> None:
        """Publish one item and wait until the server has it.

        Raises:
            nats.errors.Error, OSError, TimeoutError: not connected, or no answer in time.
        """
        if self._client is None or self._client.is_closed:
            self._client = await nats.connect(
                self.servers,
                connect_timeout=self.timeout_seconds,
                allow_reconnect=True,
                max_reconnect_attempts=3,
            )
        body = json.dumps(item.to_json(), separators=(",", ":")).encode()
        await self._client.publish(subject(self.subject_prefix, item), body)
        await self._client.flush(timeout=max(1, round(self.timeout_seconds)))

    async def close(self) -> None:
        """Drain and close the connection."""
        if self._client is not None and not self._client.is_closed:
            await self._client.close()
        self._client = None
