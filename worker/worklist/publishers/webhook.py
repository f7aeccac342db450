"""Announce worklist items by HTTP POST of the item's JSON, with bounded retries.

Each item is one POST of ``WorklistItem.to_json()`` (``Content-Type: application/json``). With a
secret, the body is signed with HMAC-SHA256 (RFC 2104) and the signature sent as
``X-Inturn-Signature: sha256=<hex>``, so a receiver can check that the announcement is ours and
unchanged. A connection error, a timeout, 429 or a 5xx is retried with exponential backoff, at
most ``attempts`` tries in all; any other status is final. A redirect (3xx) is a final answer
too, never followed: the signed body goes nowhere but ``url``
(:mod:`inturn.worker.senders.outbound`, the one construction of outbound HTTP clients).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

import aiohttp
from aiohttp_retry import ExponentialRetry, RetryClient

from inturn.worker.errors import Unavailable
from inturn.worker.senders.outbound import client_session
from inturn.worker.store.worklist_model import WorklistItem

#: Header carrying the body's HMAC-SHA256, as ``sha256=<hex>``.
SIGNATURE_HEADER = "X-Inturn-Signature"


def sign(secret: bytes, body: bytes) -> str:
    """The signature header value of ``body``: ``sha256=`` and the hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class WebhookError(Unavailable):
    """The receiver answered with a status that is not 2xx, after the retries allowed."""


class WebhookPublisher:
    """POSTs each item to ``url``.

    Args:
        url: the receiver (http or https).
        secret: HMAC key; None sends no signature header.
        timeout_seconds: limit of one attempt, connection included.
        attempts: tries in all (1 = no retry).
        backoff_seconds: wait before the first retry; doubled each retry, at most 30 s.
    """

    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        secret: bytes | None = None,
        timeout_seconds: float = 5.0,
        attempts: int = 3,
        backoff_seconds: float = 0.5,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.url = url
        self.secret = secret
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        # aiohttp_retry waits start * factor**n before try n+1 (n >= 1): start at half the
        # first wait so that the first retry comes after backoff_seconds.
        self.retry = ExponentialRetry(
            attempts=attempts,
            start_timeout=backoff_seconds / 2,
            max_timeout=30.0,
            statuses={429},
            exceptions={aiohttp.ClientError, asyncio.TimeoutError},
        )
        self._client: RetryClient | None = None

    async def publish(self, item: WorklistItem) -> None:
        """POST one item, retrying as configured.

        Raises:
            WebhookError: the last answer was not 2xx.
            aiohttp.ClientError, TimeoutError: the last try could not connect or timed out.
        """
        if self._client is None:
            self._client = RetryClient(
                client_session=client_session(timeout=self.timeout),
                retry_options=self.retry,
            )
        body = json.dumps(item.to_json(), separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = sign(self.secret, body)
        async with self._client.post(
            self.url, data=body, headers=headers, allow_redirects=False
        ) as response:
            if not 200 <= response.status < 300:
                raise WebhookError(f"webhook answered HTTP {response.status}")

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._client is not None:
            await self._client.close()
            self._client = None
