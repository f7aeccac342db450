"""Failover benchmark: a primary with a synchronous standby dies under load and the standby is
promoted; ingest and a worker run on a two-host DSN and find the new primary by themselves.

    .venv/bin/python bench/failover.py [--messages 1100] [--fail-after 400] [--attrs read-write]

Needs root and the PostgreSQL 15 binaries (the servers run as ``postgres``, on loopback ports
of their own; see ``tests/pgcluster.py``). One MLLP sender sends ``--messages`` messages to
ingest one after another (a message answered otherwise than AA, or not at all, is sent again,
as a real sender does); after ``--fail-after`` AAs the primary is stopped (``immediate``: no
shutdown checkpoint, connections cut) and the standby promoted (``pg_ctl promote -w``). A
worker drains into a local MLLP receiver throughout. Printed: seconds from the promotion to the
first AA and to the delivery of the first message accepted after it, the answers that were not
AA, messages lost (AA'd and never delivered: 0 is the promise), duplicates at the receiver, and
order. Prints figures and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from figures import emit, parse_args

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig
from inturn.worker.store.migrate import migrate
from inturn.worker.testing import MllpReceiver
from tests.support.pgcluster import Cluster, missing

DEST = "bench/failover"
CHANNEL = "failover"


def message(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261201120000||ADT^A01|FO{n:06d}|P|2.5\r"
        f"PID|1||P{n}^^^HOSP^MR||DOE^JOHN\r"
    ).encode()


class Sender:
    """One MLLP client sending one message at a time, reconnecting when needed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, payload: bytes, timeout: float = 10.0) -> str:
        try:
            async with asyncio.timeout(timeout):
                if self.conn is None:
                    self.conn = await asyncio.open_connection("127.0.0.1", self.port)
                reader, writer = self.conn
                writer.write(frame(payload))
                await writer.drain()
                frames = FrameReader(1 << 20)
                while data := await reader.read(65536):
                    for event in frames.feed(data):
                        if isinstance(event, Frame):
                            return parse_ack(event.payload).code
                raise ConnectionError("closed")
        except (OSError, TimeoutError, ConnectionError):
            if self.conn is not None:
                self.conn[1].close()
            self.conn = None
            return "none"


async def run(messages: int, fail_after: int, attrs: str) -> dict[str, object]:
    cluster = Cluster()
    try:
        migrate(cluster.primary.dsn())
        standby = cluster.add_standby(synchronous=True)
        p, s = cluster.primary, standby
        dsn = (
            f"host=127.0.0.1,127.0.0.1 port={p.port},{s.port} user=postgres dbname=postgres"
            f" target_session_attrs={attrs}"
        )
        with psycopg.connect(p.dsn(), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO inturn_destination (destination, namespace, name, channel)"
                " VALUES (%s, 'bench', 'failover', %s)",
                (DEST, CHANNEL),
            )
        receiver = MllpReceiver()
        promoted_at = 0.0
        arrived: dict[bytes, float] = {}
        receiver.on_message = lambda payload, _: arrived.setdefault(
            payload.split(b"|")[9], time.monotonic()
        )
        config = IngestConfig(listeners=[ListenerConfig(CHANNEL, port=0)])
        answers: Counter[str] = Counter()
        accepted: list[int] = []
        first_aa_after = 0.0
        async with receiver, Ingest(config, dsn=dsn) as ingest:
            sender_cfg = MllpSenderConfig("127.0.0.1", receiver.port)
            worker = DestinationWorker(
                WorkerConfig(
                    destination=DEST,
                    channel=CHANNEL,
                    sender=sender_cfg,
                    retry=RetryPolicy(max_attempts=0, backoff_seconds=1, max_backoff_seconds=1),
                    idle_seconds=1,
                ),
                dsn,
                MllpSender(sender_cfg),
                PrometheusObserver(),
            )
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            client = Sender(ingest.mllp_ports[CHANNEL])
            n = 0
            while n < messages:
                if len(accepted) == fail_after and not promoted_at:
                    p.stop("immediate")
                    s.promote()
                    promoted_at = time.monotonic()
                code = await client.send(message(n))
                answers[code] += 1
                if code == "AA":
                    if promoted_at and not first_aa_after:
                        first_aa_after = time.monotonic() - promoted_at
                    accepted.append(n)
                    n += 1
                else:
                    await asyncio.sleep(0.1)
            async with asyncio.timeout(120):
                while len({r.split(b"|")[9] for r in receiver.received}) < messages:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # a second copy would come by now
            stop.set()
            await asyncio.wait_for(task, 30)
        ids = [int(r.split(b"|")[9][2:]) for r in receiver.received]
        distinct = list(dict.fromkeys(ids))
        lost = sorted(set(accepted) - set(ids))
        print(f"failover: {messages} messages, primary stopped after {fail_after} AA, {attrs}")
        print(f"   promotion -> first AA: {first_aa_after:.2f} s")
        first_new = arrived.get(f"FO{fail_after:06d}".encode())
        if first_new is not None:
            print(
                "   promotion -> delivery of the first message accepted after it:"
                f" {first_new - promoted_at:.2f} s"
            )
        print(f"   answers: {dict(answers)} (a message not answered AA is sent again)")
        print(f"   AA {len(accepted)}, delivered {len(ids)} ({len(distinct)} distinct)")
        print(f"   lost (AA and never delivered): {len(lost)}")
        print(f"   duplicates at the receiver: {len(ids) - len(distinct)}")
        print(f"   in order: {distinct == sorted(distinct)}")
        return {
            "promotion_to_first_aa_s": round(first_aa_after, 3),
            "promotion_to_first_new_delivery_s": (
                None if first_new is None else round(first_new - promoted_at, 3)
            ),
            "aa": len(accepted),
            "delivered": len(ids),
            "lost": len(lost),
            "duplicates": len(ids) - len(distinct),
            "in_order": distinct == sorted(distinct),
        }
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1100)
    parser.add_argument("--fail-after", type=int, default=400)
    parser.add_argument("--attrs", default="read-write")
    args = parse_args(parser, argv, {"messages": 30, "fail_after": 10})
    reason = missing()
    if reason:
        print(f"failover: skipped ({reason})")
        emit("failover", {"skipped": reason})
        return
    emit("failover", asyncio.run(run(args.messages, args.fail_after, args.attrs)))


if __name__ == "__main__":
    main()
