"""The worker's HTTP endpoints on one port: ``/healthz``, ``/readyz``, ``/metrics`` and
``/lanes``.

``/healthz`` answers 200 while the process is alive and every worker's loop keeps turning (a
wedged loop makes Kubernetes restart the pod); ``/readyz`` answers 200 while every worker holds
its lock, reached the database, and no step is being repeated nor waits on another session's
lock (the body says why, one line per destination); ``/metrics`` is prometheus-client's text
exposition; ``/lanes`` says, for a destination with lanes, what each lane sends now and what
holds the oldest waiting message (one line per destination, as the worker sees it: the lane a
blocking message is in flight on). A worker repeating its delivered mark, or waiting on a
lock, stays alive on ``/healthz``: a restart would lose what it knows and send the message
again.

Served by the standard library's ``http.server`` on a thread of its own, not by aiohttp: three
fixed answers to probes and scrapes need no web framework, prometheus-client imports
``http.server`` anyway, and leaving aiohttp out keeps a worker about 12 MiB smaller (a worker
serves one destination, and a thousand of them run at once). The thread only reads the workers'
state, which is also what lets ``/healthz`` say 503 when the event loop itself is wedged.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.text import conditions

#: Seconds between two checks of the serving thread for a shutdown request.
POLL_SECONDS = 1.0

Answer = tuple[int, str, bytes]
"""Status code, content type and body."""

_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class App:
    """The endpoints: path -> function returning an :data:`Answer`."""

    routes: dict[str, Callable[[], Answer]]

    def answer(self, path: str) -> Answer:
        """The answer for a request path (query string ignored); 404 for other paths."""
        route = self.routes.get(path.split("?", 1)[0])
        return route() if route else (404, _TEXT, b"not found\n")


def lanes_text(workers: Sequence[DestinationWorker]) -> str:
    """The body of ``/lanes``: one line per destination of ``workers`` that has lanes (what each
    lane sends, what holds the oldest waiting message), ``no lanes`` when none has."""
    lines = [
        f"{w.destination}: {view.describe()}"
        for w in workers
        if (view := w.state.lanes) is not None
    ]
    return "\n".join(lines or ["no lanes"]) + "\n"


def make_app(workers: Sequence[DestinationWorker]) -> App:
    """Build the endpoints reporting on ``workers``."""

    def healthz() -> Answer:
        stale = [w.destination for w in workers if not w.state.alive(w.health_window())]
        if stale:
            return 503, _TEXT, f"loop stalled: {', '.join(stale)}\n".encode()
        return 200, _TEXT, b"ok\n"

    def readyz() -> Answer:
        reasons = [(w.destination, w.state.not_ready()) for w in workers]
        waiting = [f"{destination}: {why}" for destination, why in reasons if why is not None]
        notes = sorted({w.state.pooling for w in workers if w.state.pooling})
        notes += conditions.notes()  # a periodic statement the database refuses now
        if waiting:
            return 503, _TEXT, ("\n".join([*waiting, *notes]) + "\n").encode()
        return 200, _TEXT, ("\n".join(["ok", *notes]) + "\n").encode()

    def metrics() -> Answer:
        return 200, CONTENT_TYPE_LATEST, generate_latest()

    def lanes() -> Answer:
        return 200, _TEXT, lanes_text(workers).encode()

    return App({"/healthz": healthz, "/readyz": readyz, "/metrics": metrics, "/lanes": lanes})


class Runner:
    """A started server; ``await cleanup()`` stops it."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    async def cleanup(self) -> None:
        """Stop serving and close the socket."""
        await asyncio.to_thread(self.server.shutdown)
        self.server.server_close()


async def serve(app: App, host: str, port: int) -> Runner:
    """Start serving ``app`` on ``host:port`` (port 0 picks a free one); return the runner.

    Raises:
        OSError: the port is taken (the message names ``host:port``).
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(with_body=True)

        def do_HEAD(self) -> None:
            self._send(with_body=False)

        def _send(self, *, with_body: bool) -> None:
            status, content_type, body = app.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes and scrapes are not logged."""

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror or exc}: {host}:{port}") from None
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, args=(POLL_SECONDS,), name="inturn-http", daemon=True
    )
    thread.start()
    return Runner(server, thread)


def bound_port(runner: Runner) -> int:
    """The TCP port a started runner listens on."""
    return int(runner.server.server_address[1])
