"""HTTP sender: POST one message to a URL; any 2xx status is acceptance (``spec.sender.http``).

One ``aiohttp.ClientSession`` (and so one connection pool) is kept for the sender's life and
released by ``close()``; it is made by :func:`inturn.worker.senders.outbound.client_session`,
like every outbound HTTP client. Redirects are not followed: a 3xx is reported like any other
non-2xx.
aiohttp is imported by the sender itself, so a worker of another kind never loads it (about
12 MiB of a worker's memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inturn.worker import tracing
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders import shape
from inturn.worker.senders import tls as tls_node
from inturn.worker.senders.base import DeliveryError, FailureCause
from inturn.worker.senders.kind import SecretFile, SenderConfig, SenderKind
from inturn.worker.senders.tls import TlsConfig, client_context
from inturn.worker.spec.openapi import (
    DNS_SUBDOMAIN,
    SECRET_KEY,
    Schema,
    integer,
    obj,
    str_map,
    string,
)

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("inturn.senders.http")

#: Content-Type sent unless the configured headers name one.
DEFAULT_CONTENT_TYPE = "application/hl7-v2"
#: Default Secret key of the header lines (credentials).
DEFAULT_HEADERS_KEY = "headers"
#: Default most bytes of a response body read (the same bound as an MLLP ACK's maxAckBytes).
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
_CHUNK_BYTES = 64 * 1024


def with_charset(content_type: str, charset: str) -> str:
    """``content_type`` with its ``charset`` parameter naming ``charset`` (one it had is
    replaced; other parameters kept), e.g. ``application/hl7-v2; charset=ISO-8859-1``.
    Source: RFC 9110 section 8.3 (media type parameters, names case-insensitive)."""
    kept = [
        part.strip()
        for part in content_type.split(";")[1:]
        if part.strip() and part.split("=", 1)[0].strip().lower() != "charset"
    ]
    return "; ".join([content_type.split(";", 1)[0].strip(), *kept, f"charset={charset}"])


def read_headers_file(path: str) -> dict[str, str]:
    """Read ``Name: value`` lines (blank lines and ``#`` comments skipped).

    Raises:
        OSError: the file cannot be read.
        ValueError: a line has no colon or an empty name (the message names the line number,
            never its content, which may be a credential), or a header cannot be sent
            (:func:`inturn.worker.senders.shape.header_problems`: the name, never the value).
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
    problems = shape.header_problems(headers, where=f"{path}: header")
    if problems:
        raise ValueError(problems[0])
    return headers


class HttpSender:
    """Implements :class:`inturn.worker.senders.base.Sender` with HTTP POST.

    Args:
        config: URL, extra headers, optional headers file (re-read on every send, so rotated
            credentials are picked up) and optional TLS (verification is on by default).
        timeout_seconds: optional bound of one request; when it passes,
            ``DeliveryError("timeout", ...)`` is raised. None leaves bounding to the caller.

    A POST on a kept-alive connection that fails before any response (the receiver had closed
    it) is made once more at once on a fresh connection, inside the same ``send``: no attempt is
    counted and no backoff paid; the receiver gets at most one duplicate.

    Failures raise :class:`DeliveryError` with outcome ``http`` (detail ``HTTP 503 Service
    Unavailable``; the response body is never included), ``unreachable`` (refused, DNS, TLS
    handshake, reset or closed before any response, an unreadable headers file, a timeout
    before the request was written: nothing was heard about this message), ``timeout`` (no
    response within ``timeout_seconds`` after the request was written) or ``connection`` (the
    connection broke while the response was being read).
    """

    def __init__(self, config: HttpSenderConfig, *, timeout_seconds: float | None = None) -> None:
        self.config = config
        self.timeout_seconds = timeout_seconds
        self._ssl: ssl.SSLContext | bool = (
            client_context(config.tls) if config.tls is not None else True
        )
        self._session: aiohttp.ClientSession | None = None
        self._posted = 0
        #: Posts repeated at once on a fresh connection after a kept one failed (diagnostics).
        self.fresh_retries = 0
        #: The last send wrote its request headers (see ``Sender.written``).
        self.written = False
        #: The charset of every body when a receiver profile converts it (an IANA name, set by
        #: :func:`inturn.worker.senders.registry.make_sender`): named in the Content-Type.
        self.body_charset: str | None = None
        self._responded = False

    def describe(self) -> str:
        """The URL without user info, query or fragment (they may hold credentials)."""
        return public_url(self.config.url)

    def _headers(self) -> dict[str, str]:
        headers = dict(self.config.headers)
        if self.config.headers_file:
            try:
                headers.update(read_headers_file(self.config.headers_file))
            except (OSError, ValueError) as exc:
                raise DeliveryError("unreachable", f"headers file: {exc}") from None
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = DEFAULT_CONTENT_TYPE
        if self.body_charset is not None:
            for name, value in headers.items():
                if name.lower() == "content-type":
                    headers[name] = with_charset(value, self.body_charset)
        tracing.inject(headers)  # the attempt's W3C traceparent, when tracing is on
        return headers

    async def send(self, payload: bytes, *, item_id: int = 0) -> None:
        """POST ``payload``; return on 2xx.

        The body is ``normalise_terminators(payload)``, the same bytes every sender sends: the
        stored bytes themselves for every message stored by ingest (it stores them normalised).

        Raises:
            DeliveryError: see the class docstring.
        """
        import aiohttp

        self.written = self._responded = False
        headers = self._headers()
        tls = self.config.tls
        server_hostname = tls.server_name if tls is not None and tls.server_name else None
        body = normalise_terminators(payload)
        try:
            async with asyncio.timeout(self.timeout_seconds):
                reused = self._session is not None and not self._session.closed and self._posted > 0
                try:
                    await self._post(body, headers, server_hostname)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    if not reused:
                        raise
                    # A kept-alive connection the receiver had closed: once, at once, on a
                    # fresh one (no attempt counted, no backoff; at most one duplicate).
                    await self.close()
                    self.fresh_retries += 1
                    log.info(
                        "%s: kept connection failed before any response (%s); posting again",
                        self.describe(),
                        type(exc).__name__,
                    )
                    await self._post(body, headers, server_hostname)
        except TimeoutError:
            if not self.written:
                raise DeliveryError(
                    "unreachable", f"no connection within {self.timeout_seconds:g}s"
                ) from None
            raise DeliveryError(
                "timeout", f"no response within {self.timeout_seconds:g}s"
            ) from None
        except aiohttp.ClientResponseError as exc:
            raise DeliveryError("http", f"HTTP {exc.status} {exc.message}".strip()) from None
        except (aiohttp.ClientError, OSError) as exc:
            text = str(exc) or type(exc).__name__
            cause: FailureCause = "connection" if self._responded else "unreachable"
            raise DeliveryError(cause, f"{type(exc).__name__}: {text}") from None

    async def probe(self) -> bool:
        """Whether the receiver accepts a connection now: TCP to the URL's host and port, and
        the TLS handshake for ``https`` (with this sender's TLS settings), sending nothing (no
        request: a probe must never be a delivery). Bound it with a timeout: a connect may hang
        as long as the network lets it."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.config.url)
        secure = parts.scheme == "https"
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if secure else 80)
        except ValueError:
            return False
        tls = self.config.tls
        context: ssl.SSLContext | None = None
        if secure:
            context = (
                self._ssl if isinstance(self._ssl, ssl.SSLContext) else ssl.create_default_context()
            )
        try:
            _, writer = await asyncio.open_connection(
                host,
                port,
                ssl=context,
                server_hostname=(tls.server_name if tls and tls.server_name else host)
                if context
                else None,
            )
        except (OSError, ssl.SSLError):
            return False
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
        return True

    async def _post(
        self, body: bytes, headers: dict[str, str], server_hostname: str | None
    ) -> None:
        """One POST on the session's pool (a new session after a close)."""
        import aiohttp

        from inturn.worker.senders.outbound import client_session

        if self._session is None or self._session.closed:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(self._on_headers_sent)
            # each send is bounded by timeout_seconds (or the caller), not by the session
            self._session = client_session(
                timeout=aiohttp.ClientTimeout(total=None), trace_configs=[trace]
            )
            self._posted = 0
        async with self._session.post(
            self.config.url,
            data=body,
            headers=headers,
            ssl=self._ssl,
            server_hostname=server_hostname,
            allow_redirects=False,
        ) as response:
            self._responded = True
            self._posted += 1
            await _drain_body(response, self.config.max_response_bytes)
            if not 200 <= response.status < 300:
                reason = response.reason or ""
                raise DeliveryError("http", f"HTTP {response.status} {reason}".strip())

    async def _on_headers_sent(self, *_: object) -> None:
        self.written = True

    async def close(self) -> None:
        """Close the session and its pooled connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


async def _drain_body(response: aiohttp.ClientResponse, limit: int) -> int:
    """Read and drop the response body, at most ``limit`` bytes, 64 KiB at a time; past the
    limit the connection is closed instead of read to the end (the status alone decides the
    outcome). Returns the bytes read. The body is never held: a receiver answering with 256 MiB
    costs one 64 KiB buffer, not 256 MiB of the worker's memory."""
    read = 0
    while chunk := await response.content.read(min(_CHUNK_BYTES, limit - read + 1)):
        read += len(chunk)
        if read > limit:
            log.info("HTTP response body over %d bytes: not read further", limit)
            response.close()
            break
    return read


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment (they may hold credentials), at most 2048
    characters."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url[:256]
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    path = path.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}://{authority}{slash}{path}"[:2048]


# --- the kind: spec.sender.http ---------------------------------------------------------------


@dataclass(frozen=True)
class HttpSenderConfig(SenderConfig):
    """An HTTP receiver: the payload is POSTed to ``url``; 2xx is success.

    ``headers`` are sent with every request; ``headers_file`` optionally names a mounted Secret
    file of ``Name: value`` lines (credentials) added to them.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    headers_file: str | None = None
    tls: TlsConfig | None = None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES


class HttpKind(SenderKind[HttpSenderConfig]):
    """``spec.sender.http``: deliver by HTTP POST (:class:`HttpSender`)."""

    name = "http"
    config_type = HttpSenderConfig

    @staticmethod
    def _common() -> dict[str, Schema]:
        return {
            "url": string(
                "URL the message is POSTed to; a 2xx answer means accepted.",
                max_length=2048,
                min_length=8,
                pattern=r"^https?://[^\s]+$",
            ),
            "headers": str_map(
                "Extra request headers (not secret; put credentials in secretRef). Names are"
                " HTTP tokens, values hold no control character (CR, LF, NUL, ...); framing"
                " headers (Content-Length, Transfer-Encoding, Host, Connection, ...) are the"
                " sender's own.",
                max_properties=32,
                max_value=4096,
                value_pattern=shape.HEADER_VALUE_PATTERN,
            ),
            "maxResponseBytes": integer(
                "Most bytes of a response body read (and dropped; only the status counts);"
                " past it the connection is closed.",
                minimum=0,
                maximum=16 * 1024 * 1024,
                default=DEFAULT_MAX_RESPONSE_BYTES,
            ),
        }

    def spec_schema(self) -> Schema:
        """URL, headers, a Secret of header lines by reference, optional TLS."""
        secret_ref = obj(
            {
                "name": string(
                    "Name of a Secret in the Destination's namespace.",
                    max_length=253,
                    min_length=1,
                    pattern=DNS_SUBDOMAIN,
                ),
                "key": string(
                    "Key holding 'Name: value' header lines, e.g. an Authorization header.",
                    max_length=253,
                    min_length=1,
                    pattern=SECRET_KEY,
                    default=DEFAULT_HEADERS_KEY,
                ),
            },
            required=("name",),
            description="Credentials: a Secret key of header lines added to every request.",
        )
        return obj(
            {**self._common(), "secretRef": secret_ref, "tls": tls_node.spec_schema()},
            required=("url",),
            description="Deliver by HTTP POST.",
        )

    def worker_schema(self) -> Schema:
        """As :meth:`spec_schema`, with the header lines and TLS files as paths."""
        headers_file = string(
            "Path of a file of 'Name: value' header lines (a mounted Secret key).",
            max_length=4096,
            min_length=1,
        )
        return obj(
            {**self._common(), "headersFile": headers_file, "tls": tls_node.worker_schema()},
            required=("url",),
            description="Deliver by HTTP POST.",
        )

    def render(self, spec: Mapping[str, Any], secret_file: SecretFile) -> dict[str, Any]:
        """URL and headers as they are; the header Secret key and TLS files as paths."""
        out: dict[str, Any] = {
            "url": spec["url"],
            "headers": dict(spec.get("headers", {})),
            "maxResponseBytes": spec.get("maxResponseBytes", DEFAULT_MAX_RESPONSE_BYTES),
        }
        ref = spec.get("secretRef")
        if ref:
            out["headersFile"] = secret_file(ref["name"], ref.get("key", DEFAULT_HEADERS_KEY))
        tls = tls_node.render(spec.get("tls"), secret_file)
        return out if tls is None else {**out, "tls": tls}

    def from_dict(self, doc: Mapping[str, Any]) -> HttpSenderConfig:
        """The configuration of a rendered ``http`` node."""
        return HttpSenderConfig(
            url=doc["url"],
            headers=dict(doc.get("headers", {})),
            headers_file=doc.get("headersFile"),
            tls=tls_node.from_dict(doc.get("tls")),
            max_response_bytes=int(doc.get("maxResponseBytes", DEFAULT_MAX_RESPONSE_BYTES)),
        )

    def to_dict(self, config: HttpSenderConfig) -> dict[str, Any]:
        """The rendered ``http`` node of ``config``."""
        out: dict[str, Any] = {
            "url": config.url,
            "headers": dict(config.headers),
            "maxResponseBytes": config.max_response_bytes,
        }
        if config.headers_file is not None:
            out["headersFile"] = config.headers_file
        tls = tls_node.to_dict(config.tls)
        return out if tls is None else {**out, "tls": tls}

    def secret_keys(self, spec: Mapping[str, Any]) -> dict[str, set[str]]:
        """The header Secret's key and the TLS Secret's keys."""
        out = tls_node.secret_keys(spec.get("tls"))
        ref = spec.get("secretRef")
        if ref:
            out.setdefault(ref["name"], set()).add(ref.get("key", DEFAULT_HEADERS_KEY))
        return out

    def summary(self, spec: Mapping[str, Any]) -> str:
        """The URL without user info, query or fragment."""
        return public_url(str(spec.get("url", "")))

    def files(self, config: HttpSenderConfig) -> Iterable[str]:
        """The headers file of a ``secretRef`` and the TLS PEM files. The headers file is read
        again on every send (a rotated Secret takes effect), but it must be there at start: a
        missing one would otherwise show only at the first delivery, as a failure."""
        tls = list(config.tls.files()) if config.tls is not None else []
        return [config.headers_file, *tls] if config.headers_file else tls

    def secret_files(self, config: HttpSenderConfig) -> Iterable[str]:
        """The headers file (credentials) and the TLS client key."""
        key = config.tls.key_file if config.tls is not None else None
        return [p for p in (config.headers_file, key) if p]

    def problems(self, node: Mapping[str, Any]) -> list[str]:
        """The URL (scheme, host, port), every header (an HTTP token for a name, not one the
        sender sets itself, no control character in a value) and the TLS server name
        (:mod:`inturn.worker.senders.shape`)."""
        return [
            *shape.field("url", shape.url_problem(node.get("url"))),
            *shape.header_problems(node.get("headers", {})),
            *tls_node.problems(node.get("tls")),
        ]

    def build(self, config: HttpSenderConfig) -> HttpSender:
        """An :class:`HttpSender` (loads the TLS files now, aiohttp at the first send).

        Raises:
            ValueError: :meth:`problems` finds one, a line of the headers file cannot be sent
                (:func:`read_headers_file`), or the TLS files are unusable.
            OSError: the headers file or a TLS file cannot be read.
        """
        self.refuse_shape(config)
        if config.headers_file is not None:  # its content is the Secret's: checked at start
            read_headers_file(config.headers_file)
        return HttpSender(config)


KIND = HttpKind()
