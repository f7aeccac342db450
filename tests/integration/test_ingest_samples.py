"""Every sample message, sent by a client none of us wrote (python-hl7's ``mllp_send``), through a
real listener: each gets its answer and the stored rows hold exactly the bytes on the wire.

``mllp_send -f FILE`` reads MLLP-framed messages from FILE, strips leading and trailing SB and CR
bytes from each (so a message's final CR does not go out) and re-frames it; it sends one message,
waits for one reply, then sends the next, over one connection. To compare against what really went
over the wire rather than against a guess of that normalisation, a small proxy between the client
and ingest records the client's bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from inturn.worker.hl7.ack import ack_code, parse_ack
from inturn.worker.hl7.batch import is_batch, split_batch
from inturn.worker.hl7.expect import answer_codes
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from tests.support.local import mllp_send_file

pytestmark = pytest.mark.store

HOST = "127.0.0.1"

#: Samples that are not acceptable messages, and why (they must get AR and not be stored).
NOT_MESSAGES = {
    "Test__Message__msh_present_but_missing_all_fields.hl7": "101",  # MSH| and nothing else
    "Test__Message__msh_present_but_missing_msh-2.hl7": "101",  # empty MSH-2
    "Test__Message__msh_present_but_missing_msh-10.hl7": "101",  # no control ID
}
#: Samples that are HL7 batches (FHS/BHS): accepted whole, answered by a batch of ACKs.
BATCHES = ["Test__Results__005_AL_ORU_R01_NBS_Simplified_0_initial_message.hl7"]


class RecordingProxy:
    """Forwards TCP connections to ``port`` and keeps what the clients sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(HOST, self.port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            while data := await src.read(65536):
                if record:
                    self.sent += data
                dst.write(data)
                await dst.drain()
            with contextlib.suppress(OSError):
                dst.write_eof()

        await asyncio.gather(
            pump(reader, up_writer, True), pump(up_reader, writer, False), return_exceptions=True
        )
        writer.close()
        up_writer.close()


@pytest.fixture
async def sample_ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES ('hospital/samples', 'hospital', 'samples', 'samples')"
        )
    config = IngestConfig(listeners=[ListenerConfig("samples", HOST, 0)], refresh_seconds=0.5)
    async with Ingest(config, dsn=fresh_db) as ingest:
        yield ingest


def frames(data: bytes) -> list[bytes]:
    return [e.payload for e in FrameReader(1 << 24).feed(data) if isinstance(e, Frame)]


async def test_every_sample_through_mllp_send(
    sample_ingest: Ingest, fresh_db: str, samples: list[Path], tmp_path: Path
) -> None:
    proxy = RecordingProxy(sample_ingest.mllp_ports["samples"])
    port = await proxy.start()
    # the samples, read in place, framed into one input file outside the repository
    batch = tmp_path / "samples.mllp"
    batch.write_bytes(b"".join(frame(path.read_bytes()) for path in samples))
    try:
        stdout = await mllp_send_file(port, batch, timeout=300)
    finally:
        await proxy.close()

    wire = frames(bytes(proxy.sent))
    raw_replies = frames(stdout)
    assert len(wire) == len(samples)

    # Each message gets exactly the acknowledgements its MSH-15/MSH-16 ask for, in order
    # (inturn.worker.hl7.expect): one AA or AR in original mode; CA, then AA when MSH-16 asks.
    acks = (parse_ack(reply) if not is_batch(reply) else reply for reply in raw_replies)
    accepted: list[bytes] = []
    repeats: list[str] = []
    batches: list[str] = []
    rejected: dict[str, str | None] = {}
    for path, sent in zip(samples, wire, strict=True):
        # what mllp_send did to the file's bytes: only SB/CR stripped at both ends
        assert sent == path.read_bytes().strip(b"\x0b\r"), path.name
        if is_batch(sent):
            answer = next(acks)
            assert isinstance(answer, bytes), path.name
            inner = split_batch(sent, max_messages=1000).messages
            answered = [parse_ack(m) for m in split_batch(answer, max_messages=1000).messages]
            # each message's accept code in its own mode (AA, or CA when MSH-15/16 ask)
            expected = [
                (answer_codes(h, "accept") or (ack_code(h, "accept"),))[0]
                for h in map(parse_header, inner)
            ]
            assert [a.code for a in answered] == expected, path.name
            accepted.extend(inner)
            batches.append(path.name)
            continue
        if path.name in NOT_MESSAGES:
            ack = next(acks)
            assert ack.code == "AR", path.name
            rejected[path.name] = ack.error_code
            continue
        header = parse_header(sent)
        codes = answer_codes(header, "accept")
        assert codes, path.name  # no sample asks for no acknowledgement at all
        answered = [next(acks) for _ in codes]
        assert [(a.code, a.control_id) for a in answered] == [
            (code, header.control_id) for code in codes
        ], path.name
        ack = answered[0]
        if sent in accepted:
            # two samples are byte-identical copies of others: the duplicate window answers
            # them again without storing a second copy
            assert ack.text is not None and "duplicate" in ack.text, path.name
            repeats.append(path.name)
        else:
            accepted.append(sent)
    assert next(acks, None) is None  # nothing more was answered than was asked for
    assert rejected == NOT_MESSAGES
    assert batches == BATCHES
    assert len(repeats) == 2

    with psycopg.connect(fresh_db) as conn:
        stored = conn.execute(
            # ingest stores each message once, in its channel's log (issue 43); the route set
            # names the destinations that read it
            "SELECT r.destinations, m.channel, m.size, m.payload FROM inturn_message m"
            " JOIN inturn_route r ON r.id = m.route ORDER BY m.id"
        ).fetchall()
    # the bytes sent, in the order sent, with only LF/CRLF terminators made CR (the one rule of
    # inturn.worker.hl7.terminators; CR messages byte for byte)
    expected_rows = [normalise_terminators(sent) for sent in accepted]
    assert [bytes(row[3]) for row in stored] == expected_rows
    assert {(tuple(row[0]), row[1]) for row in stored} == {(("hospital/samples",), "samples")}
    assert [row[2] for row in stored] == [len(row) for row in expected_rows]
