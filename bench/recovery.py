"""Benchmark recovery after a Postgres outage: seconds from the server accepting connections
again to ingest's first AA and to the worker's first delivery, for outages of several lengths.

A Postgres server of the benchmark's own (:class:`inturn.worker.testing.ScratchPostgres`, Debian's
PostgreSQL 15 programs) runs ingest's pools and one worker draining to an MLLP receiver, all in
this process. A sender sends one message every 0.2 s and awaits each answer (store timeout 2 s)
throughout. The server is stopped (``pg_ctl stop -m fast``), kept down for the outage, and
started again (``pg_ctl start -w``, which returns once it accepts connections); from that moment
the benchmark measures the first AA and the first delivery of a message accepted after it.

``--compare`` repeats each outage with psycopg_pool's own reconnect delays (doubling from 1 s up
to its five-minute reconnect timeout) and the worker's former 30 s reconnect ceiling, to show
what the caps changed.

    python bench/recovery.py [--outages 10,60,180] [--compare]

Prints figures and asserts nothing; the last line is
``recovery: first AA A s, first delivery D s after the longest outage (L s)``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import psycopg
from figures import emit, parse_args

from inturn.worker.drain import runner
from inturn.worker.drain.observer import NullObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig
from inturn.worker.store import pool
from inturn.worker.store.migrate import migrate
from inturn.worker.testing import MllpReceiver, ScratchPostgres

DESTINATION = "bench/recovery"
SEND_EVERY_SECONDS = 0.2


def message(control_id: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261201120000||ADT^A01|{control_id}|P|2.5\r"
        f"PID|1||{control_id}^^^HOSP^MR||DOE^JANE\r"
    ).encode()


@dataclass
class Sender:
    """Sends a message every 0.2 s over one MLLP connection; records (time, MSH-10, code)."""

    port: int
    answers: list[tuple[float, str, str]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(SEND_EVERY_SECONDS)
                continue
            framer = FrameReader(1 << 20)
            try:
                while not stop.is_set():
                    n += 1
                    control_id = f"R{n:06d}"
                    writer.write(frame(message(control_id)))
                    await writer.drain()
                    events: list[Frame] = []
                    async with asyncio.timeout(30):
                        while not events:
                            data = await reader.read(65536)
                            if not data:  # no answer: ingest could not see how a store ended
                                raise ConnectionError("ingest closed the connection")
                            events = [e for e in framer.feed(data) if isinstance(e, Frame)]
                    code = parse_ack(events[0].payload).code
                    self.answers.append((time.monotonic(), control_id, code))
                    await asyncio.sleep(SEND_EVERY_SECONDS)
            except (OSError, TimeoutError):
                self.answers.append((time.monotonic(), f"R{n:06d}", "closed"))
            finally:
                writer.close()


async def one_outage(outage: float) -> tuple[float, float]:
    """Seconds from the server's return to the first AA and to the first delivery."""
    with ScratchPostgres() as server:
        migrate(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO inturn_destination (destination, namespace, name, channel)"
                " VALUES (%s, 'bench', 'recovery', 'adt')",
                (DESTINATION,),
            )
        config = IngestConfig(
            listeners=[ListenerConfig("adt", "127.0.0.1", 0)],
            store_timeout=2.0,
            refresh_seconds=1.0,
        )
        stop = asyncio.Event()
        async with MllpReceiver() as rx, Ingest(config, dsn=server.dsn) as ingest:
            worker_config = WorkerConfig(
                destination=DESTINATION,
                channel="adt",
                sender=MllpSenderConfig("127.0.0.1", rx.port),
                retry=RetryPolicy(
                    max_attempts=0, backoff_seconds=1, max_backoff_seconds=1, timeout_seconds=5
                ),
            )
            assert isinstance(worker_config.sender, MllpSenderConfig)
            worker = DestinationWorker(
                worker_config, server.dsn, MllpSender(worker_config.sender), NullObserver()
            )
            sender = Sender(ingest.mllp_ports["adt"])
            tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(sender.run(stop))]
            await asyncio.sleep(2.0)
            server.stop()
            await asyncio.sleep(outage)
            await asyncio.to_thread(server.start)
            back = time.monotonic()
            first_aa: float | None = None
            delivered: float | None = None
            async with asyncio.timeout(outage + 400):
                while first_aa is None or delivered is None:
                    await asyncio.sleep(0.05)
                    after = [a for a in sender.answers if a[0] >= back and a[2] == "AA"]
                    if after and first_aa is None:
                        first_aa = after[0][0] - back
                    if after and delivered is None:
                        wanted = after[0][1].encode()
                        if any(b"|" + wanted + b"|" in p for p in rx.received):
                            delivered = time.monotonic() - back
            stop.set()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 15)
        return first_aa, delivered


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one line per outage and a summary line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outages", default="10,60,180", help="seconds, comma-separated")
    parser.add_argument("--compare", action="store_true")
    args = parse_args(parser, argv, {"outages": "2"})
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    outages = [float(x) for x in args.outages.split(",")]
    modes = [("capped", 2.0, 2.0)]
    if args.compare:
        modes.append(("former", float("inf"), 30.0))
    last = (0.0, 0.0, 0.0)
    for name, pool_cap, worker_cap in modes:
        pool.RECONNECT_MAX_DELAY_SECONDS = pool_cap
        runner.RECONNECT_MAX_SECONDS = worker_cap
        runner.RECONNECT_BASE_SECONDS = 0.5 if name == "capped" else 1.0
        for outage in outages:
            first_aa, delivered = asyncio.run(one_outage(outage))
            print(
                f"{name}: outage {outage:.0f} s: first AA {first_aa:.1f} s,"
                f" first delivery {delivered:.1f} s after the server was back",
                flush=True,
            )
            if name == "capped":
                last = (first_aa, delivered, outage)
    print(
        f"recovery: first AA {last[0]:.1f} s, first delivery {last[1]:.1f} s after the longest"
        f" outage ({last[2]:.0f} s)"
    )
    emit(
        "recovery",
        {
            "longest_outage_s": last[2],
            "first_aa_after_back_s": round(last[0], 2),
            "first_delivery_after_back_s": round(last[1], 2),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
