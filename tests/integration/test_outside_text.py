"""Kind 7: a receiver's text never forges a line. The database keeps it as received (escapes
decoded); ``inturn queue list``, ``show`` and their JSON show it with control characters escaped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
from psycopg import AsyncConnection

from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.text import logs
from tests.support.pipeline import cli, rows, until, worker, worker_config

pytestmark = pytest.mark.store

FORGED = "12:00:00 INFO    inturn.worker: destination ward/x: delivered id=1"
NACK = (
    "MSH|^~\\&|R|F|S|F|2026||ACK|N1|P|2.5.1\r"
    "MSA|AE|{cid}|Bad\\X0D0A\\" + FORGED + "\r"
    "ERR|||207^Second\\X0A\\line^HL70357|E\r"
)


async def test_a_nack_text_with_line_breaks_stays_on_its_line(
    fresh_db: str, capfd: pytest.CaptureFixture[str]
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(1 << 20)
        while data := await reader.read(65536):
            for event in frames.feed(data):
                if isinstance(event, Frame):
                    cid = parse_header(event.payload).control_id
                    writer.write(frame(NACK.format(cid=cid).encode()))
                    await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    payload = b"MSH|^~\\&|A|B|C|D|2026||ADT^A01|C\x01ID|P|2.5.1\rPID|1||42\r"
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [NewItem("ward/x", "c", "C\x01ID", "ADT^A01", payload)])
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("INFO")
        cfg = worker_config("ward/x", MllpSenderConfig("127.0.0.1", port))
        async with worker(cfg, fresh_db):
            await until(lambda: rows(fresh_db, "ward/x")[0]["attempts"] >= 1)
    finally:
        server.close()
        root.handlers[:], level = saved
        root.setLevel(level)

    [row] = rows(fresh_db, "ward/x")
    assert "Bad\r\n" + FORGED in row["last_error"]  # kept as received (escape decoded)
    assert "Second\nline" in row["last_error"]

    # Every log line the worker wrote starts with its own timestamp.
    for line in capfd.readouterr().err.splitlines():
        if line.strip():
            assert re.match(r"\d\d:\d\d:\d\d (INFO|WARNING|ERROR|DEBUG)", line), line

    listed = (await asyncio.to_thread(cli, fresh_db, "queue", "list")).stdout.decode()
    assert len(listed.splitlines()) == 3  # header, one item, "1 of 1"
    assert "Bad\\r\\n12:00:00" in listed and "C\\x01ID" in listed

    shown = await asyncio.to_thread(cli, fresh_db, "queue", "show", str(row["id"]))
    lines = shown.stdout.decode().splitlines()
    assert sum(line.startswith("lastError:") for line in lines) == 1
    assert not any(line.startswith("12:00:00") for line in lines)

    for args in (("queue", "list", "--json"), ("queue", "show", "--json", str(row["id"]))):
        out = json.loads((await asyncio.to_thread(cli, fresh_db, *args)).stdout)
        item = out["items"][0] if "items" in out else out
        assert "\r" not in item["lastError"] and "\n" not in item["lastError"]
        assert "Bad\\r\\n12:00:00" in item["lastError"]
        assert item["controlId"] == "C\\x01ID"
