"""Benchmark of the Destination operator: 1,000 Destinations created at once.

Runs the kmock Kubernetes emulator in this process, an embedded Postgres (pgserver, or the
server named by ``INTURN_BENCH_DSN``), and the operator (``inturn operator``) as a subprocess so
that its memory is measured alone. Prints:

* the time until every Destination has its ConfigMap and Deployment;
* the time for one status refresh of all of them after a message is queued for each (from the
  insert until every status shows it; bounded below by the status interval), the duration of
  the grouped depth query, and the spread of the status writes of that pass;
* the operator's peak RSS (VmHWM).

Figures only, no assertions. Usage: ``python bench/operator.py [--count 1000] [--interval 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import kmock
import psycopg
import yaml
from delivery import cpu_seconds, fresh_database, postgres_server
from figures import emit, parse_args

from inturn.worker.spec import schema
from inturn.worker.store import registry
from inturn.worker.store.migrate import migrate

NS = "bench"
DEST = "inturn.dev/v1alpha1/destinations"


class Emulator(kmock.KubernetesEmulator):
    """kmock plus uid/resourceVersion/generation, as a real API server sets them.

    kmock logs every request and, to route a new one, scans that log once per reaction, so its
    cost per request grows with the number of requests served. The benchmark keeps only the most
    recent part of the log (enough for requests in flight) so that the figures are the
    operator's, not the emulator's growing overhead; writes are counted separately.

    kmock also finds the object a request names by scanning every stored object (3,000 here:
    Destinations, ConfigMaps, Deployments), several times per request; with 1,000 Destinations
    that scan, not the operator, was most of the status pass (profiled: about 30% of the
    emulator's CPU in the scan, the emulator process saturated). A real API server reads one
    key from its store, so the benchmark looks the named object up by its key first and falls
    back to kmock's scan only when the key misses.
    """

    _versions = itertools.count(1000)
    status_times: list[float]
    writes: dict[str, int]
    KEEP = 16

    def _KubernetesEmulator__get_objs(self, request: Any, strict: bool) -> list[Any]:
        if strict and request.resource is not None and request.name is not None:
            table = self._objects._objects
            found = table.get((request.resource, request.namespace, request.name))
            if found is not None:
                return [found]
        scan: list[Any] = super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]
        return scan

    async def _handle(self, request: Any) -> Any:
        if len(self._requests) > 2 * self.KEEP:
            del self._requests[: -self.KEEP]
        if request.resource is not None and request.method.value != "GET":
            what = f"{request.method.value} {request.resource.plural}" + (
                f"/{request.subresource}" if request.subresource else ""
            )
            self.writes[what] = self.writes.get(what, 0) + 1
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta["resourceVersion"] = str(next(self._versions))
            elif request.action == kmock.action.UPDATE and request.name is not None:
                meta["resourceVersion"] = str(next(self._versions))
                if request.subresource == "status":
                    self.status_times.append(time.monotonic())
        return await super()._handle(request)


def destination(i: int) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": f"d{i:04d}", "namespace": NS},
        "spec": {
            "channel": "adt",
            "sender": {"mllp": {"host": f"10.0.{i // 250}.{i % 250}", "port": 2575}},
            "retry": {"maxAttempts": 0},
        },
    }


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def wait_until(check: Any, timeout: float) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError("not converged")
        await asyncio.sleep(0.2)
    return time.monotonic() - began


async def run(count: int, interval: float, dsn: str) -> dict[str, Any]:
    """Create ``count`` Destinations and time the operator; returns the summary figures."""
    async with Emulator() as emulator, kmock.Server(emulator):
        emulator.status_times = []
        emulator.writes = {}
        emulator.resources.load_bundled()
        emulator.resources[DEST] = {
            "kind": "Destination",
            "singular": "destination",
            "namespaced": True,
            "verbs": {"get", "list", "watch", "patch", "create", "delete"},
            "subresources": {"status"},
        }
        emulator.objects[
            "apiextensions.k8s.io/v1/customresourcedefinitions", None, schema.CRD_NAME
        ] = schema.crd()
        emulator.objects["v1/namespaces", None, NS] = {"metadata": {"name": NS}}
        tmp = Path(tempfile.mkdtemp(prefix="inturn-bench-"))
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "k",
                    "clusters": [
                        {"name": "k", "cluster": {"server": str(emulator.url).rstrip("/")}}
                    ],
                    "users": [{"name": "k", "user": {"token": "t"}}],
                    "contexts": [{"name": "k", "context": {"cluster": "k", "user": "k"}}],
                }
            )
        )
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "INTURN_DSN": dsn}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        inturn = Path(sys.executable).with_name("inturn")
        log_file = (tmp / "operator.log").open("w")
        proc = subprocess.Popen(
            [
                str(inturn),
                "operator",
                "--image",
                "inturn:bench",
                "--liveness",
                "",
                "--status-interval",
                str(interval),
                "--log-format",
                "plain",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
        try:
            await asyncio.sleep(3)  # let it start and watch
            began = time.monotonic()
            path = f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations"
            await asyncio.gather(*(emulator.post(path, json=destination(i)) for i in range(count)))
            created = time.monotonic() - began

            def converged_keys() -> int:
                return sum(
                    1
                    for (res, ns, _), o in list(emulator.objects.items())
                    if ns == NS and not o.deleted and res == kmock.resource("apps/v1/deployments")
                )

            took_create = await wait_until(lambda: converged_keys() >= count, 600)
            print(f"destinations created (API):        {count} in {created:.2f} s")
            print(
                "all ConfigMaps + Deployments:      "
                f"{created + took_create:.2f} s after the first create"
            )

            # status refresh: first let the statuses of the creation settle, then queue one
            # message per destination and time until every status shows it
            quiet = time.monotonic()
            while True:
                await asyncio.sleep(0.5)
                last = emulator.status_times[-1] if emulator.status_times else quiet
                if time.monotonic() - last > interval * 1.5:
                    break
            with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO inturn_delivery (destination, channel, control_id,"
                    " message_type, payload, size) VALUES (%s, 'adt', 'c', 'ADT^A01', 'x', 1)",
                    [(f"{NS}/d{i:04d}",) for i in range(count)],
                )
            emulator.status_times.clear()
            cpu_emulator, cpu_operator = time.process_time(), cpu_seconds(proc.pid)
            began = time.monotonic()
            dest = kmock.resource(DEST)

            def refreshed() -> bool:  # one pass over the store, not one scan per Destination
                done = 0
                for (res, ns, _), o in list(emulator.objects.items()):
                    if res == dest and ns == NS and not o.deleted:
                        done += (o.raw.get("status") or {}).get("pending") == 1
                return done == count

            took = await wait_until(refreshed, 600)
            cpu_emulator = time.process_time() - cpu_emulator
            cpu_operator = cpu_seconds(proc.pid) - cpu_operator
            spread = (
                max(emulator.status_times) - min(emulator.status_times)
                if emulator.status_times
                else float("nan")
            )
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                q = time.perf_counter()
                await registry.status_depth(conn)
                query = time.perf_counter() - q
            print(
                f"status refresh of all:             {took:.2f} s from insert"
                f" (interval {interval} s)"
            )
            n = len(emulator.status_times)
            print(f"  status writes in that pass:      {n} over {spread:.2f} s")
            if n:
                print(
                    f"  per status write:                {spread / n * 1000:.2f} ms of the pass;"
                    f" CPU {cpu_emulator / n * 1000:.2f} ms in the emulator (this process),"
                    f" {cpu_operator / n * 1000:.2f} ms in the operator"
                )
            print(f"  grouped depth query:             {query * 1000:.1f} ms")
            print(f"operator peak RSS:                 {peak_rss_mib(proc.pid):.0f} MiB")
            counts = emulator.writes
            figures = {
                "destinations": count,
                "converged_s": round(created + took_create, 2),
                "status_refresh_s": round(took, 2),
                "per_status_write_ms": round(spread / n * 1000, 2) if n else None,
                "depth_query_ms": round(query * 1000, 1),
                "operator_peak_rss_mib": round(peak_rss_mib(proc.pid)),
            }
            print(
                "API writes by kind:                "
                + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
            )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log_file.close()
            print(f"(operator log: {tmp / 'operator.log'})")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0, help="status interval, seconds")
    args = parse_args(parser, argv, {"count": 3, "interval": 1.0})
    with (
        postgres_server(os.environ.get("INTURN_BENCH_DSN")) as (server_dsn, _),
        fresh_database(server_dsn, "operator") as dsn,
    ):
        migrate(dsn)
        figures = asyncio.run(run(args.count, args.interval, dsn))
    emit("operator", figures)


if __name__ == "__main__":
    main()
