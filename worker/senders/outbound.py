"""The one construction of outbound HTTP clients: the HTTP sender, the webhook publisher,
``inturn send``, and any later one.

Every ``aiohttp.ClientSession`` inturn opens towards a peer is made by :func:`client_session`
(a test finds any made elsewhere), with:

* **no redirects followed, whatever the call says.** A session's requests are made with
  ``allow_redirects=False`` by their callers, so a 3xx is an answer like any other non-2xx;
  and should a call forget, the session's ``on_request_redirect`` hook raises
  :class:`RedirectRefused` before the next hop is requested, so neither the body nor a header
  (``Authorization``, the webhook's ``X-Inturn-Signature``) ever reaches the place a redirect
  names (RFC 9110, section 15.4: a client *may* follow; ours never does).
* **timeouts** that the caller must choose (an ``aiohttp.ClientTimeout``; there is no default,
  so no client waits forever by accident).
* **bounded responses**: status line and header lines at most :data:`MAX_LINE_BYTES`, at most
  :data:`MAX_HEADERS` headers, and a body read only through :func:`read_bounded`, which stops
  at the caller's limit.
* **no state a peer sets**: cookies are not kept (``DummyCookieJar``) and the environment's
  proxy settings are not read (``trust_env=False``).

This module imports aiohttp: import it where aiohttp is imported (inside the sender's
functions), so that a worker of another kind never loads it (about 12 MiB).
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

#: Longest status or header line of a response, in bytes (aiohttp's own default, stated).
MAX_LINE_BYTES = 8190
#: Most header fields of one response.
MAX_HEADERS = 128
_CHUNK_BYTES = 64 * 1024


class RedirectRefused(aiohttp.ClientError):
    """A response asked to be followed elsewhere (301, 302, 303, 307, 308) on a request that did
    not say ``allow_redirects=False``; inturn never follows (see the module docstring)."""


async def _refuse_redirect(
    session: aiohttp.ClientSession,
    context: object,
    params: aiohttp.TraceRequestRedirectParams,
) -> None:
    status = params.response.status
    raise RedirectRefused(f"HTTP {status}: redirects are not followed")


def client_session(
    *,
    timeout: aiohttp.ClientTimeout,
    trace_configs: Sequence[aiohttp.TraceConfig] = (),
) -> aiohttp.ClientSession:
    """A new outbound ``aiohttp.ClientSession`` (see the module docstring for its rules).

    Call it from a coroutine (aiohttp binds the session to the running loop); close the session
    when done. Requests on it pass ``allow_redirects=False``; one that does not raises
    :class:`RedirectRefused` at the first redirect, before it is followed.

    Args:
        timeout: the bounds of every request (``aiohttp.ClientTimeout``; ``total=None`` only
            where the caller bounds each request itself, as the HTTP sender does).
        trace_configs: the caller's own request hooks, kept alongside the redirect guard.
    """
    guard = aiohttp.TraceConfig()
    guard.on_request_redirect.append(_refuse_redirect)
    return aiohttp.ClientSession(
        timeout=timeout,
        trace_configs=[guard, *trace_configs],
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        max_line_size=MAX_LINE_BYTES,
        max_field_size=MAX_LINE_BYTES,
        max_headers=MAX_HEADERS,
    )


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes of ``response``'s body, 64 KiB at a time.

    Returns:
        ``(body, whole)``: the first ``limit`` bytes (or fewer), and whether that was the whole
        body. Past the limit the connection is closed instead of read to the end, so a peer
        answering with gigabytes costs ``limit`` bytes of memory and no more time.
    """
    chunks: list[bytes] = []
    read = 0
    while chunk := await response.content.read(min(_CHUNK_BYTES, limit - read + 1)):
        read += len(chunk)
        if read > limit:
            chunks.append(chunk[: len(chunk) - (read - limit)])
            response.close()
            return b"".join(chunks), False
        chunks.append(chunk)
    return b"".join(chunks), True
