"""The MLLP and HTTP senders against real sockets on 127.0.0.1.

Peers are the project's own receivers (inturn.worker.testing) and raw asyncio servers written
here to misbehave on purpose. TLS material is generated per session with the openssl CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.http import HttpSender, HttpSenderConfig
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.senders.registry import make_sender
from inturn.worker.senders.tls import TlsConfig
from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.ports import free_port

MSG1 = b"MSH|^~\\&|SAPP|SFAC|RAPP|RFAC|20240101||ADT^A01^ADT_A01|MSG-1|P|2.5.1\rPID|1||111\r"
MSG2 = MSG1.replace(b"MSG-1", b"MSG-2")
MALFORMED_SAMPLES = {
    "Test__Message__msh_present_but_missing_all_fields.hl7",
    "Test__Message__msh_present_but_missing_msh-10.hl7",
    "Test__Message__msh_present_but_missing_msh-2.hl7",
    "Test__Results__005_AL_ORU_R01_NBS_Simplified_0_initial_message.hl7",
}


def ack_for(control_id: str, code: str = "AA", extra: str = "", sep: str = "\r") -> bytes:
    lines = [f"MSH|^~\\&|RAPP|RFAC|SAPP|SFAC|2024||ACK^A01^ACK|A-{control_id}|P|2.5.1"]
    lines.append(f"MSA|{code}|{control_id}{extra}")
    return sep.join(lines).encode() + sep.encode()


def mllp(port: int, **kwargs: object) -> MllpSender:
    return MllpSender(MllpSenderConfig("127.0.0.1", port, **kwargs))  # type: ignore[arg-type]


@dataclass
class RawServer:
    """What a raw test server saw: its port, connections and (connection, message) pairs."""

    port: int = 0
    connections: int = 0
    messages: list[tuple[int, bytes]] = field(default_factory=list)

    async def read_message(self, number: int, reader: asyncio.StreamReader) -> bytes:
        """Read one framed message from connection ``number`` and record it."""
        frames = FrameReader(1 << 20)
        while True:
            data = await reader.read(4096)
            if not data:
                raise EOFError
            for event in frames.feed(data):
                if isinstance(event, Frame):
                    self.messages.append((number, event.payload))
                    return event.payload


#: ``handler(server, connection_number, reader, writer)``, run for each connection.
Handler = Callable[[RawServer, int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[RawServer]:
    state = RawServer()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            await handler(state, state.connections, reader, writer)
        except (OSError, EOFError, asyncio.CancelledError):
            pass
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


# --------------------------------------------------------------------------- MLLP happy path


async def test_delivers_and_keeps_the_connection() -> None:
    async with MllpReceiver() as receiver:
        sender = mllp(receiver.port)
        await sender.send(MSG1)
        await sender.send(MSG2.replace(b"\r", b"\n"))
        await sender.send(MSG1.replace(b"\r", b"\r\n"))
        await sender.close()
    assert receiver.received == [MSG1, MSG2, MSG1]
    assert receiver.connections == 1
    assert sender.connections_opened == 1
    assert sender.describe() == f"mllp://127.0.0.1:{receiver.port}"


async def test_enhanced_mode_commit_accept() -> None:
    async with MllpReceiver(ack_code="CA") as receiver:
        sender = mllp(receiver.port)
        await sender.send(MSG1)
        await sender.close()
    assert receiver.received == [MSG1]


async def test_ack_with_lf_separators_and_no_final_cr() -> None:
    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            payload = await server.read_message(n, reader)
            ack = ack_for(parse_header(payload).control_id, sep="\n").rstrip(b"\n")
            writer.write(b"\x0b" + ack + b"\x1c")  # no CR after EB either
            await writer.drain()

    async with raw_server(handler) as server:
        sender = mllp(server.port)
        await sender.send(MSG1)
        await sender.send(MSG2)
        await sender.close()
    assert server.messages == [(1, MSG1), (1, MSG2)]


async def test_ack_split_byte_by_byte() -> None:
    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        payload = await server.read_message(n, reader)
        for byte in frame(ack_for(parse_header(payload).control_id)):
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)
        await reader.read()

    async with raw_server(handler) as server:
        sender = mllp(server.port)
        await sender.send(MSG1)
        assert sender.connected
        await sender.close()


# --------------------------------------------------------------------------- negative ACKs


def replying_server(
    reply: Callable[[bytes], bytes],
) -> contextlib.AbstractAsyncContextManager[RawServer]:
    """A raw server answering every message with ``reply(payload)`` (raw bytes, framed or not)."""

    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            payload = await server.read_message(n, reader)
            writer.write(reply(payload))
            await writer.drain()

    return raw_server(handler)


async def expect(sender: MllpSender, payload: bytes, outcome: str) -> DeliveryError:
    with pytest.raises(DeliveryError) as info:
        await sender.send(payload)
    assert info.value.outcome == outcome
    assert not sender.connected, "a failed send must drop its connection"
    return info.value


async def test_ae_with_text_and_err() -> None:
    err = "\rERR|||207^Application internal error^HL70357|E||||Database offline"
    async with replying_server(lambda p: frame(ack_for("MSG-1", "AE", "|Not stored" + err))) as s:
        sender = mllp(s.port)
        error = await expect(sender, MSG1, "AE")
        assert error.detail == "Not stored / Database offline"
        await expect(sender, MSG1, "AE")
    assert s.connections == 2  # reconnected after the failure


@pytest.mark.parametrize("code", ["AR", "CE", "CR"])
async def test_other_negative_codes(code: str) -> None:
    async with replying_server(lambda p: frame(ack_for("MSG-1", code))) as server:
        error = await expect(mllp(server.port), MSG1, code)
        assert error.detail == "no text"


async def test_nack_with_empty_msa2_reports_its_code() -> None:
    async with replying_server(lambda p: frame(ack_for("", "AR", "|bad message"))) as server:
        error = await expect(mllp(server.port), MSG1, "AR")
        assert error.detail == "bad message"


async def test_wrong_control_id() -> None:
    async with replying_server(lambda p: frame(ack_for("MSG-0"))) as server:
        error = await expect(mllp(server.port), MSG1, "controlIdMismatch")
        assert "MSG-0" in error.detail and "MSG-1" in error.detail


async def test_accept_without_control_id_is_a_mismatch() -> None:
    async with replying_server(lambda p: frame(ack_for(""))) as server:
        await expect(mllp(server.port), MSG1, "controlIdMismatch")


async def test_nack_for_another_message_is_a_mismatch() -> None:
    async with replying_server(lambda p: frame(ack_for("MSG-0", "AE"))) as server:
        await expect(mllp(server.port), MSG1, "controlIdMismatch")


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (b"this is not an ACK\r\n", "not MLLP-framed"),
        (ack_for("MSG-1"), "not MLLP-framed"),  # an unframed ACK
        (frame(b"hello"), "MSH"),
        (frame(b"MSH|^~\\&|R|F|S|F|2024||ACK|1|P|2.5\r"), "MSA"),
        (frame(ack_for("MSG-1", "XX")), "XX"),
    ],
)
async def test_unusable_replies_are_invalid_acks(reply: bytes, words: str) -> None:
    async with replying_server(lambda p: reply) as server:
        error = await expect(mllp(server.port), MSG1, "invalidAck")
        assert words in error.detail


async def test_oversized_reply() -> None:
    big = frame(ack_for("MSG-1", "AA", "|" + "x" * 5000))
    async with replying_server(lambda p: big) as server:
        error = await expect(mllp(server.port, max_ack_bytes=1000), MSG1, "invalidAck")
        assert "1000" in error.detail


async def test_two_replies_to_one_message_keep_the_connection() -> None:
    """The second ACK names the first message: the next one is not confused by it."""
    async with replying_server(lambda p: frame(ack_for(parse_header(p).control_id)) * 2) as server:
        sender = mllp(server.port)
        await sender.send(MSG1)
        await sender.send(MSG2)
        assert sender.connected and sender.connections_opened == 1


async def test_stored_message_without_control_id_is_not_sent() -> None:
    async with MllpReceiver() as receiver:
        sender = mllp(receiver.port)
        error = await expect(sender, b"MSH|^~\\&|A|B|C|D|2024||ADT^A01||P|2.5\r", "unsendable")
        assert "MSH-10" in error.detail
        with pytest.raises(DeliveryError) as info:
            await sender.send(MSG1.replace(b"PID|1", b"PID|\x1c"))
        assert info.value.outcome == "unsendable"
    assert receiver.received == []


# --------------------------------------------------------------------------- transport failures


async def test_connection_refused() -> None:
    port = free_port()
    error = await expect(mllp(port), MSG1, "unreachable")
    assert f"127.0.0.1:{port}" in error.detail


async def test_server_closes_without_reply() -> None:
    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_message(n, reader)

    async with raw_server(handler) as server:
        error = await expect(mllp(server.port), MSG1, "unreachable")
        assert "before replying" in error.detail


async def test_server_closes_in_the_middle_of_the_reply() -> None:
    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_message(n, reader)
        writer.write(frame(ack_for("MSG-1"))[:20])
        await writer.drain()

    async with raw_server(handler) as server:
        error = await expect(mllp(server.port), MSG1, "connection")
        assert "middle of the reply" in error.detail


async def test_late_ack_after_a_timeout_is_never_taken_for_the_next_message() -> None:
    """The first message's ACK comes after the attempt timed out; the sender must have
    dropped that connection, so the second message is answered on a new one."""
    release = asyncio.Event()
    late_ack_written = asyncio.Event()

    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            payload = await server.read_message(n, reader)
            control_id = parse_header(payload).control_id
            if n == 1:
                await asyncio.wait_for(release.wait(), 30)
                writer.write(frame(ack_for(control_id)))
                with contextlib.suppress(OSError):
                    await writer.drain()
                late_ack_written.set()
            else:
                writer.write(frame(ack_for(control_id)))
                await writer.drain()

    async with raw_server(handler) as server:
        sender = mllp(server.port)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await sender.send(MSG1)
        assert not sender.connected
        release.set()
        await asyncio.wait_for(late_ack_written.wait(), 30)
        await sender.send(MSG2)  # would fail with controlIdMismatch on the old connection
        await sender.close()
    assert server.connections == 2
    assert server.messages == [(1, MSG1), (2, MSG2)]
    assert sender.connections_opened == 2


async def test_internal_timeout_reports_timeout() -> None:
    async with MllpReceiver() as receiver:
        receiver.reply = False
        sender = MllpSender(MllpSenderConfig("127.0.0.1", receiver.port), timeout_seconds=0.1)
        error = await expect(sender, MSG1, "timeout")
        assert error.detail == "no ACK within 0.1s"


async def test_cancellation_drops_the_connection() -> None:
    async with MllpReceiver() as receiver:
        receiver.reply = False
        sender = mllp(receiver.port)
        task = asyncio.create_task(sender.send(MSG1))
        await receiver.wait_for(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not sender.connected
        receiver.reply = True
        await sender.send(MSG2)
        await sender.close()
    assert receiver.connections == 2


async def test_receiver_goes_down_and_comes_back_on_the_same_port() -> None:
    receiver = MllpReceiver()
    await receiver.start()
    port = receiver.port
    sender = mllp(port)
    await sender.send(MSG1)
    await receiver.stop()
    await expect(sender, MSG2, "unreachable")
    await receiver.start()
    assert receiver.port == port
    await sender.send(MSG2)
    # The receiver dropping an idle connection costs no attempt: the sender reconnects.
    await receiver.stop()
    await receiver.start()
    for _ in range(200):  # let the reset of the idle connection reach the sender
        if not sender.connected:
            break
        await asyncio.sleep(0.01)
    assert not sender.connected
    await sender.send(MSG1)
    await sender.close()
    await receiver.stop()
    assert receiver.received == [MSG1, MSG2, MSG1]


async def test_receiver_settings_drive_the_outcome() -> None:
    async with MllpReceiver() as receiver:
        sender = mllp(receiver.port)
        receiver.ack_code, receiver.ack_text = "AE", "try later"
        error = await expect(sender, MSG1, "AE")
        assert error.detail == "try later"
        receiver.ack_code, receiver.ack_text = "AA", None
        receiver.ack_control_id_override = "SOMETHING-ELSE"
        await expect(sender, MSG1, "controlIdMismatch")
        receiver.ack_control_id_override = None
        receiver.close_after_receive = True
        await expect(sender, MSG1, "unreachable")
        receiver.close_after_receive = False
        await sender.send(MSG1)
        await sender.close()
    assert len(receiver.received) == 4


async def test_every_sample_arrives_intact(samples: list[Path]) -> None:
    async with MllpReceiver() as receiver:
        sender = mllp(receiver.port)
        sent: list[bytes] = []
        refused: dict[str, str] = {}
        for path in samples:
            payload = path.read_bytes()
            if path.name in MALFORMED_SAMPLES:
                with pytest.raises(DeliveryError) as info:
                    await sender.send(payload)
                refused[path.name] = info.value.outcome
                continue
            await sender.send(payload)
            sent.append(payload)
        await sender.close()
    # a message whose answer could never be matched to it (no readable MSH-10, or a batch)
    # fails at once as unsendable, before anything is written
    assert refused == dict.fromkeys(MALFORMED_SAMPLES, "unsendable")
    assert len(sent) == len(samples) - len(MALFORMED_SAMPLES)
    assert receiver.received == [normalise_terminators(p) for p in sent]
    assert max(len(p) for p in receiver.received) > 70_000


async def exchange_raw(port: int, data: bytes) -> bytes:
    """Send raw bytes to a receiver and return the payload of its first reply frame."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        frames = FrameReader(1 << 20)
        while True:
            chunk = await reader.read(4096)
            assert chunk, "closed without a reply"
            for event in frames.feed(chunk):
                if isinstance(event, Frame):
                    return event.payload
    finally:
        writer.close()


async def test_receiver_rejects_what_it_cannot_read() -> None:
    async with MllpReceiver(max_frame_bytes=1000) as receiver:
        reply = parse_ack(await exchange_raw(receiver.port, frame(b"PID|1||2\r")))
        assert (reply.code, reply.control_id, reply.error_code) == ("AR", "", "100")
        reply = parse_ack(await exchange_raw(receiver.port, frame(b"MSH|^~\\&|A\r" * 200)))
        assert (reply.code, reply.error_code) == ("AR", "104")
    assert receiver.received == [b"PID|1||2\r"]


async def test_receiver_delay_and_late_ack() -> None:
    async with MllpReceiver() as receiver:
        receiver.delay_seconds = 1.0
        sender = mllp(receiver.port)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await sender.send(MSG1)
        receiver.delay_seconds = 0
        await sender.send(MSG2)
        await sender.close()
    assert receiver.received == [MSG1, MSG2]
    assert receiver.connections == 2


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=inturn test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    for name, ext in [
        ("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ]:
        (d / f"{name}.ext").write_text(
            ext + "basicConstraints=CA:FALSE\nauthorityKeyIdentifier=keyid\n"
        )
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=inturn test {name}", cwd=d)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=d,
        )  # fmt: skip
    return Pki(
        ca=str(d / "ca.pem"),
        server_cert=str(d / "server.pem"),
        server_key=str(d / "server.key"),
        client_cert=str(d / "client.pem"),
        client_key=str(d / "client.key"),
    )


def server_context(pki: Pki, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if require_client_cert:
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@pytest.mark.parametrize("server_name", [None, "localhost"])
async def test_tls_delivery(pki: Pki, server_name: str | None) -> None:
    async with MllpReceiver(ssl_context=server_context(pki)) as receiver:
        tls = TlsConfig(ca_file=pki.ca, server_name=server_name)
        sender = mllp(receiver.port, tls=tls)
        assert sender.describe().startswith("mllps://")
        await sender.send(MSG1)
        await sender.send(MSG2)
        await sender.close()
    assert receiver.received == [MSG1, MSG2]
    assert receiver.connections == 1


async def test_tls_with_client_certificate(pki: Pki) -> None:
    async with MllpReceiver(ssl_context=server_context(pki, require_client_cert=True)) as r:
        tls = TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
        sender = mllp(r.port, tls=tls)
        await sender.send(MSG1)
        await sender.close()
    assert r.received == [MSG1]


@pytest.mark.parametrize(
    ("tls_kwargs", "words"),
    [
        ({}, "certificate verify failed"),  # system store does not know our CA
        ({"server_name": "other.example"}, "certificate verify failed"),  # wrong name
    ],
)
async def test_tls_verification_failure(pki: Pki, tls_kwargs: dict[str, str], words: str) -> None:
    async with MllpReceiver(ssl_context=server_context(pki)) as receiver:
        if "server_name" in tls_kwargs:
            tls_kwargs = {**tls_kwargs, "ca_file": pki.ca}
        sender = mllp(receiver.port, tls=TlsConfig(**tls_kwargs))  # type: ignore[arg-type]
        error = await expect(sender, MSG1, "unreachable")
        assert words in error.detail.lower()
    assert receiver.received == []


async def test_tls_insecure_skip_verify(pki: Pki) -> None:
    async with MllpReceiver(ssl_context=server_context(pki)) as receiver:
        sender = mllp(receiver.port, tls=TlsConfig(insecure_skip_verify=True))
        await sender.send(MSG1)
        await sender.close()
    assert receiver.received == [MSG1]


async def test_plain_sender_to_tls_receiver_fails(pki: Pki) -> None:
    async with MllpReceiver(ssl_context=server_context(pki)) as receiver:
        sender = MllpSender(MllpSenderConfig("127.0.0.1", receiver.port), timeout_seconds=5)
        error = await expect(sender, MSG1, "unreachable")
        assert error.detail


# --------------------------------------------------------------------------- HTTP


async def test_http_delivers_with_headers(tmp_path: Path) -> None:
    headers_file = tmp_path / "headers"
    headers_file.write_text("# credentials\nAuthorization: Bearer s3cret\n\nX-Tenant:  a \n")
    async with HttpReceiver() as receiver:
        config = HttpSenderConfig(
            receiver.url + "hl7?x=1", headers={"X-Source": "inturn"}, headers_file=str(headers_file)
        )
        sender = HttpSender(config)
        await sender.send(MSG1)
        await sender.send(MSG2)
        await sender.close()
    assert receiver.received == [MSG1, MSG2]
    sent = receiver.headers[0]
    assert sent["Content-Type"] == "application/hl7-v2"
    assert sent["Authorization"] == "Bearer s3cret"
    assert sent["X-Tenant"] == "a"
    assert sent["X-Source"] == "inturn"
    assert sender.describe() == receiver.url + "hl7"


async def test_http_content_type_can_be_configured() -> None:
    async with HttpReceiver() as receiver:
        sender = HttpSender(HttpSenderConfig(receiver.url, headers={"content-type": "text/plain"}))
        await sender.send(MSG1)
        await sender.close()
    assert receiver.headers[0]["Content-Type"] == "text/plain"


@pytest.mark.parametrize(
    ("status", "detail"),
    [(503, "HTTP 503 Service Unavailable"), (400, "HTTP 400 Bad Request"), (302, "HTTP 302 Found")],
)
async def test_http_non_2xx(status: int, detail: str) -> None:
    async with HttpReceiver(status=status) as receiver:
        sender = HttpSender(HttpSenderConfig(receiver.url))
        with pytest.raises(DeliveryError) as info:
            await sender.send(MSG1)
        await sender.close()
    assert (info.value.outcome, info.value.detail) == ("http", detail)
    assert receiver.received == [MSG1]


async def test_http_other_2xx_is_success() -> None:
    async with HttpReceiver(status=204) as receiver:
        sender = HttpSender(HttpSenderConfig(receiver.url))
        await sender.send(MSG1)
        await sender.close()


async def test_http_refused_and_back() -> None:
    receiver = HttpReceiver(port=free_port())
    sender = HttpSender(HttpSenderConfig(receiver.url))
    with pytest.raises(DeliveryError) as info:
        await sender.send(MSG1)
    assert info.value.outcome == "unreachable"
    await receiver.start()
    await sender.send(MSG1)
    await receiver.stop()
    await sender.close()
    assert receiver.received == [MSG1]


async def test_http_unreadable_headers_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("no colon here\n")
    sender = HttpSender(HttpSenderConfig("http://127.0.0.1:9/", headers_file=str(bad)))
    with pytest.raises(DeliveryError) as info:
        await sender.send(MSG1)
    assert info.value.outcome == "unreachable"
    assert "no colon" not in info.value.detail
    await sender.close()


# --------------------------------------------------------------------------- factory


def test_factory_builds_the_configured_sender() -> None:
    assert isinstance(make_sender(MllpSenderConfig("h", 2575)), MllpSender)
    assert isinstance(make_sender(HttpSenderConfig("https://h/x")), HttpSender)
    assert make_sender(MllpSenderConfig("h", 2575)).describe() == "mllp://h:2575"


# ------------------------------------------- kind 2: a reply is matched to the message it answers


def msg(control_id: str, msh15: str = "", msh16: str = "") -> bytes:
    return (
        f"MSH|^~\\&|SAPP|SFAC|RAPP|RFAC|20240101||ADT^A01^ADT_A01|{control_id}|P|2.5.1|||"
        f"{msh15}|{msh16}\rPID|1||111\r"
    ).encode()


def scripted(script: Callable[[str, int], list[bytes]]) -> Handler:
    """A handler that answers each message with ``script(control_id, index)`` (raw bytes,
    written in one go, before the next message is read)."""

    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        frames = FrameReader(1 << 20)  # one per connection: messages may share a read
        index = 0
        while data := await reader.read(4096):
            for event in frames.feed(data):
                if not isinstance(event, Frame):
                    continue
                server.messages.append((n, event.payload))
                for chunk in script(parse_header(event.payload).control_id, index):
                    writer.write(chunk)
                    await writer.drain()
                index += 1

    return handler


async def send_all(sender: MllpSender, payloads: list[bytes]) -> None:
    for payload in payloads:
        await sender.send(payload)
    await sender.close()


async def test_enhanced_ca_then_late_aa_is_never_the_next_answer() -> None:
    """CA at once, and the AA for message N written only after message N+1 arrived, right
    before N+1's CA: the sender awaits CA only (MSH-16 NE) and must throw the AA away."""
    previous: list[str] = []

    def script(control_id: str, index: int) -> list[bytes]:
        late = [frame(ack_for(previous[-1], "AA"))] if previous else []
        previous.append(control_id)
        return [*late, frame(ack_for(control_id, "CA"))]

    payloads = [msg(f"E{i}", "AL", "NE") for i in range(10)]
    async with raw_server(scripted(script)) as server:
        sender = mllp(server.port)
        await send_all(sender, payloads)
    assert [p for _, p in server.messages] == payloads  # each once: no resend
    assert server.connections == 1


async def test_enhanced_ca_and_aa_both_awaited_when_msh16_asks() -> None:
    """MSH-15 AL and MSH-16 AL: the send ends only after both, whatever their order."""

    def script(control_id: str, index: int) -> list[bytes]:
        acks = [frame(ack_for(control_id, "CA")), frame(ack_for(control_id, "AA"))]
        return acks if index % 2 == 0 else acks[::-1]

    payloads = [msg(f"B{i}", "AL", "AL") for i in range(6)]
    async with raw_server(scripted(script)) as server:
        await send_all(mllp(server.port), payloads)
    assert [p for _, p in server.messages] == payloads
    assert server.connections == 1


async def test_an_application_error_after_the_commit_ack_fails_the_message() -> None:
    async with raw_server(
        scripted(lambda cid, i: [frame(ack_for(cid, "CA")), frame(ack_for(cid, "AE"))])
    ) as server:
        await expect(mllp(server.port), msg("X1", "AL", "AL"), "AE")


@pytest.mark.parametrize(
    "leftover",
    [
        lambda cid: frame(ack_for(cid, "AA")),  # a second ACK
        lambda cid: frame(ack_for(cid, "AE")),  # a late negative one
        lambda cid: b"trailing bytes\r\n",  # bytes outside any block
        lambda cid: b"\x0bMSH|^~\\&|partial",  # the start of a block never finished
    ],
    ids=["second-ack", "late-nack", "trailing", "partial"],
)
async def test_leftovers_of_an_earlier_exchange_neither_answer_nor_fail(
    leftover: Callable[[str], bytes],
) -> None:
    """Whatever follows a message's answer, written separately (so it may arrive before or
    after the next message is written), the next message is answered by its own ACK."""

    def script(control_id: str, index: int) -> list[bytes]:
        return [frame(ack_for(control_id)), leftover(control_id)]

    payloads = [msg(f"L{i}") for i in range(8)]
    async with raw_server(scripted(script)) as server:
        await send_all(mllp(server.port), payloads)
    assert [p for _, p in server.messages] == payloads  # nothing sent twice


async def test_an_answer_naming_a_message_never_sent_here_is_still_a_mismatch() -> None:
    async with raw_server(scripted(lambda cid, i: [frame(ack_for("OTHER-9"))])) as server:
        await expect(mllp(server.port), msg("M1"), "controlIdMismatch")


# ------------------------------------- kind 3: wait for exactly the ACKs MSH-15/MSH-16 ask for


@pytest.mark.parametrize(
    ("msh15", "msh16"), [("NE", "NE"), ("ER", "NE"), ("NE", "ER"), ("ER", "ER")]
)
async def test_no_ack_due_means_delivered_once_flushed(msh15: str, msh16: str) -> None:
    """A receiver that (rightly) never answers: delivered once written, nothing waited for."""
    async with raw_server(scripted(lambda cid, i: [])) as server:
        sender = mllp(server.port)
        payloads = [msg(f"N{i}", msh15, msh16) for i in range(3)]
        await send_all(sender, payloads)
        await until_count(server, 3)
    assert [p for _, p in server.messages] == payloads


async def until_count(server: RawServer, count: int) -> None:
    async with asyncio.timeout(10):
        while len(server.messages) < count:
            await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("msh15", "msh16", "answers"),
    [
        ("NE", "AL", ["AA"]),
        ("SU", "NE", ["CA"]),
        ("AL", "SU", ["CA", "AA"]),
        ("", "", ["AA"]),
    ],
)
async def test_the_due_answers_are_awaited(msh15: str, msh16: str, answers: list[str]) -> None:
    async with raw_server(scripted(lambda cid, i: [frame(ack_for(cid, a)) for a in answers])) as s:
        await send_all(mllp(s.port), [msg(f"D{i}", msh15, msh16) for i in range(3)])
    assert len(s.messages) == 3 and s.connections == 1


async def test_a_missing_due_answer_is_a_timeout() -> None:
    """MSH-16 AL and a receiver that sends only the commit ACK: the application ACK is due."""
    async with raw_server(scripted(lambda cid, i: [frame(ack_for(cid, "CA"))])) as server:
        sender = MllpSender(MllpSenderConfig("127.0.0.1", server.port), timeout_seconds=0.5)
        await expect(sender, msg("T1", "AL", "AL"), "timeout")


async def test_always_wait_for_ack_forces_one_answer() -> None:
    async with raw_server(scripted(lambda cid, i: [frame(ack_for(cid, "AA"))])) as server:
        await send_all(mllp(server.port, always_wait_for_ack=True), [msg("F1", "NE", "NE")])
    async with raw_server(scripted(lambda cid, i: [])) as server:
        sender = MllpSender(
            MllpSenderConfig("127.0.0.1", server.port, always_wait_for_ack=True),
            timeout_seconds=0.5,
        )
        await expect(sender, msg("F2", "NE", "NE"), "timeout")
    async with raw_server(scripted(lambda cid, i: [frame(ack_for(cid, "AR"))])) as server:
        await expect(mllp(server.port, always_wait_for_ack=True), msg("F3", "ER", "NE"), "AR")


# ------------------------- kind 6: a kept connection the receiver dropped costs no attempt


async def test_a_receiver_that_closes_after_each_ack_costs_no_failure() -> None:
    """Each ACK is followed by a close; every send still succeeds, each message arrives once."""

    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        payload = await server.read_message(n, reader)
        writer.write(frame(ack_for(parse_header(payload).control_id)))
        await writer.drain()
        await asyncio.sleep(0.01)  # then close (the handler's end aborts the connection)

    payloads = [msg(f"C{i}") for i in range(10)]
    async with raw_server(handler) as server:
        sender = mllp(server.port)
        for payload in payloads:
            await sender.send(payload)  # never raises: no attempt is lost to the close
        await sender.close()
    assert [p for _, p in server.messages] == payloads
    assert sender.connections_opened == 10


async def test_the_fresh_retry_happens_once_and_only_on_a_reused_connection() -> None:
    """A receiver that takes the message and closes without answering: on a reused connection
    the message is written once more on a new one (one duplicate at most), then fails."""

    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        payload = await server.read_message(n, reader)
        if n == 1:  # the first connection answers its first message and then goes quiet
            writer.write(frame(ack_for(parse_header(payload).control_id)))
            await writer.drain()
            await server.read_message(n, reader)

    async with raw_server(handler) as server:
        sender = mllp(server.port)
        await sender.send(msg("R1"))
        error = await expect(sender, msg("R2"), "unreachable")
        assert "before replying" in error.detail
        assert sender.fresh_retries == 1
    assert [(n, parse_header(p).control_id) for n, p in server.messages] == [
        (1, "R1"),
        (1, "R2"),
        (2, "R2"),
    ]


async def test_a_close_on_a_fresh_connection_is_an_ordinary_failure() -> None:
    """On a connection's first message a close before the reply fails it: no second copy."""

    async def handler(
        server: RawServer, n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_message(n, reader)

    async with raw_server(handler) as server:
        sender = mllp(server.port)
        await expect(sender, msg("Q1"), "unreachable")
        assert sender.fresh_retries == 0
    assert len(server.messages) == 1


async def test_http_receiver_closing_kept_connections_costs_no_failure() -> None:
    """An HTTP/1.1 receiver that answers the first request of each connection and drops the
    connection on the second without answering: that POST is made again at once on a fresh
    connection, so every send succeeds, and nothing is delivered more than twice."""
    answered: list[bytes] = []
    dropped: list[bytes] = []

    async def read_request(reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return await reader.readexactly(length)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answered.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            dropped.append(await read_request(reader))
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = HttpSender(HttpSenderConfig(f"http://127.0.0.1:{port}/in"))
    payloads = [MSG1.replace(b"MSG-1", f"H{i}".encode()) for i in range(6)]
    try:
        for payload in payloads:
            await sender.send(payload)
    finally:
        await sender.close()
        server.close()
    assert answered == payloads
    assert dropped == payloads[1:] and sender.fresh_retries == len(payloads) - 1
