"""The worker's HTTP endpoints on one port: ``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` answers 200 while the process is alive and every worker's loop keeps turning (a
wedged loop makes Kubernetes restart the pod); ``/readyz`` answers 200 while every worker holds
its lock and reached the database; ``/metrics`` is prometheus-client's text exposition.
Served with aiohttp.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inturn.worker.runner import DestinationWorker


def make_app(workers: Sequence[DestinationWorker]) -> web.Application:
    """Build the aiohttp application reporting on ``workers``."""

    async def healthz(_: web.Request) -> web.Response:
        stale = [w.destination for w in workers if not w.state.alive(w.health_window())]
        if stale:
            return web.Response(status=503, text=f"loop stalled: {', '.join(stale)}\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        waiting = [w.destination for w in workers if not w.state.ready()]
        if waiting:
            return web.Response(
                status=503, text=f"not holding the lock or no database: {', '.join(waiting)}\n"
            )
        return web.Response(text="ok\n")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving ``app`` on ``host:port`` (port 0 picks a free one); return the runner.

    Raises:
        OSError: the port is taken.
    """
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port a started runner listens on."""
    for address in runner.addresses:
        return int(address[1])
    raise RuntimeError("the HTTP server is not listening")
