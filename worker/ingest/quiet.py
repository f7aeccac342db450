"""HTTP servers that never echo or log what a peer sent in a request they cannot parse.

aiohttp answers a request whose request line or a header is over its limit (8,190 bytes) or
malformed with a 400 whose text is the parser's message, and logs that message with a
traceback, once per request. The parser's message quotes the offending bytes: for an
``Authorization`` header over the limit, the first 100 bytes of the bearer token, sent back to
the peer and written to the log for every such request.

:class:`QuietAppRunner` serves an application the same way but answers such a request with a
fixed text naming only the status, and logs it as one warning line (the peer's address and the
kind of fault, never a byte of the request) at most once per peer every
:data:`LOG_INTERVAL_SECONDS`; the rest are counted in ``inturn_http_requests_malformed_total``.
Errors of the application's own handlers (500) keep aiohttp's handling.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter

log = logging.getLogger("inturn.ingest.http")

#: Seconds during which further malformed requests of one peer are counted, not logged.
LOG_INTERVAL_SECONDS = 60.0
#: Peers remembered by a throttle; when full it forgets them all (a flood of addresses logs at
#: most this many lines per interval).
THROTTLE_MAX_PEERS = 4096

MALFORMED = Counter(
    "inturn_http_requests_malformed_total",
    "HTTP requests refused before routing: a request line or header over the limit or "
    "malformed (answered without echoing them).",
    ["server", "status"],
)


class LogThrottle:
    """Says whether a line about ``key`` may be logged now: once per key every ``interval``
    seconds (monotonic clock), remembering at most ``max_keys`` keys (then all are forgotten).
    """

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS, max_keys: int = THROTTLE_MAX_PEERS):
        self.interval = interval
        self.max_keys = max_keys
        self._last: dict[Any, float] = {}

    def allow(self, key: Any) -> bool:
        """True when nothing about ``key`` was logged in the last interval (and notes now)."""
        now = time.monotonic()
        if now - self._last.get(key, -self.interval) < self.interval:
            return False
        if len(self._last) >= self.max_keys:
            self._last.clear()
        self._last[key] = now
        return True


class _QuietHandler(RequestHandler):
    """aiohttp's connection handler, with parse errors answered and logged without their text."""

    throttle: LogThrottle
    server_name: str

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            return super().handle_error(request, status, exc, message)
        MALFORMED.labels(self.server_name, str(status)).inc()
        peer = request.remote or "unknown"
        if self.throttle.allow(peer):
            log.warning(
                "%s: refused a request from %s that could not be read (%s, HTTP %d); more from"
                " this peer in the next %.0f s are only counted",
                self.server_name,
                peer,
                type(exc).__name__ if exc is not None else "malformed",
                status,
                self.throttle.interval,
            )
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot answer the bad request")
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        text = f"{status} {phrase}: the request line or a header is too long or malformed\n"
        response = web.Response(status=status, text=text, content_type="text/plain")
        response.force_close()
        return response


class _QuietServer(web.Server):
    """Makes :class:`_QuietHandler` connection handlers."""

    throttle: LogThrottle
    server_name: str

    def __call__(self) -> RequestHandler:
        handler = _QuietHandler(self, loop=self._loop, **self._kwargs)
        handler.throttle = self.throttle
        handler.server_name = self.server_name
        return handler


class QuietAppRunner(web.AppRunner):
    """A :class:`aiohttp.web.AppRunner` whose connections answer unreadable requests without
    echoing or logging their bytes (see the module docstring).

    Args:
        app: the application.
        name: what the log line and the metric call this server (``ingest-http``, ``console``).
        throttle: the per-peer log throttle (default: one line per peer per minute).
        **kwargs: as for :class:`aiohttp.web.AppRunner`.
    """

    def __init__(
        self, app: web.Application, *, name: str, throttle: LogThrottle | None = None, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self.server_name = name
        self.throttle = throttle or LogThrottle()

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _QuietServer
        quiet: Any = server
        quiet.throttle = self.throttle
        quiet.server_name = self.server_name
        return server
