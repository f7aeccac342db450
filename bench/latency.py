"""Latency from ingest's AA to the receiver's read: how long an accepted message waits.

Production's shape on one machine: ``inturn ingest`` as its own process with five MLLP
channels, one ``inturn worker`` process per destination (five, one per channel), five local
MLLP receivers. Eight sender connections, spread over the channels, send sample messages at a
steady total rate (each paced to its share; a sender never has two messages in flight), one
run per rate. For every message the time from the moment its sender read the AA to the moment
its receiver read the message is one latency (both clocks are this process's
``time.perf_counter``). A delivery can come before its sender has read the AA (the worker is
woken at COMMIT and the AA travels back at the same time): that latency is negative and
counted as it is. Where the time went is printed too, p50 and p99 per stage: the send to the
AA read by the sender (ingest's work and its COMMIT), that AA to the destination's NOTIFY
reaching a listener in this process (both follow the COMMIT), and that NOTIFY to the
receiver's read (the worker's wake, its head query, the send).

    python bench/latency.py [--dsn DSN] [--rates 50,200] [--seconds 20]

Without ``--dsn`` (or ``INTURN_DSN``) an embedded Postgres is started (pgserver). Prints p50,
p99 and max per rate; the target is a p99 under 50 ms. The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import corpus
import hops
import psycopg
from delivery import (
    Template,
    fresh_database,
    load_templates,
    percentile,
    postgres_server,
)
from figures import emit, parse_args
from ingest import free_port, wait_ready

from inturn.worker.hl7.header import parse_header
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.store import notify
from inturn.worker.store.migrate import migrate
from inturn.worker.testing import MllpReceiver

HOST = "127.0.0.1"
NAMESPACE = "lat"
DESTINATIONS = 5
CONNECTIONS = 8
INTURN = Path(sys.executable).with_name("inturn")
#: Seconds at the start of each rate's run left out of the figures (connections warming up).
WARMUP_SECONDS = 2.0
#: Seconds after the last send to wait for the last deliveries.
SETTLE_SECONDS = 5.0
#: Target for the p99, milliseconds.
TARGET_P99_MS = 50.0


def channel(n: int) -> str:
    return f"lat{n}"


def register(dsn: str) -> None:
    """One destination per channel in the registry, as the operator records them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n in range(DESTINATIONS):
            conn.execute(
                "INSERT INTO inturn_destination (destination, namespace, name, channel)"
                " VALUES (%s, %s, %s, %s)",
                (f"{NAMESPACE}/d{n}", NAMESPACE, f"d{n}", channel(n)),
            )


def manifest(directory: Path, n: int, port: int) -> Path:
    path = directory / f"d{n}.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        f"metadata: {{name: d{n}, namespace: {NAMESPACE}}}\n"
        "spec:\n"
        f"  channel: {channel(n)}\n"
        f"  sender: {{mllp: {{host: {HOST}, port: {port}}}}}\n"
        "  retry: {maxAttempts: 0}\n"
    )
    return path


def message(template: Template, control_id: str) -> bytes:
    return template.head + control_id.encode() + template.tail


class Clock:
    """Send, AA and arrival times by control ID, and when each destination's NOTIFY reached a
    listener in this process."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.notified: dict[str, list[float]] = {}
        #: The MSH-10s measured at each rate.
        self.measured: dict[float, list[str]] = {}
        #: With --hops: when this process's event loop ran a 5 ms timer (its own scheduling).
        self.beats: list[float] = []

    async def beat(self) -> None:
        """Note the time every 5 ms (a gap says this process, or the machine, was not run)."""
        while True:
            self.beats.append(time.perf_counter())
            await asyncio.sleep(0.005)

    def on_message(self, payload: bytes, _ack: bytes | None) -> None:
        self.arrived.setdefault(parse_header(payload).control_id, time.perf_counter())

    def notify_after(self, destination: str, instant: float) -> float | None:
        """The first NOTIFY for ``destination`` heard at or after ``instant`` (the commit that
        stored a message sent then wakes its worker with it), or None."""
        times = self.notified.get(destination, [])
        i = bisect.bisect_left(times, instant)
        return times[i] if i < len(times) else None


async def listen(dsn: str, clock: Clock, ready: asyncio.Event) -> None:
    """LISTEN on every destination's channel, as its worker does, and stamp each NOTIFY."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for n in range(DESTINATIONS):
            await notify.listen(conn, f"{NAMESPACE}/d{n}")
        ready.set()
        async for note in conn.notifies():
            clock.notified.setdefault(note.payload, []).append(time.perf_counter())


def stages(clock: Clock, measured: Sequence[str]) -> dict[str, float]:
    """Where each message's time went, p50 and p99 in ms: ``ingest`` from the send to the AA
    read by the sender (framing, the store, the COMMIT and its flush, the answer); ``notify``
    from the AA to the NOTIFY reaching a listener (negative when it comes first: both follow
    the COMMIT); ``worker`` from that NOTIFY to the receiver's read (the worker's wake, its head
    query, the send)."""
    spans: dict[str, list[float]] = {"ingest": [], "notify": [], "worker": []}
    for cid in measured:
        sent, acked, arrived = clock.sent[cid], clock.acked[cid], clock.arrived.get(cid)
        destination = f"{NAMESPACE}/d{int(cid.split('-')[1][:2]) % DESTINATIONS}"
        noted = clock.notify_after(destination, sent)
        spans["ingest"].append((acked - sent) * 1000)
        if noted is not None and arrived is not None and noted <= arrived:
            spans["notify"].append((noted - acked) * 1000)
            spans["worker"].append((arrived - noted) * 1000)
    out = {}
    for name, values in spans.items():
        out[f"{name}_p50_ms"] = percentile(values, 0.50)
        out[f"{name}_p99_ms"] = percentile(values, 0.99)
    return out


@contextlib.contextmanager
def processes(
    commands: Sequence[list[str]], env: dict[str, str], log: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``commands`` for the block, their standard error appended to ``log`` (a pipe
    nobody reads would stall a process that logs more than the pipe holds); stopped after."""
    with log.open("ab") as sink:
        procs = [
            subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=sink) for c in commands
        ]
    try:
        yield procs
    except BaseException:
        tail = log.read_text(errors="replace")[-3000:]
        print(f"(the end of ingest's and the workers' log:)\n{tail}", file=sys.stderr)
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


async def sender_loop(
    index: int,
    ports: Sequence[int],
    templates: Sequence[Template],
    rate: float,
    until: float,
    run: str,
    clock: Clock,
    measured: list[str],
    measure_from: float,
) -> int:
    """One connection: a message every ``CONNECTIONS / rate`` seconds, on its channel.

    Returns how many were not answered AA (each one printed).
    """
    n = index % DESTINATIONS
    sender = MllpSender(MllpSenderConfig(HOST, ports[n]))
    period = CONNECTIONS / rate
    next_at = time.perf_counter() + period * index / CONNECTIONS
    sent = refused = 0
    try:
        while next_at < until:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            cid = f"{run}{index:02d}{sent:07d}"
            template = templates[(index * 7 + sent) % len(templates)]
            clock.sent[cid] = time.perf_counter()
            try:
                await sender.send(message(template, cid))
            except Exception as exc:  # a refusal is reported, not fatal to the run
                refused += 1
                print(f"  connection {index}: {cid} not accepted: {exc}", file=sys.stderr)
            else:
                clock.acked[cid] = time.perf_counter()
                if next_at >= measure_from:
                    measured.append(cid)
            sent += 1
            next_at += period
    finally:
        await sender.close()
    return refused


async def one_rate(
    rate: float,
    seconds: float,
    ports: Sequence[int],
    templates: Sequence[Template],
    clock: Clock,
    groups: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    """Send at ``rate`` msg/s in all for ``seconds`` (plus warm-up); the latencies in ms, and
    how the processes of ``groups`` were scheduled over the measured seconds
    (:func:`hops.scheduling`)."""
    run = f"R{int(rate)}-"
    start = time.perf_counter()
    measure_from = start + WARMUP_SECONDS
    until = measure_from + seconds
    measured = clock.measured[rate] = []
    scheduled: dict[str, Any] = {}

    async def watch(groups: dict[str, list[int]]) -> None:
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        before, at = hops.snapshot(groups), time.perf_counter()
        await asyncio.sleep(max(0.0, until - time.perf_counter()))
        scheduled.update(hops.scheduling(before, hops.snapshot(groups), time.perf_counter() - at))

    watcher = asyncio.create_task(watch(groups)) if groups and seconds > 0 else None
    refused = await asyncio.gather(
        *(
            sender_loop(i, ports, templates, rate, until, run, clock, measured, measure_from)
            for i in range(CONNECTIONS)
        )
    )
    if watcher is not None:
        await watcher
    deadline = time.perf_counter() + SETTLE_SECONDS
    while time.perf_counter() < deadline and any(c not in clock.arrived for c in measured):
        await asyncio.sleep(0.05)
    latencies = [(clock.arrived[c] - clock.acked[c]) * 1000 for c in measured if c in clock.arrived]
    missing = sum(1 for c in measured if c not in clock.arrived)
    return {
        "rate": rate,
        "messages": len(measured),
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies, default=0.0),
        "undelivered": missing,
        "refused": sum(refused),
        **stages(clock, measured),
        "scheduling": scheduled,
    }


async def main_async(args: argparse.Namespace) -> int:
    source = corpus.load()
    templates, _ = load_templates(source)
    if not templates:
        print(f"no usable messages: {source.where}", file=sys.stderr)
        return 2
    print(source.describe(), flush=True)
    rates = [float(r) for r in args.rates.split(",")]
    results = []
    with (
        postgres_server(args.dsn) as (server, _),
        fresh_database(server, "latency") as dsn,
        tempfile.TemporaryDirectory(prefix="inturn-bench-") as tmp,
    ):
        migrate(dsn)
        register(dsn)
        clock = Clock()
        receivers = [MllpReceiver() for _ in range(DESTINATIONS)]
        async with contextlib.AsyncExitStack() as stack:
            for rx in receivers:
                rx.on_message = clock.on_message
                await stack.enter_async_context(rx)
            ports = [free_port() for _ in range(DESTINATIONS)]
            ops = free_port()
            ingest_argv = ["--ops", f"{HOST}:{ops}", "--log-level", "WARNING"]
            for n, port in enumerate(ports):
                ingest_argv += ["--listen", f"{channel(n)}={HOST}:{port}"]
            workers_argv = [
                [
                    *("-f", str(manifest(Path(tmp), n, rx.port))),
                    *("--http-host", HOST, "--http-port", "0", "--log-level", "WARNING"),
                ]
                for n, rx in enumerate(receivers)
            ]
            recorded = Path(args.hops_dir or Path(tmp) / "hops")
            if args.hops:
                recorded.mkdir(parents=True, exist_ok=True)
                ingest = hops.command("ingest", recorded, ingest_argv)
                workers = [hops.command("worker", recorded, w) for w in workers_argv]
            else:
                ingest = [
                    sys.executable, "-c",
                    "from inturn.worker.cli.ingest import ingest_command; ingest_command()",
                    *ingest_argv,
                ]  # fmt: skip
                workers = [[str(INTURN), "worker", *w] for w in workers_argv]
            env = {**os.environ, "INTURN_DSN": dsn}
            listening = asyncio.Event()
            listener = asyncio.create_task(listen(dsn, clock, listening))
            stack.callback(listener.cancel)
            if args.hops:
                stack.callback(asyncio.create_task(clock.beat()).cancel)
            await asyncio.wait_for(listening.wait(), timeout=30)
            with processes([ingest, *workers], env, Path(tmp) / "processes.log") as procs:
                await wait_ready_ops(ops)
                # two seconds at a slow pace, every channel delivered, before anything counts
                await one_rate(CONNECTIONS, 0.0, ports, templates, clock)
                await wait_delivered(receivers, 1)
                groups = {
                    "ingest": [procs[0].pid],
                    "workers": [p.pid for p in procs[1:]],
                    "bench": [os.getpid()],
                    "postgres": await server_pids(dsn),
                }
                print(
                    f"ingest + {DESTINATIONS} workers (processes), {CONNECTIONS} connections,"
                    f" {args.seconds:g} s per rate after {WARMUP_SECONDS:g} s of warm-up"
                )
                for rate in rates:
                    r = await one_rate(rate, args.seconds, ports, templates, clock, groups)
                    results.append(r)
                    print(
                        f"{rate:>6.0f} msg/s: {r['messages']} messages; AA -> receiver"
                        f" p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms,"
                        f" max {r['max_ms']:.1f} ms; undelivered {r['undelivered']},"
                        f" refused {r['refused']}",
                        flush=True,
                    )
                    print(
                        "  where it went (p50 / p99 ms): send -> AA"
                        f" {r['ingest_p50_ms']:.1f} / {r['ingest_p99_ms']:.1f};"
                        f" AA -> NOTIFY heard {r['notify_p50_ms']:.1f} / {r['notify_p99_ms']:.1f};"
                        f" NOTIFY -> receiver {r['worker_p50_ms']:.1f} / {r['worker_p99_ms']:.1f}",
                        flush=True,
                    )
                    print_scheduling(r["scheduling"])
            if args.hops:
                records = hops.load(recorded)
                if args.hops_dir:  # the benchmark's side too, for a closer look
                    (recorded / "bench.json").write_text(json.dumps(vars(clock)))
                for r in results:
                    r["hops"] = hop_figures(clock, records, r["rate"])
    worst = max((r["p99_ms"] for r in results), default=0.0)
    print(f"latency: worst p99 {worst:.1f} ms (target under {TARGET_P99_MS:.0f} ms)")
    emit(
        "latency",
        {
            "messages": source.source,
            "runs": [
                {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                for r in results
            ],
            "worst_p99_ms": round(worst, 2),
            "target_p99_ms": TARGET_P99_MS,
            "met": worst < TARGET_P99_MS,
        },
    )
    return 0


async def server_pids(dsn: str) -> list[int]:
    """The Postgres server's processes: this database's backends and the server's own (the WAL
    writer, the checkpointer...), from ``pg_stat_activity``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() OR datname IS NULL"
        )
        return [int(pid) for (pid,) in await cur.fetchall()]


def print_scheduling(scheduled: dict[str, Any]) -> None:
    """One line: each group's CPU and run-queue wait, and the machine's CPU pressure."""
    if not scheduled:
        return
    parts = [
        f"{name} {s['cpu_pct']:.0f}% CPU, {s['runqueue_ms_per_s']:.0f} ms/s runnable"
        f" ({s['wait_per_slice_us']:.0f} us a slice)"
        for name, s in scheduled.items()
        if isinstance(s, dict)
    ]
    print(
        f"  scheduling: {'; '.join(parts)}; some task waiting for a CPU"
        f" {scheduled['pressure_pct']:.0f}% of the time; load average"
        f" {os.getloadavg()[0]:.2f}",
        flush=True,
    )


def hop_figures(clock: Clock, records: dict[str, list[list[Any]]], rate: float) -> dict[str, Any]:
    """:func:`hops.breakdown` of one rate's messages, printed."""
    measured = [c for c in clock.measured[rate] if c in clock.arrived]
    latencies = {c: (clock.arrived[c] - clock.acked[c]) * 1000 for c in measured}
    figures = hops.breakdown(records, latencies, clock.acked, clock.arrived)
    print(f"{rate:>6.0f} msg/s, hops (ms; all: p50, slowest 1%: mean):")
    parts = (*hops.HOPS, *hops.WOKEN, *hops.PREFETCHED, *hops.EXCHANGE)
    for key, words in (("latency", "AA -> receiver"), *parts):
        values = [figures[g][key] for g in ("all_p50", "slowest_1pct_mean")]
        shown = " / ".join("-" if v is None else f"{v:.1f}" for v in values)
        print(f"    {words}: {shown}")
    for group in ("all_p50", "slowest_1pct_mean"):
        g = figures[group]
        print(
            f"    {group}: {g['messages']} messages, found woken {g['woken']},"
            f" looked {g['looked']}, prefetched {g['prefetched']}"
        )
    c = figures["statements"]
    print(
        f"    the whole run's worker statements: {c['sends']} sends, {c['marks']} marks,"
        f" {c['heads']} head queries ({c['empty_heads']} found nothing), {c['waits']} waits"
    )
    return figures


async def wait_ready_ops(port: int) -> None:
    """Until ingest's ``/readyz`` answers 200 (a minute at most)."""

    class Alive:
        def poll(self) -> None:
            return None

    await wait_ready(port, Alive())  # type: ignore[arg-type]


async def wait_delivered(receivers: Sequence[MllpReceiver], count: int) -> None:
    """Until every receiver has read ``count`` messages (a minute at most)."""
    deadline = time.perf_counter() + 60
    while any(len(rx.received) < count for rx in receivers):
        if time.perf_counter() > deadline:
            raise SystemExit("the workers did not deliver the warm-up messages within a minute")
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"), help="Postgres server")
    parser.add_argument("--rates", default="50,200", help="total msg/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per rate")
    parser.add_argument(
        "--hops",
        action="store_true",
        help="record each message's hops in ingest and the workers (bench/hops.py) and print them",
    )
    parser.add_argument(
        "--hops-dir", help="with --hops: keep the records there (and the benchmark's as bench.json)"
    )
    args = parse_args(parser, argv, {"rates": "20", "seconds": 1.0})
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
