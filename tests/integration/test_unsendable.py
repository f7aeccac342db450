"""Kind 5: a message that can never be sent is refused at the door, or fails at once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from psycopg import AsyncConnection

from inturn.worker.hl7.ack import Ack, parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.spec.config import AckPolicy
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.ingest import http_post, running
from tests.support.pipeline import FAST_RETRY, register, rows, until, worker, worker_config

pytestmark = pytest.mark.store


def msg(control_id: str, obx: bytes = b"text") -> bytes:
    return (
        f"MSH|^~\\&|A|B|C|D|2026||ORU^R01|{control_id}|P|2.5.1\r".encode()
        + b"OBX|1|TX|X||"
        + obx
        + b"||||||F\r"
    )


@pytest_asyncio.fixture
async def ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    register(fresh_db, "ward/mllp", "both", sender_kind="mllp")
    register(fresh_db, "ward/http", "both", sender_kind="http")
    register(fresh_db, "ward/http-only", "web", sender_kind="http")
    async with running(fresh_db, "both") as started:
        yield started


async def post(ingest: Ingest, channel: str, payload: bytes) -> tuple[int, Ack]:
    return await http_post(ingest, payload, channel)


@pytest.mark.parametrize("byte", [b"\x1c", b"\x0b"], ids=["end-block", "start-block"])
async def test_refused_at_the_door_for_an_mllp_destination(
    ingest: Ingest, fresh_db: str, byte: bytes
) -> None:
    status, ack = await post(ingest, "both", msg("U1", b"a" + byte + b"b"))
    assert (status, ack.code, ack.error_code) == (400, "AR", "102")
    assert "ward/mllp" in (ack.error_text or "")
    assert rows(fresh_db) == []  # not stored for the HTTP destination either
    # The same message routed to HTTP destinations only is accepted: HTTP carries any bytes.
    status, ack = await post(ingest, "web", msg("U2", b"a" + byte + b"b"))
    assert (status, ack.code) == (200, "AA")
    assert [r["destination"] for r in rows(fresh_db)] == ["ward/http-only"]


async def test_refused_over_mllp_too(ingest: Ingest, fresh_db: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", ingest.mllp_ports["both"])
    # 0x0B inside a block is payload to a tolerant reader, and still unsendable onward.
    writer.write(frame(msg("U3", b"a\x0bb")))
    await writer.drain()
    frames = FrameReader(1 << 20)
    async with asyncio.timeout(10):
        while not (
            found := [e for e in frames.feed(await reader.read(4096)) if isinstance(e, Frame)]
        ):
            pass
    writer.close()
    ack = parse_ack(found[0].payload)
    assert (ack.code, ack.error_code) == ("AR", "102")
    assert rows(fresh_db) == []


async def enqueue(dsn: str, payloads: list[bytes]) -> None:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await queue.enqueue(
            conn, [NewItem("ward/q", "c", f"Q{i}", "ORU^R01", p) for i, p in enumerate(payloads)]
        )


async def test_a_stored_unsendable_item_fails_at_once_and_the_queue_goes_on(
    fresh_db: str,
) -> None:
    """Stored before the door refused such messages (or by another path): with maxAttempts
    above 0, no retry, the failed list, and the next head is delivered."""
    good = msg("Q1")
    await enqueue(fresh_db, [msg("Q0", b"x\x1cy"), good])
    async with MllpReceiver() as receiver:
        cfg = worker_config(
            "ward/q",
            MllpSenderConfig("127.0.0.1", receiver.port),
            retry=dataclasses.replace(FAST_RETRY, max_attempts=3),
        )
        async with worker(cfg, fresh_db):
            await receiver.wait_for(1)
            await until(lambda: rows(fresh_db, "ward/q")[1]["state"] == "delivered")
    first, _ = rows(fresh_db, "ward/q")
    assert (first["state"], first["attempts"]) == ("failed", 1)
    assert first["last_error"].startswith("unsendable: ") and "0x1C" in first["last_error"]
    assert receiver.received == [good]


async def test_retrying_for_ever_an_unsendable_item_holds_the_head(fresh_db: str) -> None:
    """maxAttempts 0 never lets a message go: unset, ``ackPolicy.unsendable`` follows it and
    the unsendable head waits (raised as stuck) with nothing overtaking it."""
    await enqueue(fresh_db, [msg("Q0", b"x\x0by"), msg("Q1")])
    async with MllpReceiver() as receiver:
        cfg = worker_config("ward/q", MllpSenderConfig("127.0.0.1", receiver.port))
        assert cfg.retry.max_attempts == 0
        async with worker(cfg, fresh_db):
            await until(lambda: rows(fresh_db, "ward/q")[0]["attempts"] >= 2)
    first, second = rows(fresh_db, "ward/q")
    assert first["state"] == "pending" and first["last_error"].startswith("unsendable: ")
    assert second["state"] == "pending" and receiver.received == []


async def test_ack_policy_can_keep_an_unsendable_item_waiting(fresh_db: str) -> None:
    await enqueue(fresh_db, [msg("Q0", b"x\x0by"), msg("Q1")])
    async with MllpReceiver() as receiver:
        cfg = worker_config(
            "ward/q",
            MllpSenderConfig("127.0.0.1", receiver.port),
            ack_policy=AckPolicy(unsendable="retry"),
        )
        async with worker(cfg, fresh_db):
            await until(lambda: rows(fresh_db, "ward/q")[0]["attempts"] >= 1)
    first, second = rows(fresh_db, "ward/q")
    assert first["state"] == "pending" and first["last_error"].startswith("unsendable: ")
    assert second["state"] == "pending" and receiver.received == []
