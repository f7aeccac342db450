"""The dashboard's queries against a real Prometheus scraping a live ``inturn local``.

Debian's ``prometheus`` runs in a directory of its own on a free port, scraping the ops port of
``inturn local`` every second while messages arrive: some for an HTTP receiver that accepts
them, the same for an MLLP receiver that refuses them (AE) until each is marked failed (which
places it on the ``delivery-failed`` worklist), and one without a readable header (AR). Then
every query of ``charts/inturn/dashboards/inturn.json`` that reads inturn's metrics runs through
Prometheus's HTTP API with Grafana's variables filled in as Grafana would (all destinations,
all channels, ``$__rate_interval`` for a 1 s scrape); a query that names a metric inturn does
not export, or that returns no series within a generous bound, fails the test. Queries of
kube-state-metrics' metrics must say so in their panel's title, and are not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.local import HOST, LocalProcess, accepting_and_refusing, free_port, message, send

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "inturn" / "dashboards" / "inturn.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
#: Seconds to wait for every query to return data (the worklist gauge alone is refreshed every
#: 30 s by ingest).
BOUND_SECONDS = 180
#: Grafana's variables as an "All" selection and a 1 s scrape interval make them.
VARIABLES = {"$destination": ".*", "$channel": ".*", "$__rate_interval": "15s"}

#: slow (left out by make test-fast): a long run of whole parts
pytestmark = [
    pytest.mark.skipif(
        shutil.which(PROMETHEUS) is None and not os.environ.get("INTURN_REQUIRE_PROMETHEUS"),
        reason="no prometheus (apt-get install prometheus)",
    ),
    pytest.mark.slow,
]


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every query of every panel."""
    dash = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dash["panels"]
        for target in panel.get("targets", [])
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names a query reads (inturn's and kube-state-metrics' own prefixes)."""
    return set(re.findall(r"\b((?:inturn|kube)_[a-z0-9_]+)\b", expr))


def filled(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


@contextlib.asynccontextmanager
async def prometheus(tmp_path: Path, target: str) -> AsyncIterator[str]:
    """A Prometheus scraping ``target`` (host:port) every second; its base URL."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: inturn\n"
        "    metrics_path: /metrics\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={HOST}:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=log,
    )
    base = f"http://{HOST}:{port}"
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(60):
            while True:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base}/-/ready") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


async def api(http: aiohttp.ClientSession, base: str, path: str, **params: str) -> Any:
    async with http.get(f"{base}/api/v1/{path}", params=params) as r:
        body = await r.json()
    assert body["status"] == "success", body
    return body["data"]


@pytest.mark.acceptance  # a live inturn local and Prometheus
async def test_every_dashboard_query_of_inturns_metrics_returns_data(
    fresh_db: str, tmp_path: Path
) -> None:
    queries = dashboard_queries()
    ours = [(title, expr) for title, expr in queries if metric_names(expr) - _kube(expr)]
    theirs = [(title, expr) for title, expr in queries if (title, expr) not in ours]
    assert ours and theirs
    for title, expr in theirs:  # kube-state-metrics' panels say whose metrics they read
        assert metric_names(expr) == _kube(expr) and "kube-state-metrics" in title, title

    async with HttpReceiver() as accepting, MllpReceiver(ack_code="AE") as refusing:
        listen, ops = free_port(), free_port()
        args = accepting_and_refusing(tmp_path, f"{accepting.url}hl7", refusing.port)
        local = LocalProcess(
            tmp_path / "local.log",
            [*args, "--listen", f"adt={listen}", "--ops", f"{HOST}:{ops}", "--dsn", fresh_db],
        )
        load: asyncio.Task[None] | None = None
        try:
            await local.start(listen)
            assert await send(listen, [b"not an HL7 message"]) == ["AR"]
            load = asyncio.create_task(_load(listen))
            async with (
                prometheus(tmp_path, f"{HOST}:{ops}") as base,
                aiohttp.ClientSession() as http,
            ):
                missing = await _until_every_query_answers(http, base, ours)
                exported = set(await api(http, base, "label/__name__/values"))
            assert missing == {}, f"queries without data after {BOUND_SECONDS}s: {missing}"
            for title, expr in ours:
                for name in metric_names(expr) - _kube(expr):
                    assert name in exported, f"{title}: inturn does not export {name}"
        finally:
            if load is not None:
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load
            await local.kill()


def _kube(expr: str) -> set[str]:
    return {n for n in metric_names(expr) if n.startswith("kube_")}


async def _load(port: int) -> None:
    """A small steady load: one message every half second."""
    n = 0
    while True:
        assert await send(port, [message(n)]) == ["AA"]
        n += 1
        await asyncio.sleep(0.5)


async def _until_every_query_answers(
    http: aiohttp.ClientSession, base: str, queries: list[tuple[str, str]]
) -> dict[str, str]:
    """Poll each query until it returns a series; ``{title: expr}`` of those that never did."""
    waiting = dict.fromkeys(queries)
    try:
        async with asyncio.timeout(BOUND_SECONDS):
            while waiting:
                for title, expr in list(waiting):
                    data = await api(http, base, "query", query=filled(expr))
                    if data["result"]:
                        del waiting[(title, expr)]
                await asyncio.sleep(1)
    except TimeoutError:
        pass
    return {title: expr for title, expr in waiting}
