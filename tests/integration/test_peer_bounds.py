"""Every read of what a peer sends is bounded: an HTTP receiver answering with a 256 MiB body
(which took a worker from 39 to 562 MiB) costs the HTTP sender at most ``maxResponseBytes`` of
reading, and its status alone decides the outcome; ingest's HTTP side reads a body only as far
as its memory budget has room."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.http import HttpSender, HttpSenderConfig

MIB = 1024 * 1024
MSG = b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|HUGE1|P|2.5\rPID|1||1^^^H\r"


class HugeAnswer:
    """An HTTP receiver whose answer body is 256 MiB (streamed); counts what it wrote."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.written = 0
        self.finished = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=self.status)
        response.content_length = 256 * MIB
        await response.prepare(request)
        chunk = b"x" * MIB
        try:
            for _ in range(256):
                await response.write(chunk)
                self.written += len(chunk)
            self.finished = True
        except (ConnectionError, OSError):
            pass
        return response


@pytest.fixture
async def huge() -> AsyncIterator[tuple[HugeAnswer, str]]:
    answer = HugeAnswer(200)
    app = web.Application()
    app.router.add_post("/hl7", answer.handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield answer, f"http://127.0.0.1:{port}/hl7"
    finally:
        await runner.cleanup()


async def test_a_256_mib_answer_is_read_only_up_to_the_bound(
    huge: tuple[HugeAnswer, str],
) -> None:
    answer, url = huge
    sender = HttpSender(HttpSenderConfig(url, max_response_bytes=MIB))
    await sender.send(MSG)  # 200: delivered, whatever the body
    await sender.close()
    await asyncio.sleep(0.2)
    assert not answer.finished
    assert answer.written < 64 * MIB  # the sender hung up after 1 MiB (socket buffers aside)


async def test_a_refusal_with_a_huge_body_is_still_a_refusal(
    huge: tuple[HugeAnswer, str],
) -> None:
    answer, url = huge
    answer.status = 503
    sender = HttpSender(HttpSenderConfig(url, max_response_bytes=64 * 1024))
    with pytest.raises(DeliveryError) as raised:
        await sender.send(MSG)
    await sender.close()
    assert raised.value.outcome == "http" and "503" in str(raised.value)
    assert answer.written < 64 * MIB


async def test_ingest_reads_an_http_body_only_when_its_budget_has_room(fresh_db: str) -> None:
    """A budget of one largest message: while an MLLP frame holds most of it, an HTTP message
    waits and is answered 503 with AE "busy" (nothing kept); once the frame is stored and
    answered, the same message is taken."""
    import aiohttp

    from inturn.worker.hl7.ack import parse_ack
    from inturn.worker.hl7.mllp import SB
    from inturn.worker.ingest.budget import CONNECTION_BYTES, limit_for
    from inturn.worker.ingest.service import Ingest
    from tests.support.ingest import HOST, Client, config, msg
    from tests.support.pipeline import register

    register(fresh_db, "hospital/adt-out", "adt")
    largest = MIB
    cfg = config(
        max_frame_bytes=largest,
        memory_limit=limit_for(largest + CONNECTION_BYTES, 1),
        busy_wait=0.5,
    )
    big = msg("BIGFRAME", body="OBX|1|ED|PDF||" + "A" * (largest - 200) + "\r")
    small = msg("HTTP1", body="OBX|1|TX|||" + "B" * (MIB // 2) + "\r")
    async with Ingest(cfg, dsn=fresh_db) as ingest, aiohttp.ClientSession() as http:
        url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
        c = await Client.connect(ingest.mllp_ports["adt"])
        wire = bytes([SB]) + big
        await c.write(wire[: len(wire) - 10])  # most of a frame, held while it is read
        await asyncio.sleep(0.3)
        async with http.post(url, data=small) as response:
            busy = (response.status, parse_ack(await response.read()))
        await c.write(wire[len(wire) - 10 :] + b"\x1c\r")
        mllp = await c.ack()
        async with http.post(url, data=small) as response:
            taken = (response.status, parse_ack(await response.read()))
        await c.close()
    assert busy[0] == 503 and busy[1].code == "AE" and "busy" in (busy[1].error_text or "")
    assert mllp.code == "AA"
    assert taken[0] == 200 and taken[1].code == "AA"
    assert ingest.budget is not None and ingest.budget.used == 0


async def test_a_trickling_frame_meets_its_deadline(fresh_db: str) -> None:
    """One byte every 0.2 s never trips the 30 s silence timeout, but the frame's overall
    deadline closes the connection, its bytes dropped and nothing stored."""
    import time

    from inturn.worker.hl7.mllp import SB
    from inturn.worker.ingest.service import Ingest
    from tests.support.ingest import Client, config, rows
    from tests.support.pipeline import register

    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(frame_deadline=1.5, frame_timeout=30), dsn=fresh_db) as ingest:
        c = await Client.connect(ingest.mllp_ports["adt"])
        await c.write(bytes([SB]) + b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|SLOW|P|2.5\r")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 20:
            try:
                await c.write(b"Z")
            except (ConnectionError, OSError):
                closed = True
                break
            if c.reader.at_eof():
                closed = True
                break
            await asyncio.sleep(0.2)
        if not closed:
            closed = await c.closed_by_server(timeout=1)
        await c.close()
    assert closed
    assert rows(fresh_db) == []


async def test_an_http_body_that_trickles_meets_the_deadline(fresh_db: str) -> None:
    """A declared body that never arrives whole holds its room only until the deadline: 408."""
    from inturn.worker.ingest.service import Ingest
    from tests.support.ingest import HOST, config, rows
    from tests.support.pipeline import register

    register(fresh_db, "hospital/adt-out", "adt")
    async with Ingest(config(frame_deadline=1.5), dsn=fresh_db) as ingest:
        reader, writer = await asyncio.open_connection(HOST, ingest.http_port)
        writer.write(
            b"POST /channels/adt/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nMSH|"
        )
        await writer.drain()
        async with asyncio.timeout(20):
            status = await reader.readline()
        held = ingest.budget.used if ingest.budget is not None else -1
        writer.close()
    assert status.startswith(b"HTTP/1.1 408")
    assert held == 0
    assert rows(fresh_db) == []
