"""Ingest in tests: its configuration, a running ingest on free ports, an MLLP client of it,
HTTP posts, and small valid messages (``from tests.support.ingest import ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from inturn.worker.hl7.ack import Ack, parse_ack
from inturn.worker.hl7.batch import split_batch
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.store.model import Message
from tests.support.local import exchange

HOST = "127.0.0.1"
#: The file and batch headers of the batches :func:`batch` makes.
FHS = b"FHS|^~\\&|LAB|HOSP|EHR|HOSP|20261201||||F-7\r"
BHS = b"BHS|^~\\&|LAB|HOSP|EHR|HOSP|20261201||||B-7\r"


def msg(
    control_id: str,
    message_type: str = "ADT^A01^ADT_A01",
    *,
    msh15: str = "",
    msh16: str = "",
    body: str = "PID|1||12345^^^HOSP^MR||DOE^JANE\r",
) -> bytes:
    """A small valid message (default delimiters, CR separators)."""
    msh = (
        f"MSH|^~\\&|SENDAPP|SENDFAC|RECVAPP|RECVFAC|20240101120000||{message_type}|{control_id}"
        f"|P|2.5.1|||{msh15}|{msh16}\r"
    )
    return (msh + body).encode()


def minimal(control_id: str, message_type: str = "ADT^A01") -> bytes:
    """The smallest valid message: an MSH (HL7 2.5.1) and a PID of patient 42."""
    return (
        f"MSH|^~\\&|A|B|C|D|20260101||{message_type}|{control_id}|P|2.5.1\rPID|1||42\r"
    ).encode()


class Client:
    """A minimal MLLP client for the tests: write raw bytes, read framed replies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.framer = FrameReader(1 << 20)
        self.pending: list[bytes] = []

    @classmethod
    async def connect(cls, port: int, **kwargs: Any) -> Client:
        reader, writer = await asyncio.open_connection(HOST, port, **kwargs)
        return cls(reader, writer)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self, timeout: float = 10.0) -> bytes:
        """The next framed reply; raises EOFError when the server closed the connection."""
        async with asyncio.timeout(timeout):
            while not self.pending:
                data = await self.reader.read(65536)
                if not data:
                    raise EOFError("connection closed")
                self.pending.extend(
                    e.payload for e in self.framer.feed(data) if isinstance(e, Frame)
                )
        return self.pending.pop(0)

    async def ack(self, timeout: float = 10.0) -> Ack:
        return parse_ack(await self.reply(timeout))

    async def send(self, payload: bytes) -> Ack:
        await self.write(frame(payload))
        return await self.ack()

    async def closed_by_server(self, timeout: float = 5.0) -> bool:
        async with asyncio.timeout(timeout):
            return await self.reader.read(65536) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def config(**overrides: Any) -> IngestConfig:
    base: dict[str, Any] = {
        "listeners": [ListenerConfig("adt", HOST, 0), ListenerConfig("lab", HOST, 0)],
        "http": (HOST, 0),
        "http_insecure": True,
        "ops": (HOST, 0),
        "refresh_seconds": 0.2,
        "store_timeout": 3.0,
        "shutdown_grace": 2.0,
    }
    base.update(overrides)
    return IngestConfig(**base)


def pull_all(dsn: str) -> int:
    """Pull every destination's messages from the channel log into its queue (what each one's
    worker does when woken; ``inturn_pull_for``, migration 0038), the destinations being those
    any route set names; how many rows were pulled."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        named = conn.execute(
            "SELECT DISTINCT d, channel FROM inturn_route, unnest(destinations) AS d ORDER BY d"
        ).fetchall()
        total = 0
        for destination, channel in named:
            with conn.transaction():
                conn.execute(  # a destination never registered reads its route sets' channel
                    "INSERT INTO inturn_cursor (destination, channel) VALUES (%s, %s)"
                    " ON CONFLICT DO NOTHING",
                    (destination, channel),
                )
                got = conn.execute("SELECT inturn_pull_for(%s, 100000)", (destination,))
                total += int(got.fetchone()[0])  # type: ignore[index]
        return total


def rows(dsn: str, where: str = "true") -> list[tuple[Any, ...]]:
    """(id, destination, channel, control_id, message_type, payload) of every delivery row, the
    channel log pulled first (:func:`pull_all`): what each destination's queue holds, the
    payload its own or its log row's (as stored: sealed or clear). ``where`` may name any
    column of ``inturn_delivery``."""
    pull_all(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT id, destination, channel, control_id, message_type, full_payload FROM"
            " (SELECT d.*, coalesce(d.payload, m.payload) AS full_payload FROM inturn_delivery d"
            "   LEFT JOIN inturn_message m ON m.id = d.message_id) AS x"
            f" WHERE {where} ORDER BY id"
        ).fetchall()


def batch(*messages: bytes, trailer: bool = True) -> bytes:
    """``messages`` in one HL7 batch file (:data:`FHS`, :data:`BHS`), with its BTS/FTS trailer
    unless ``trailer`` is false."""
    body = FHS + BHS + b"".join(messages)
    return body + (f"BTS|{len(messages)}\rFTS|1\r".encode() if trailer else b"")


def acks(answer: bytes) -> list[tuple[str, str, str | None, str | None]]:
    """(MSA-1, MSA-2, ERR-3.1, ERR-8) of each ACK in an answering batch."""
    return [
        (a.code, a.control_id, a.error_code, a.error_text)
        for a in (parse_ack(m) for m in split_batch(answer, max_messages=100).messages)
    ]


@contextlib.asynccontextmanager
async def running(dsn: str, channel: str = "c", **options: Any) -> AsyncIterator[Ingest]:
    """Ingest on ``dsn`` with an MLLP listener for ``channel`` and plain HTTP (no credentials,
    ``http_insecure``), each on a free port of :data:`HOST`; ``options`` are more
    :class:`IngestConfig` fields. Stopped when the block ends."""
    config = IngestConfig(
        listeners=[ListenerConfig(channel, port=0)],
        http=(HOST, 0),
        http_insecure=True,
        **options,
    )
    async with Ingest(config, dsn=dsn) as ingest:
        yield ingest


async def mllp_ack(ingest: Ingest, payload: bytes, channel: str = "c") -> Ack:
    """Send ``payload`` on a new MLLP connection to ``channel``'s listener; its ACK (30 s at
    most; EOFError when ingest closed the connection unanswered)."""
    reply = await exchange(ingest.mllp_ports[channel], payload)
    if reply is None:
        raise EOFError("ingest closed the connection without an answer")
    return parse_ack(reply)


async def http_post(ingest: Ingest, payload: bytes, channel: str = "c") -> tuple[int, Ack]:
    """POST ``payload`` to ``/channels/CHANNEL/messages``: the HTTP status and the ACK."""
    url = f"http://{HOST}:{ingest.http_port}/channels/{channel}/messages"
    async with aiohttp.ClientSession() as session, session.post(url, data=payload) as response:
        return response.status, parse_ack(await response.read())


def sealing_ingest(keys_dir: Path, key_dsn: str) -> IngestConfig:
    """Ingest on channel ``adt`` (a free port) sealing with ``keys_dir`` and the key store."""
    return IngestConfig(
        listeners=[ListenerConfig("adt", "127.0.0.1", 0)],
        refresh_seconds=0.2,
        store_timeout=5.0,
        shutdown_grace=2.0,
        payload_keys=str(keys_dir),
        key_dsn=key_dsn,
    )


@contextlib.asynccontextmanager
async def sender(running: Ingest) -> AsyncIterator[MllpSender]:
    """An MLLP client of ``running``'s ``adt`` listener (closed after the block)."""
    client = MllpSender(MllpSenderConfig("127.0.0.1", running.mllp_ports["adt"]))
    try:
        yield client
    finally:
        await client.close()


def to_store(payload: bytes, message_type: str) -> Message:
    """``payload`` as ingest hands it to the store (``store_batch``): its MSH-10 read from it,
    ``message_type`` as given, its SHA-256 digest."""
    return Message(
        control_id=parse_header(payload).control_id,
        message_type=message_type,
        payload=payload,
        digest=hashlib.sha256(payload).digest(),
    )
