"""``inturn send`` tells a message never sent (no connection) from one whose connection closed
before its ACK (it may have been stored: sending it again is a duplicate the window catches).
Real sockets: a port nobody listens on, and a peer that reads the whole frame and hangs up."""

from __future__ import annotations

import asyncio

from inturn.worker.cli.send import Answer, Outgoing, send_mllp
from tests.support.ports import free_port

MESSAGE = b"MSH|^~\\&|A|B|C|D|20260101000000||ADT^A01|Q1|P|2.5\rPID|1||X1\r"


async def answers(port: int) -> list[Answer]:
    out: list[Answer] = []
    message = Outgoing(source="m.hl7", payload=MESSAGE)
    await send_mllp([message], "127.0.0.1", port, None, 5.0, lambda m, a: out.append(a))
    return out


async def test_no_connection_is_not_sent() -> None:
    [answer] = await answers(free_port())
    assert answer.code == "--" and answer.transport
    assert answer.detail is not None
    assert answer.detail.startswith("unreachable: connect 127.0.0.1:")
    assert answer.detail.endswith(" (not sent)")


async def test_a_connection_closed_before_the_ack_may_have_stored_it() -> None:
    got = bytearray()

    async def read_and_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.extend(await reader.readuntil(b"\x1c\r"))
        writer.close()

    server = await asyncio.start_server(read_and_hang_up, "127.0.0.1", 0)
    async with server:
        [answer] = await answers(server.sockets[0].getsockname()[1])
    assert bytes(got) == b"\x0b" + MESSAGE + b"\x1c\r"
    assert answer.code == "--" and answer.transport
    assert answer.detail == (
        "closed before the ACK: the receiver closed the connection before replying (sent: it may"
        " have been stored; sending it again is a duplicate the duplicate window catches)"
    )
