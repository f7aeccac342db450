"""Ingest's HTTP side (aiohttp): messages over HTTP, health, readiness and metrics.

Routes:

* ``POST /channels/{channel}/messages``: the body is one raw HL7 v2 message, stored unchanged.
  The response body is the acknowledgement (``Content-Type: application/hl7-v2``) and the
  status tells the outcome: 200 for AA/CA, 400 for AR/CR, 503 for AE/CE. HTTP always answers,
  whatever MSH-15 says, since a request needs a response. A body over the maximum message size
  is answered 400 with an AR.
* ``GET /healthz``: 200 while the process serves requests (liveness).
* ``GET /readyz``: 200 when the routing table is loaded and fresh and the listeners are up,
  else 503 with a one-line reason (readiness; a draining ingest is not ready).
* ``GET /metrics``: Prometheus text format from the default registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from inturn.worker.ingest.accept import Acceptor
from inturn.worker.ingest.routing import check_channel

#: The media type of the ACK body.
HL7_CONTENT_TYPE = "application/hl7-v2"


def make_app(
    acceptor: Acceptor, max_body_bytes: int, readiness: Callable[[], str | None]
) -> web.Application:
    """Build the aiohttp application.

    Args:
        acceptor: stores messages and builds their answers.
        max_body_bytes: the largest message body accepted, in bytes.
        readiness: returns None when ready, else a short reason (shown by ``/readyz``).
    """
    # aiohttp refuses bodies over client_max_size itself; leave room so that we can answer
    # with an AR instead of its plain-text 413.
    app = web.Application(client_max_size=max_body_bytes + 1)

    async def post_message(request: web.Request) -> web.Response:
        channel = request.match_info["channel"]
        received = time.perf_counter()
        try:
            check_channel(channel)
        except ValueError:
            return web.Response(status=400, text="invalid channel name\n")
        if request.content_length is not None and request.content_length > max_body_bytes:
            outcome = acceptor.reject_too_large(channel, max_body_bytes)
        else:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                body = None
            if body is None or len(body) > max_body_bytes:
                outcome = acceptor.reject_too_large(channel, max_body_bytes)
            else:
                outcome = await acceptor.handle(channel, body, received)
        return web.Response(
            status=outcome.http_status,
            body=outcome.ack,
            headers={"Content-Type": HL7_CONTENT_TYPE, "X-HL7-Ack-Code": outcome.code},
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reason = readiness()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_post("/channels/{channel}/messages", post_message)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
