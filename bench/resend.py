"""Resend benchmark: ``queue resend --destination`` over 10,000 failed items, with ingest
storing messages for the same destination meanwhile.

    .venv/bin/python bench/resend.py [--dsn DSN] [--items 10000] [--rounds 3]

In a fresh database, one destination (``ward/lab``, channel ``adt``) holds ``--items`` failed
items. Ingest runs in this process (one MLLP listener), and one connection sends it a message
for that destination, waits for its AA and sends the next, for the whole run. Each round
resends every failed item (:func:`inturn.worker.operations.queue.resend_failed`, the action
behind ``inturn queue resend --destination`` and the console's "resend failed"), then the
copies are failed again for the next round. Printed:

* the seconds each resend took (``resend_seconds``: median and maximum over the rounds) and
  its rate in items per second;
* ingest's AA latency (milliseconds, p50, p99 and max) while no resend runs, and while one
  does: the resend takes the destination's enqueue lock, which ingest's store statement takes
  too, so the difference is what a resend costs the feed.

Asserts nothing. The database is ``--dsn`` / ``INTURN_DSN`` (a server; the benchmark creates
and drops its own database there), else an embedded Postgres (pgserver).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from delivery import fresh_database, percentile, postgres_server  # noqa: E402
from figures import emit, parse_args  # noqa: E402

from inturn.worker.hl7.ack import parse_ack  # noqa: E402
from inturn.worker.hl7.mllp import Frame, FrameReader, frame  # noqa: E402
from inturn.worker.ingest.config import IngestConfig  # noqa: E402
from inturn.worker.ingest.listener import ListenerConfig  # noqa: E402
from inturn.worker.ingest.service import Ingest  # noqa: E402
from inturn.worker.operations.actor import Trusted  # noqa: E402
from inturn.worker.operations.queue import resend_failed  # noqa: E402
from inturn.worker.store import registry  # noqa: E402
from inturn.worker.store.migrate import migrate  # noqa: E402

DEST = "ward/lab"
HOST = "127.0.0.1"


def message(prefix: str, n: int) -> bytes:
    """A small ADT^A01 of a made-up patient whose MSH-10 is ``<prefix><n>``."""
    return (
        f"MSH|^~\\&|BENCH|HOSP|LAB|WARD|20261201120000||ADT^A01^ADT_A01|{prefix}{n}|P|2.5\r"
        f"PID|1||P{n % 997:05d}^^^HOSP^MR||Testperson^Number{n % 997}\r"
    ).encode()


async def prepare(dsn: str, items: int) -> None:
    """Register the destination and store ``items`` failed items for it."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await registry.register(
            conn,
            destination=DEST,
            namespace="ward",
            name="lab",
            channel="adt",
            message_types=[],
            generation=1,
            suspended=False,
        )
        payloads = [message("F", n) for n in range(items)]
        await conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, attempts, finished_at, last_error)"
            " SELECT %s, 'adt', 'F' || (n - 1), 'ADT^A01', p, length(p), 'failed', 3, now(),"
            "        'AE: the receiver refused it'"
            "   FROM unnest(%s::bytea[]) WITH ORDINALITY AS t(p, n) ORDER BY n",
            (DEST, payloads),
        )
        await conn.execute("VACUUM ANALYZE inturn_delivery")


async def fail_copies(dsn: str) -> None:
    """Fail every pending item again, so that the next round has as many to resend."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now()"
            " WHERE destination = %s AND state = 'pending'",
            (DEST,),
        )


class Feed:
    """One MLLP connection sending a message, waiting for its AA, sending the next; each AA's
    latency is kept with the time it was sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds to the AA)
        self.refused = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection(HOST, self.port)
        frames = FrameReader(1 << 20)
        n = 0
        try:
            while not self.stop.is_set():
                sent = time.perf_counter()
                writer.write(frame(message("I", n)))
                await writer.drain()
                got: list[Frame] = []
                while not got:
                    data = await asyncio.wait_for(reader.read(65536), 60)
                    if not data:
                        raise RuntimeError("ingest closed the connection")
                    got = [e for e in frames.feed(data) if isinstance(e, Frame)]
                if parse_ack(got[0].payload).code == "AA":
                    self.latencies.append((sent, time.perf_counter() - sent))
                else:
                    self.refused += 1
                n += 1
        finally:
            writer.close()

    def during(self, spans: list[tuple[float, float]]) -> list[float]:
        """Latencies (ms) of the messages sent inside one of ``spans``."""
        return [s * 1000 for t, s in self.latencies if any(a <= t <= b for a, b in spans)]

    def outside(self, spans: list[tuple[float, float]]) -> list[float]:
        """Latencies (ms) of the messages sent outside every span."""
        return [s * 1000 for t, s in self.latencies if not any(a <= t <= b for a, b in spans)]


def summary(values: list[float]) -> dict[str, Any]:
    """p50, p99 and max (ms, rounded), with the count."""
    if not values:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 0.5), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


async def run(dsn: str, items: int, rounds: int, quiet_seconds: float) -> dict[str, Any]:
    await prepare(dsn, items)
    config = IngestConfig(listeners=[ListenerConfig("adt", host=HOST, port=0)], pool_size=4)
    spans: list[tuple[float, float]] = []
    times: list[float] = []
    resent: list[int] = []
    async with Ingest(config, dsn=dsn) as ingest:
        feed = Feed(ingest.mllp_ports["adt"])
        task = asyncio.create_task(feed.run())
        try:
            await asyncio.sleep(quiet_seconds)  # the feed alone first
            async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
                for _ in range(rounds):
                    began = time.perf_counter()
                    done = await resend_failed(conn, Trusted("bench"), DEST, "bench")
                    ended = time.perf_counter()
                    spans.append((began, ended))
                    times.append(ended - began)
                    resent.append(len(done.copies))
                    await fail_copies(dsn)
                    await asyncio.sleep(quiet_seconds)
        finally:
            feed.stop.set()
            await task
    median = statistics.median(times)
    return {
        "items": items,
        "rounds": rounds,
        "resent": resent,
        "resend_seconds": {"median": round(median, 3), "max": round(max(times), 3)},
        "items_per_second": round(items / median),
        "ingest_aa_quiet": summary(feed.outside(spans)),
        "ingest_aa_during_resend": summary(feed.during(spans)),
        "ingest_refused": feed.refused,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"), help="Postgres server DSN")
    parser.add_argument("--items", type=int, default=10_000, help="failed items to resend")
    parser.add_argument("--rounds", type=int, default=3, help="resends of all of them")
    parser.add_argument("--quiet-seconds", type=float, default=2.0, help="feed alone between")
    args = parse_args(parser, argv, {"items": 200, "rounds": 1, "quiet_seconds": 0.5})
    with postgres_server(args.dsn) as (server, _), fresh_database(server, "resend") as dsn:
        migrate(dsn)
        figures = asyncio.run(run(dsn, args.items, args.rounds, args.quiet_seconds))
    print(
        f"resend of {args.items} failed items: {figures['resend_seconds']['median']} s"
        f" (median of {args.rounds}), {figures['items_per_second']} items/s"
    )
    print(f"ingest AA latency, feed alone:  {figures['ingest_aa_quiet']}")
    print(f"ingest AA latency, during one:  {figures['ingest_aa_during_resend']}")
    emit("resend", figures)


if __name__ == "__main__":
    main()
