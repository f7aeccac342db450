"""Production weather benchmark: copies delivered and answers given while Postgres misbehaves.

    .venv/bin/python bench/weather.py [--dsn DSN] [--messages 100] [--holds 5]

Prints figures and asserts nothing about time. In a fresh database of its own:

1. **Marks refused by ``lock_timeout``.** The database gets ``lock_timeout = 200ms``; a worker
   drains ``--messages`` messages into a local MLLP receiver that answers AA after 20 ms, while a
   second session takes ``SELECT ... FOR UPDATE`` on the current head, ``--holds`` times, for
   ``--hold-seconds`` each: every such head is sent, answered AA, and its delivered mark is
   refused until the lock goes. Printed: copies received per message (1 is the promise), marks
   repeated, and the seconds from each release to the mark.
2. **A forgotten lock without ``lock_timeout``.** One head's row is held for ``--hold-seconds``
   with the worker's lock-wait threshold at 1 s: printed are the seconds counted by
   ``inturn_lock_wait_seconds`` against the seconds held, and whether ``/readyz`` named the
   holder.
3. **AE means nothing was kept.** Ingest with ``--duplicate-window 0`` and a store timeout of
   1 s; the queue table is locked (``LOCK TABLE ... IN SHARE MODE``) for ``--lock-seconds``
   while ``--senders`` MLLP connections each send one message. Printed: the answers (AE, AA,
   none), the rows found once the lock is gone (0 is the promise), the time from the store
   timeout to each AE (the cancel and its rollback), and, after every AE'd message is sent
   again, the copies a worker delivers per message.

The database is ``--dsn`` / ``INTURN_DSN`` (a server; the benchmark creates and drops its own
database there), else an embedded Postgres started with ``pgserver``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator

import psycopg
from delivery import fresh_database, percentile, postgres_server
from figures import emit, parse_args
from prometheus_client import REGISTRY
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict

from inturn.worker.drain.health import make_app
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig
from inturn.worker.store import queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver

DEST = "bench/weather"
CHANNEL = "weather"


def message(control_id: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261201120000||ADT^A01|{control_id}|P|2.5\r"
        "PID|1||P1^^^HOSP^MR||DOE^JOHN\r"
    ).encode()


def control_id_of(payload: bytes) -> str:
    return payload.split(b"|")[9].decode()


@contextlib.asynccontextmanager
async def worker(dsn: str, port: int, lock_wait_seconds: float) -> AsyncIterator[DestinationWorker]:
    sender = MllpSenderConfig("127.0.0.1", port)
    config = WorkerConfig(
        destination=DEST,
        channel=CHANNEL,
        sender=sender,
        retry=RetryPolicy(max_attempts=0, backoff_seconds=1, max_backoff_seconds=1),
        idle_seconds=1,
    )
    running = DestinationWorker(
        config, dsn, MllpSender(sender), PrometheusObserver(), lock_wait_seconds=lock_wait_seconds
    )
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def pending(dsn: str) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT id FROM inturn_delivery WHERE destination = %s AND state = 'pending'"
            " ORDER BY id",
            (DEST,),
        )
        return [int(r[0]) for r in await cur.fetchall()]


async def enqueue(dsn: str, ids: list[str]) -> None:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await queue.enqueue(conn, [NewItem(DEST, CHANNEL, c, "ADT^A01", message(c)) for c in ids])


async def marks_under_lock_timeout(dsn: str, messages: int, holds: int, hold: float) -> None:
    dbname = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" SET lock_timeout = 200')
    await enqueue(dsn, [f"LT{n:05d}" for n in range(messages)])
    before = sample("inturn_store_step_failures_total", destination=DEST, step="mark")
    release_to_mark: list[float] = []
    every = max(messages // (holds + 1), 1)
    async with MllpReceiver() as rx, worker(dsn, rx.port, 30.0):
        rx.delay_seconds = 0.02  # a receiver that takes 20 ms, so that each hold meets a head
        for n in range(holds):
            await rx.wait_for(min((n + 1) * every, messages - 1))
            heads = await pending(dsn)
            if not heads:
                break
            held = heads[1] if len(heads) > 1 else heads[0]  # the next head: not yet sent
            holder = await AsyncConnection.connect(dsn, application_name="bench-holder")
            await holder.execute("SELECT id FROM inturn_delivery WHERE id = %s FOR UPDATE", (held,))
            await asyncio.sleep(hold)
            released = time.perf_counter()
            await holder.rollback()
            await holder.close()
            while held in await pending(dsn):
                await asyncio.sleep(0.01)
            release_to_mark.append(time.perf_counter() - released)
        while await pending(dsn):
            await asyncio.sleep(0.1)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" RESET lock_timeout')
    copies = Counter(control_id_of(p) for p in rx.received)
    repeated = sample("inturn_store_step_failures_total", destination=DEST, step="mark") - before
    print("1. delivered marks refused by lock_timeout = 200ms")
    print(f"   messages {messages}, heads held {len(release_to_mark)} x {hold:g}s")
    print(f"   copies received: {dict(Counter(copies.values()))} (copies: messages)")
    print(f"   marks repeated on the live session: {repeated:.0f}")
    if release_to_mark:
        print(
            f"   release -> mark: p50 {percentile(release_to_mark, 50):.2f}s,"
            f" max {max(release_to_mark):.2f}s (the step backoff doubles from 0.5s to 10s)"
        )


async def forgotten_lock(dsn: str, hold: float) -> None:
    await enqueue(dsn, ["FL00001"])
    [head] = await pending(dsn)
    holder = await AsyncConnection.connect(dsn, application_name="forgotten-select")
    await holder.execute("SELECT id FROM inturn_delivery WHERE id = %s FOR UPDATE", (head,))
    counted = sample("inturn_lock_wait_seconds_total", destination=DEST)
    named = False
    async with MllpReceiver() as rx, worker(dsn, rx.port, 1.0) as running:
        await rx.wait_for(1)
        started = time.perf_counter()
        while time.perf_counter() - started < hold:
            status, _, body = make_app([running]).answer("/readyz")
            named = named or (status == 503 and b"forgotten-select" in body)
            await asyncio.sleep(0.1)
        released = time.perf_counter()
        await holder.rollback()
        await holder.close()
        while await pending(dsn):
            await asyncio.sleep(0.01)
        marked = time.perf_counter() - released
    waited = sample("inturn_lock_wait_seconds_total", destination=DEST) - counted
    print("2. a forgotten SELECT ... FOR UPDATE on the head, no lock_timeout, threshold 1s")
    print(f"   held {hold:g}s after the send; inturn_lock_wait_seconds counted {waited:.1f}s")
    print(f"   /readyz named the holder: {named}; release -> mark {marked:.3f}s")
    print(f"   copies received: {len(rx.received)}")


async def ae_means_nothing_kept(dsn: str, senders: int, lock_seconds: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES (%s, 'bench', 'weather', %s) ON CONFLICT DO NOTHING",
            (DEST, CHANNEL),
        )
        conn.execute("TRUNCATE inturn_delivery CASCADE")
    config = IngestConfig(
        listeners=[ListenerConfig(CHANNEL, port=0)], duplicate_window=0, store_timeout=1.0
    )
    answers: dict[str, str] = {}
    after_timeout: list[float] = []
    async with Ingest(config, dsn=dsn) as ingest:
        port = ingest.mllp_ports[CHANNEL]

        async def send(control_id: str) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sent = time.perf_counter()
            writer.write(frame(message(control_id)))
            await writer.drain()
            frames = FrameReader(1 << 20)
            code = "none"
            while data := await reader.read(65536):
                events = [e for e in frames.feed(data) if isinstance(e, Frame)]
                if events:
                    code = parse_ack(events[0].payload).code
                    break
            if code == "AE" and control_id not in answers:
                after_timeout.append(time.perf_counter() - sent - 1.0)
            answers[control_id] = code
            writer.close()

        holder = await AsyncConnection.connect(dsn, application_name="bench-table-locker")
        await holder.execute("LOCK TABLE inturn_delivery IN SHARE MODE")
        ids = [f"AE{n:05d}" for n in range(senders)]
        sending = asyncio.gather(*(send(c) for c in ids))
        await asyncio.sleep(lock_seconds)
        await holder.rollback()
        await holder.close()
        await sending
        first = dict(answers)
        await asyncio.sleep(1.0)  # anything still able to commit would have by now
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM inturn_delivery").fetchone()
        kept = int(row[0]) if row else -1
        accepted = [c for c, code in first.items() if code == "AA"]
        resent = [c for c, code in first.items() if code != "AA"]
        await asyncio.gather(*(send(c) for c in resent))
        async with MllpReceiver() as rx, worker(dsn, rx.port, 30.0):
            while len(rx.received) < senders:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # a second copy would come by now
    copies = Counter(control_id_of(p) for p in rx.received)
    print(
        f"3. ingest, --duplicate-window 0, store timeout 1s, queue table locked {lock_seconds:g}s"
    )
    print(f"   answers during the lock: {dict(Counter(first.values()))}")
    print(f"   rows kept of AE'd messages once the lock went: {kept - len(accepted)}")
    if after_timeout:
        p50, top = percentile(after_timeout, 50) * 1000, max(after_timeout) * 1000
        print(f"   store timeout -> AE (cancel, rollback seen): p50 {p50:.0f} ms, max {top:.0f} ms")
    delivered = dict(Counter(copies.values()))
    print(f"   after resending every AE'd message: copies delivered {delivered} (copies: messages)")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"))
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--holds", type=int, default=5)
    parser.add_argument("--hold-seconds", type=float, default=3.0)
    parser.add_argument("--senders", type=int, default=40)
    parser.add_argument("--lock-seconds", type=float, default=3.0)
    args = parse_args(
        parser,
        argv,
        {"messages": 10, "holds": 1, "hold_seconds": 1.5, "senders": 4, "lock_seconds": 1.5},
    )
    with postgres_server(args.dsn) as (server, _), fresh_database(server, "weather") as dsn:
        migrate(dsn)
        await marks_under_lock_timeout(dsn, args.messages, args.holds, args.hold_seconds)
        await forgotten_lock(dsn, args.hold_seconds)
        await ae_means_nothing_kept(dsn, args.senders, args.lock_seconds)
    emit("weather", {"messages": args.messages, "senders": args.senders})


if __name__ == "__main__":
    asyncio.run(main())
