"""Kind 1: content bytes are never changed in flight.

Ingest stores, every sender sends and ``inturn queue payload`` prints the same bytes: the
received ones, with LF / CRLF segment terminators turned into CR only for messages that do not
already end their segments with CR (``inturn.worker.hl7.terminators``).
"""

from __future__ import annotations

import asyncio

import pytest

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.http import HttpSenderConfig
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.pipeline import cli, register, rows, until, worker, worker_config

pytestmark = pytest.mark.store

MSH = "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20260101120000||ORU^R01|{id}|P|2.5.1"

MESSAGES = [
    # CR terminators with a literal LF inside OBX-5: byte for byte, LF and all.
    (MSH + "\rOBX|1|TX|RPT^Report||Line one\nLine two||||||F\r").format(id="CR-LF-IN-FIELD"),
    # CR terminators with CRLF inside a field: still byte for byte.
    (MSH + "\rNTE|1||a\r\nb\rOBX|1|TX|X||y\r").format(id="CR-CRLF-IN-FIELD"),
    # LF-only file: every LF becomes CR.
    (MSH + "\nPID|1||42\nOBX|1|TX|X||text\n").format(id="LF-FILE"),
    # CRLF file with an LF inside a field: the CRLF pairs become CR, the lone LF stays.
    (MSH + "\r\nOBX|1|TX|X||one\ntwo\r\n").format(id="CRLF-FILE"),
    # Non-ASCII bytes and no final terminator.
    (MSH + "\rPID|1||42||MÜLLER^JÖRG").format(id="UTF8-NO-FINAL"),
]


async def _post_mllp(port: int, payload: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(frame(payload))
        await writer.drain()
        frames = FrameReader(1 << 20)
        while True:
            events = [e for e in frames.feed(await reader.read(65536)) if isinstance(e, Frame)]
            if events:
                return parse_ack(events[0].payload).code
    finally:
        writer.close()


async def test_stored_sent_and_printed_bytes_agree(fresh_db: str) -> None:
    register(fresh_db, "ward/mllp", "c")
    register(fresh_db, "ward/http", "c")
    payloads = [m.encode("utf-8") for m in MESSAGES]
    config = IngestConfig(listeners=[ListenerConfig("c", port=0)])
    async with Ingest(config, dsn=fresh_db) as ingest:
        for payload in payloads:
            assert await _post_mllp(ingest.mllp_ports["c"], payload) == "AA"

    expected = [normalise_terminators(p) for p in payloads]
    # The CR messages are stored exactly as received.
    assert expected[0] == payloads[0] and expected[1] == payloads[1] and expected[4] == payloads[4]
    assert b"\n" not in expected[2] and expected[3].count(b"\n") == 1
    for destination in ("ward/mllp", "ward/http"):
        assert [bytes(r["payload"]) for r in rows(fresh_db, destination)] == expected

    async with MllpReceiver() as mllp_rx, HttpReceiver() as http_rx:
        mllp_cfg = worker_config("ward/mllp", MllpSenderConfig("127.0.0.1", mllp_rx.port))
        http_cfg = worker_config("ward/http", HttpSenderConfig(http_rx.url))
        async with worker(mllp_cfg, fresh_db), worker(http_cfg, fresh_db):
            await mllp_rx.wait_for(len(payloads))
            await until(lambda: len(http_rx.received) >= len(payloads))
    assert mllp_rx.received == expected
    assert http_rx.received == expected

    for row in rows(fresh_db):
        printed = await asyncio.to_thread(
            cli, fresh_db, "queue", "payload", str(row["id"]), "--why", "byte check"
        )
        assert printed.stdout == bytes(row["payload"])
