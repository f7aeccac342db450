"""HTTP sender: POST one message to a URL; any 2xx status is acceptance.

One ``aiohttp.ClientSession`` (and so one connection pool) is kept for the sender's life and
released by ``close()``. Redirects are not followed: a 3xx is reported like any other non-2xx.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
from yarl import URL

from ..config import HttpSenderConfig
from ..hl7.terminators import normalise_terminators
from .base import DeliveryError
from .tls import client_context

#: Content-Type sent unless the configured headers name one.
DEFAULT_CONTENT_TYPE = "application/hl7-v2"


def read_headers_file(path: str) -> dict[str, str]:
    """Read ``Name: value`` lines (blank lines and ``#`` comments skipped).

    Raises:
        OSError: the file cannot be read.
        ValueError: a line has no colon or an empty name (the message names the line number,
            never its content, which may be a credential).
    """
    headers: dict[str, str] = {}
    text = Path(path).read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, colon, value = stripped.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"{path}:{number}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


class HttpSender:
    """Implements :class:`inturn.worker.senders.base.Sender` with HTTP POST.

    Args:
        config: URL, extra headers, optional headers file (re-read on every send, so rotated
            credentials are picked up) and optional TLS (verification is on by default).
        timeout_seconds: optional bound of one request; when it passes,
            ``DeliveryError("timeout", ...)`` is raised. None leaves bounding to the caller.

    Failures raise :class:`DeliveryError` with outcome ``http`` (detail ``HTTP 503 Service
    Unavailable``; the response body is never included) or ``connection`` (refused, reset,
    DNS, TLS, an unreadable headers file).
    """

    def __init__(self, config: HttpSenderConfig, *, timeout_seconds: float | None = None) -> None:
        self.config = config
        self.timeout_seconds = timeout_seconds
        self._ssl: ssl.SSLContext | bool = (
            client_context(config.tls) if config.tls is not None else True
        )
        self._session: aiohttp.ClientSession | None = None

    def describe(self) -> str:
        """The URL without user info, query or fragment (they may hold credentials)."""
        url = URL(self.config.url)
        return str(url.with_user(None).with_query(None).with_fragment(None))

    def _headers(self) -> dict[str, str]:
        headers = dict(self.config.headers)
        if self.config.headers_file:
            try:
                headers.update(read_headers_file(self.config.headers_file))
            except (OSError, ValueError) as exc:
                raise DeliveryError("connection", f"headers file: {exc}") from None
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = DEFAULT_CONTENT_TYPE
        return headers

    async def send(self, payload: bytes) -> None:
        """POST ``payload``; return on 2xx.

        The body is ``normalise_terminators(payload)``, the same bytes every sender sends: the
        stored bytes themselves for every message stored by ingest (it stores them normalised).

        Raises:
            DeliveryError: ``http`` for a non-2xx status, ``connection`` for transport
                failures, ``timeout`` when ``timeout_seconds`` passes.
        """
        headers = self._headers()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        tls = self.config.tls
        server_hostname = tls.server_name if tls is not None and tls.server_name else None
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with self._session.post(
                    self.config.url,
                    data=normalise_terminators(payload),
                    headers=headers,
                    ssl=self._ssl,
                    server_hostname=server_hostname,
                    allow_redirects=False,
                ) as response:
                    await response.read()
                    if not 200 <= response.status < 300:
                        reason = response.reason or ""
                        raise DeliveryError("http", f"HTTP {response.status} {reason}".strip())
        except TimeoutError:
            raise DeliveryError(
                "timeout", f"no response within {self.timeout_seconds:g}s"
            ) from None
        except aiohttp.ClientResponseError as exc:
            raise DeliveryError("http", f"HTTP {exc.status} {exc.message}".strip()) from None
        except (aiohttp.ClientError, OSError) as exc:
            text = str(exc) or type(exc).__name__
            raise DeliveryError("connection", f"{type(exc).__name__}: {text}") from None

    async def close(self) -> None:
        """Close the session and its pooled connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
