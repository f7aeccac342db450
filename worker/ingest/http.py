"""Ingest's HTTP side (aiohttp): the message port and the operations port.

The message port (``--http``) serves only:

* ``POST /channels/{channel}/messages``: the body is one raw HL7 v2 message, stored unchanged.
  The response body is the acknowledgement (``Content-Type: application/hl7-v2``) and the
  status tells the outcome: 200 for AA/CA, 400 for AR/CR, 503 for AE/CE (nothing was kept).
  HTTP always answers, whatever MSH-15 says, since a request needs a response. A body over the
  maximum message size is answered 413 (Content Too Large, RFC 9110 section 15.5.14) with an
  AR (ERR 104): refused, and sending it again will not help. When whether the message was
  stored cannot be known (its storing was cancelled after the store timeout and the
  cancellation's end was not seen), the answer is 504 with a plain-text reason: not 503, which
  would say nothing was kept.

  Every request is authenticated first (see :mod:`inturn.worker.ingest.credentials`), before
  its body is read or its channel looked at: no valid credential answers 401 with
  ``WWW-Authenticate: Bearer`` (RFC 6750 section 3), a credential that does not name the
  channel answers 403. Both bodies are one fixed word, nothing is stored and nothing is parsed.
  Only a process started with ``--http-insecure`` (no credentials) skips this.

The operations port (``--ops``) serves, to probes and Prometheus only:

* ``GET /healthz``: 200 while the process serves requests (liveness).
* ``GET /readyz``: 200 when the routing table is loaded and fresh and the listeners are up,
  else 503 with a one-line reason (readiness; a draining ingest is not ready).
* ``GET /metrics``: Prometheus text format from the default registry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from inturn.worker.ingest import metrics
from inturn.worker.ingest.accept import Acceptor
from inturn.worker.ingest.access import certificate_names
from inturn.worker.ingest.budget import Busy, Hold, MemoryBudget
from inturn.worker.ingest.credentials import CredentialSource
from inturn.worker.ingest.listener import DEFAULT_FRAME_DEADLINE
from inturn.worker.ingest.routing import check_channel
from inturn.worker.store.connect import pooling_notes
from inturn.worker.text import conditions

log = logging.getLogger("inturn.ingest.http")

#: Bytes read at a time from a body without Content-Length.
_CHUNK_BYTES = 64 * 1024

#: The media type of the ACK body.
HL7_CONTENT_TYPE = "application/hl7-v2"


def _peercert(request: web.Request) -> Any:
    transport = request.transport
    return transport.get_extra_info("peercert") if transport is not None else None


def _refuse(request: web.Request, status: int, reason: str, detail: str) -> web.Response:
    """Count and log a refused request; answer with one fixed word and no detail."""
    metrics.HTTP_REFUSED.labels(reason).inc()
    log.warning("HTTP %d from %s: %s", status, request.remote, detail)
    headers = {"WWW-Authenticate": 'Bearer realm="inturn"'} if status == 401 else None
    text = "unauthorized\n" if status == 401 else "forbidden\n"
    return web.Response(status=status, text=text, headers=headers)


def make_message_app(
    acceptor: Acceptor,
    max_body_bytes: int,
    credentials: CredentialSource | None,
    budget: MemoryBudget | None = None,
    body_deadline: float = DEFAULT_FRAME_DEADLINE,
) -> web.Application:
    """Build the message application.

    Args:
        acceptor: stores messages and builds their answers.
        max_body_bytes: the largest message body accepted, in bytes.
        credentials: who may post to which channel (a :class:`CredentialsFile` is looked at
            again as it changes); None accepts every request (the explicit
            ``--http-insecure`` mode).
        budget: the process's message memory, shared with the MLLP listeners: a body is read
            only as far as the budget has room for it (a declared ``Content-Length`` is
            reserved whole before the first byte is read; a chunked body chunk by chunk), and
            one that finds no room within the wait is answered 503 with an AE "busy". None
            counts nothing.
        body_deadline: seconds a body may take to arrive whole (as an MLLP frame's deadline);
            past it the answer is 408 and nothing is kept.
    """
    room = budget if budget is not None else MemoryBudget(2**62)
    # aiohttp refuses bodies over client_max_size itself; leave room so that we can answer
    # with an AR instead of its plain-text 413.
    app = web.Application(client_max_size=max_body_bytes + 1)

    async def post_message(request: web.Request) -> web.Response:
        channel = request.match_info["channel"]
        received = time.perf_counter()
        if credentials is not None:
            proven = credentials.current().authenticate(
                request.headers.get("Authorization"), certificate_names(_peercert(request))
            )
            if not proven:
                return _refuse(request, 401, "unauthenticated", "no valid credential")
            if not any(c.allows(channel) for c in proven):
                who = ", ".join(c.name for c in proven)
                return _refuse(request, 403, "forbidden", f"{who} may not post to {channel!r:.80}")
        try:
            check_channel(channel)
        except ValueError:
            return web.Response(status=400, text="invalid channel name\n")
        status: int | None = None  # the outcome's own unless the body was too large
        if request.content_length is not None and request.content_length > max_body_bytes:
            outcome, status = acceptor.reject_too_large(channel, max_body_bytes), 413
        else:
            hold = room.hold()
            try:
                try:
                    async with asyncio.timeout(body_deadline):
                        body = await _read_body(request, hold, max_body_bytes)
                except TimeoutError:
                    log.warning(
                        "HTTP from %s: body not received within %g s", request.remote, body_deadline
                    )
                    return web.Response(status=408, text="request body not received in time\n")
                if body is None:
                    outcome, status = acceptor.reject_too_large(channel, max_body_bytes), 413
                else:
                    outcome = await acceptor.handle(channel, body, received)
            except Busy as exc:
                metrics.BUSY.labels(channel).inc()
                log.warning("HTTP from %s: no memory for the message now (%s)", request.remote, exc)
                outcome = acceptor.reject_busy(channel, b"", request.content_length or 0)
            finally:
                hold.release()
        return web.Response(
            status=status or outcome.http_status,
            body=outcome.ack,
            headers={"Content-Type": HL7_CONTENT_TYPE, "X-HL7-Ack-Code": outcome.code},
        )

    app.router.add_post("/channels/{channel}/messages", post_message)
    return app


async def _read_body(request: web.Request, hold: Hold, max_body_bytes: int) -> bytes | None:
    """The request's body, read under ``hold``; None when it is over ``max_body_bytes``.

    Raises:
        Busy: the budget had no room for it in time.
    """
    if request.content_length is not None:
        await hold.grow(request.content_length)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return None
        return body if len(body) <= max_body_bytes else None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(_CHUNK_BYTES):
        size += len(chunk)
        if size > max_body_bytes:
            return None
        await hold.grow(len(chunk))
        parts.append(chunk)
    return b"".join(parts)


def make_ops_app(
    readiness: Callable[[], str | None],
    lanes: Callable[[], str] | None = None,
    dsns: Sequence[str] = (),
) -> web.Application:
    """Build the operations application (health, readiness, metrics).

    Args:
        readiness: returns None when ready, else a short reason (shown by ``/readyz``).
        lanes: the body of ``GET /lanes`` (``inturn local``: its workers' lanes); None: no
            such route.
        dsns: the databases this process uses: ``/readyz`` says which of them it reaches
            through a transaction pooler (:func:`~inturn.worker.store.connect.pooling_notes`).
    """
    app = web.Application()

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reason = readiness()
        # behind a pooler: says so; a periodic statement the database refuses now: says so
        notes = "".join(f"{note}\n" for note in [*pooling_notes(dsns), *conditions.notes()])
        if reason is None:
            return web.Response(text=f"ready\n{notes}")
        return web.Response(status=503, text=f"not ready: {reason}\n{notes}")

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    if lanes is not None:
        app.router.add_get("/lanes", lambda request: _lanes_page(lanes))
    return app


async def _lanes_page(lanes: Callable[[], str]) -> web.Response:
    return web.Response(text=lanes())
