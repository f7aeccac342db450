"""The worker's HTTP endpoints over a real socket: probes, scrape, HEAD, unknown paths."""

from __future__ import annotations

import asyncio
import gc
import http.client

from prometheus_client import REGISTRY

from inturn.worker.drain.health import bound_port, make_app, serve
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig
from inturn.worker.text import conditions


def request(port: int, method: str, path: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


async def test_probes_scrape_head_and_unknown_paths() -> None:
    cfg = WorkerConfig("ns/health", "c", MllpSenderConfig("h", 1), RetryPolicy(0))
    worker = DestinationWorker(cfg, "postgresql://unused", MllpSender(cfg.sender))
    PrometheusObserver().depth("ns/health", 3, 12.0, 1)
    runner = await serve(make_app([worker]), "127.0.0.1", 0)
    try:
        port = bound_port(runner)
        got = await asyncio.to_thread(request, port, "GET", "/healthz")
        assert got == (200, "text/plain; charset=utf-8", b"ok\n")
        # /readyz also lists the conditions of the whole process (conditions.notes): an
        # earlier test in this xdist worker may have left one (its owner not yet collected).
        gc.collect()
        held = conditions.notes()
        status, _, body = await asyncio.to_thread(request, port, "GET", "/readyz")
        lines = ["ns/health: not holding the lock or no database", *held]
        assert (status, body) == (503, ("\n".join(lines) + "\n").encode())
        worker.state.lock_held = worker.state.db_ok = True
        status, _, body = await asyncio.to_thread(request, port, "GET", "/readyz")
        assert (status, body) == (200, ("\n".join(["ok", *held]) + "\n").encode())
        status, ctype, text = await asyncio.to_thread(request, port, "GET", "/metrics?x=1")
        assert status == 200 and ctype.startswith("text/plain; version=")
        assert b'inturn_queue_pending{destination="ns/health"} 3.0' in text
        assert await asyncio.to_thread(request, port, "HEAD", "/healthz") == (
            200,
            "text/plain; charset=utf-8",
            b"",
        )
        assert (await asyncio.to_thread(request, port, "GET", "/nope"))[0] == 404
        assert (await asyncio.to_thread(request, port, "POST", "/healthz"))[0] == 501
    finally:
        await runner.cleanup()


def test_oldest_age_is_computed_when_scraped() -> None:
    """The age gauge needs no query to stay fresh: it is reckoned from the oldest's enqueue."""
    observer = PrometheusObserver()
    observer.depth("ns/age", 2, 30.0, 0)
    age = REGISTRY.get_sample_value("inturn_queue_oldest_age_seconds", {"destination": "ns/age"})
    assert age is not None and age >= 30.0
    observer.depth("ns/age", 0, 0.0, 0)
    assert (
        REGISTRY.get_sample_value("inturn_queue_oldest_age_seconds", {"destination": "ns/age"})
        == 0.0
    )
