"""Kinds 2, 3 and 6 end to end: the worker, its MLLP sender, and real peers (inturn's own ingest
among them) with a real Postgres.

* an inturn relaying to another inturn's ingest delivers every MSH-15/MSH-16 combination, each
  exactly once, on one connection (the ingest answers what the sender waits for);
* a receiver that closes the connection after every ACK costs no attempt and no backoff.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from psycopg import AsyncConnection

from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.pipeline import register, rows, until, worker, worker_config

pytestmark = pytest.mark.store

CONDITIONS = ["", "AL", "NE", "ER", "SU"]


def msg(control_id: str, msh15: str = "", msh16: str = "") -> bytes:
    return (
        f"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|{control_id}|P|2.5.1|||{msh15}|{msh16}\rPID|1||42\r"
    ).encode()


async def enqueue(dsn: str, destination: str, payloads: list[bytes]) -> None:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await queue.enqueue(
            conn,
            [NewItem(destination, "c", parse_header(p).control_id, "ADT^A01", p) for p in payloads],
        )


def delivered(dsn: str, destination: str, count: int) -> bool:
    done = [r for r in rows(dsn, destination) if r["state"] == "delivered"]
    return len(done) == count


async def test_a_relay_to_inturn_delivers_every_msh15_msh16_combination(fresh_db: str) -> None:
    register(fresh_db, "far/inbox", "in")
    combos = list(itertools.product(CONDITIONS, CONDITIONS))
    payloads = [msg(f"R{i}", a, b) for i, (a, b) in enumerate(combos)]
    # A long attempt timeout: a wait for an answer that never comes would show as a stall.
    config = IngestConfig(listeners=[ListenerConfig("in", port=0)])
    async with Ingest(config, dsn=fresh_db) as far:
        await enqueue(fresh_db, "near/relay", payloads)
        sender = MllpSenderConfig("127.0.0.1", far.mllp_ports["in"])
        async with worker(worker_config("near/relay", sender), fresh_db) as running:
            await until(lambda: delivered(fresh_db, "near/relay", len(payloads)), timeout=60)
            opened = running.sender.connections_opened  # type: ignore[attr-defined]
    relayed = rows(fresh_db, "near/relay")
    assert [r["attempts"] for r in relayed] == [1] * len(payloads)  # never a retry
    assert [bytes(r["payload"]) for r in rows(fresh_db, "far/inbox")] == payloads  # once each
    assert opened == 1


async def test_a_receiver_closing_after_each_ack_costs_no_attempt(fresh_db: str) -> None:
    """Each ACK is followed 5 to 30 ms later by a close; with a one-hour backoff, any failed
    attempt would stall the queue: all ten go through at one attempt each, once each."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(1 << 20)
        try:
            while data := await reader.read(65536):
                for event in frames.feed(data):
                    if isinstance(event, Frame):
                        received.append(event.payload)
                        cid = parse_header(event.payload).control_id
                        ack = f"MSH|^~\\&|C|D|A|B|2026||ACK|X{cid}|P|2.5.1\rMSA|AA|{cid}\r"
                        writer.write(frame(ack.encode()))
                        await writer.drain()
                        await asyncio.sleep(0.005 + 0.0025 * (len(received) % 10))
                        return
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    payloads = [msg(f"K{i}") for i in range(10)]
    try:
        await enqueue(fresh_db, "ward/closer", payloads)
        cfg = worker_config("ward/closer", MllpSenderConfig("127.0.0.1", port))
        slow = cfg.retry.__class__(max_attempts=0, backoff_seconds=3600, max_backoff_seconds=3600)
        cfg = worker_config("ward/closer", cfg.sender, retry=slow)
        async with worker(cfg, fresh_db):
            await until(lambda: delivered(fresh_db, "ward/closer", 10), timeout=60)
    finally:
        server.close()
    assert [r["attempts"] for r in rows(fresh_db, "ward/closer")] == [1] * 10
    assert received == payloads


async def test_enhanced_receiver_sends_each_message_once(fresh_db: str) -> None:
    """The issue's receiver: CA at once, AA a moment later on the same connection."""
    payloads = [msg(f"E{i}", "AL", "NE") for i in range(10)]
    async with MllpReceiver(ack_code="CA") as receiver:
        receiver.followup_code = "AA"
        await enqueue(fresh_db, "ward/enhanced", payloads)
        cfg = worker_config("ward/enhanced", MllpSenderConfig("127.0.0.1", receiver.port))
        async with worker(cfg, fresh_db):
            await until(lambda: delivered(fresh_db, "ward/enhanced", 10), timeout=60)
    assert receiver.received == payloads
    assert [r["attempts"] for r in rows(fresh_db, "ward/enhanced")] == [1] * 10
