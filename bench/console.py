"""Console benchmark: the overview under a large backlog while one destination drains.

    .venv/bin/python bench/console.py [--dsn DSN] [--destinations 1000] [--pending 1000000]

Prints figures and asserts nothing about time. In a fresh database of its own:

1. ``--destinations`` destinations are registered and ``--pending`` pending rows are put in the
   queue (small ADT^A01 messages, inserted by the server in batches, then ``VACUUM ANALYZE``):
   ``--drain-messages`` of them for ``bench/delivery``, the rest spread evenly over the others.
2. The overview's own database work (:func:`inturn.worker.console.feed.take`: registry, depth
   and heads on a read connection) is timed a few times: that is what the console's feed does
   at most every half second, whoever is watching.
3. ``inturn worker -f`` drains ``bench/delivery`` into a local MLLP receiver that ACKs at once.
   For ``--window`` seconds nothing else runs: the drain rate without a console. Then
   ``inturn console`` is started and polled for another window by ``--pollers`` clients, each
   asking ``GET /api/v1/overview`` (JSON) and ``GET /`` (the page) in turn, every
   ``--poll-interval`` seconds: the latency of each answer (p50, p95, max) and the drain rate
   during that window.

The database is ``--dsn`` / ``INTURN_DSN`` (a server; the benchmark creates and drops its own
database there), else an embedded Postgres started with ``pgserver``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

import aiohttp
import psycopg
from delivery import DESTINATION, fresh_database, percentile, postgres_server, write_manifest
from figures import emit, parse_args

from inturn.worker.console.feed import take
from inturn.worker.store.connect import Pools
from inturn.worker.store.migrate import migrate
from inturn.worker.testing import MllpReceiver
from tests.support.ports import free_port

INTURN = Path(sys.executable).with_name("inturn")
TOKEN = "bench-console-token-0123456789"
#: Rows per INSERT ... SELECT generate_series transaction.
INSERT_BATCH = 100_000


def fill(dsn: str, destinations: int, pending: int, drain: int) -> float:
    """Register the destinations and insert the pending rows; seconds taken."""
    started = time.monotonic()
    others = [f"bench/d{n:04d}" for n in range(1, destinations)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel, sender)"
            " SELECT d, split_part(d, '/', 1), split_part(d, '/', 2), 'bench', 'mllp://bench:2575'"
            " FROM unnest(%s::text[]) AS d",
            ([DESTINATION, *others],),
        )
        # The drained destination's rows first (an empty name spreads rows over the others).
        for name, first, count in ((DESTINATION, 1, drain), ("", drain + 1, pending - drain)):
            for start in range(first, first + count, INSERT_BATCH):
                stop = min(first + count, start + INSERT_BATCH)
                conn.execute(
                    "INSERT INTO inturn_delivery"
                    " (destination, channel, control_id, message_type, payload, size)"
                    " SELECT CASE WHEN %(name)s <> '' THEN %(name)s"
                    "        ELSE (%(others)s::text[])[1 + g %% %(n)s] END,"
                    "        'bench', 'B' || g, 'ADT^A01', m, length(m)"
                    "   FROM generate_series(%(start)s, %(stop)s - 1) AS g,"
                    "        LATERAL convert_to('MSH|^~\\&|BENCH|X|Y|Z|20260101000000||ADT^A01|B'"
                    "            || g || '|P|2.5' || chr(13) || 'PID|1||P' || g"
                    "            || '^^^X^MR||DOE^JOHN' || chr(13), 'UTF8') AS m",
                    {
                        "name": name,
                        "others": others,
                        "n": len(others),
                        "start": start,
                        "stop": stop,
                    },
                )
        conn.execute("VACUUM ANALYZE inturn_delivery")
    return time.monotonic() - started


async def time_snapshots(dsn: str, times: int) -> list[float]:
    """Seconds of each of ``times`` overview builds (registry, depth, heads)."""
    async with await Pools.open(dsn, write_size=1, read_size=1) as pools:
        took = []
        for _ in range(times):
            started = time.perf_counter()
            rows = await take(pools.read)
            took.append(time.perf_counter() - started)
        assert len(rows) >= 1
        return took


@contextlib.asynccontextmanager
async def process(args: list[str], env: dict[str, str]) -> AsyncIterator[None]:
    """A subprocess, terminated (SIGTERM, then waited for) on exit."""
    proc = await asyncio.create_subprocess_exec(*args, env=env)
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


async def poll(
    base: str, pollers: int, interval: float, seconds: float
) -> tuple[list[float], list[float], int]:
    """Poll the overview (JSON and page) for ``seconds``; latencies and the count of errors."""
    api: list[float] = []
    page: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        turn = 0
        while time.monotonic() < deadline:
            path, sink = ("/api/v1/overview", api) if turn % 2 == 0 else ("/", page)
            turn += 1
            started = time.perf_counter()
            async with session.get(base + path, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
            sink.append(time.perf_counter() - started)
            await asyncio.sleep(interval)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(pollers)))
    return api, page, errors


async def wait_healthy(base: str, timeout: float = 120) -> None:
    async with aiohttp.ClientSession() as session, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(base + "/healthz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.1f}"


async def main_async(args: argparse.Namespace) -> int:
    with postgres_server(args.dsn) as (server, _), fresh_database(server, "console") as dsn:
        migrate(dsn)
        took = fill(dsn, args.destinations, args.pending, args.drain_messages)
        print(
            f"setup: {args.destinations:,} destinations, {args.pending:,} pending rows"
            f" ({args.drain_messages:,} for {DESTINATION}) in {took:.1f}s"
        )
        snaps = await time_snapshots(dsn, 5)
        print(
            f"overview build (the feed's database work, at most every 0.5 s):"
            f" p50 {ms(snaps, 0.5)} ms, max {max(snaps) * 1000:.1f} ms"
        )
        env = {**os.environ, "INTURN_DSN": dsn}
        with tempfile.TemporaryDirectory(prefix="inturn-bench-console-") as tmp:
            auth = Path(tmp) / "auth.yaml"
            auth.write_text(f"tokens: [{{name: bench, roles: [viewer], token: {TOKEN}}}]\n")
            auth.chmod(0o600)  # a key file: others may not read it
            async with MllpReceiver() as rx:
                manifest = write_manifest(Path(tmp), rx.port)
                worker = [str(INTURN), "worker", "-f", str(manifest), "--http-port", "0"]
                async with process([*worker, "--log-level", "WARNING"], env):
                    await rx.wait_for(1, timeout=120)
                    start = len(rx.received)
                    await asyncio.sleep(args.window)
                    alone = (len(rx.received) - start) / args.window
                    print(f"drain without a console: {alone:.0f} msg/s")
                    port = free_port()
                    base = f"http://127.0.0.1:{port}"
                    console = [str(INTURN), "console", "--listen", f"127.0.0.1:{port}"]
                    console += ["--auth-file", str(auth), "--log-level", "WARNING"]
                    async with process(console, env):
                        await wait_healthy(base)
                        start = len(rx.received)
                        api, page, errors = await poll(
                            base, args.pollers, args.poll_interval, args.window
                        )
                        polled = (len(rx.received) - start) / args.window
                    if len(rx.received) >= args.drain_messages:
                        print("warning: the queue ran dry during a window; raise --drain-messages")
        requests = len(api) + len(page)
        print(
            f"console polled by {args.pollers} clients: {requests / args.window:.0f} req/s,"
            f" {errors} errors"
        )
        print(
            f"  GET /api/v1/overview: p50 {ms(api, 0.5)} ms, p95 {ms(api, 0.95)} ms,"
            f" max {max(api, default=0) * 1000:.1f} ms ({len(api)} requests)"
        )
        print(
            f"  GET / (the page):     p50 {ms(page, 0.5)} ms, p95 {ms(page, 0.95)} ms,"
            f" max {max(page, default=0) * 1000:.1f} ms ({len(page)} requests)"
        )
        print(f"drain with the console polled: {polled:.0f} msg/s")
        print(
            f"console: overview p50 {ms(api, 0.5)} ms p95 {ms(api, 0.95)} ms;"
            f" page p95 {ms(page, 0.95)} ms; drain {alone:.0f} msg/s alone,"
            f" {polled:.0f} msg/s polled"
        )
        emit(
            "console",
            {
                "overview_p50_ms": ms(api, 0.5),
                "overview_p95_ms": ms(api, 0.95),
                "page_p95_ms": ms(page, 0.95),
                "drain_alone_msg_s": round(alone, 1),
                "drain_polled_msg_s": round(polled, 1),
                "errors": errors,
            },
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"), help="Postgres server DSN")
    parser.add_argument("--destinations", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=1_000_000, help="pending rows in all")
    parser.add_argument(
        "--drain-messages", type=int, default=40_000, help="pending rows of the drained one"
    )
    parser.add_argument("--window", type=float, default=20.0, help="seconds per measurement")
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--poll-interval", type=float, default=0.1, help="seconds between polls")
    args = parse_args(
        parser,
        argv,
        {"destinations": 3, "pending": 600, "drain_messages": 300, "window": 1.0, "pollers": 2},
    )
    if not 0 < args.drain_messages < args.pending or args.destinations < 2:
        parser.error("need 2+ destinations and 0 < --drain-messages < --pending")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
