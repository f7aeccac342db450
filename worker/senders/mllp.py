"""MLLP sender: deliver one HL7 v2 message over TCP (optionally TLS) and check its ACK.

Framing follows MLLP release 2 (HL7 v2 Appendix C); the ACK rules follow HL7 v2.x chapter 2.
One connection is kept open between messages. It is closed after any failure and on
cancellation (the worker bounds each attempt with ``asyncio.timeout``), so a reply that arrives
late can never be read as the answer to the next message; the next ``send`` reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from ..config import MllpSenderConfig
from ..hl7.ack import ACK_CODES, Ack, parse_ack
from ..hl7.errors import AckParseError, HeaderError
from ..hl7.header import parse_header
from ..hl7.mllp import Frame, FrameReader, FrameTooLarge, Garbage, frame
from ..hl7.terminators import normalise_terminators
from .base import DeliveryError, Outcome
from .tls import client_context

#: Bytes asked for per read of the reply.
READ_CHUNK = 64 * 1024
#: Longest detail kept from a receiver's MSA-3 / ERR text, in characters.
DETAIL_MAX_CHARS = 500
#: TCP keepalive: idle seconds before the first probe, seconds between probes, probe count.
KEEPALIVE = (60, 15, 4)

_NACK_OUTCOMES: dict[str, Outcome] = {"AE": "AE", "AR": "AR", "CE": "CE", "CR": "CR"}


def _enable_keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, interval, count = KEEPALIVE
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"


def _nack_detail(ack: Ack) -> str:
    parts = [part for part in (ack.text, ack.error_text) if part]
    if ack.error_code and not ack.error_text:
        parts.append(f"error {ack.error_code}")
    detail = " / ".join(dict.fromkeys(parts)) or "no text"
    return detail[:DETAIL_MAX_CHARS]


class MllpSender:
    """Implements :class:`inturn.worker.senders.base.Sender` over MLLP.

    Args:
        config: host, port, optional TLS and ``max_ack_bytes`` (the largest reply accepted).
        timeout_seconds: optional bound of one ``send`` (connect, write, read the ACK); when
            it passes, ``DeliveryError("timeout", ...)`` is raised. None (the default) leaves
            bounding to the caller, whose cancellation is handled the same way.

    Success is an MSA-1 of AA or CA whose MSA-2 equals the message's MSH-10 (both compared
    with surrounding whitespace stripped). Failures raise :class:`DeliveryError` with outcome

    * ``AE`` / ``AR`` / ``CE`` / ``CR``: the receiver's code; detail is MSA-3 and ERR text;
    * ``controlIdMismatch``: MSA-2 names another message (an AE/AR with an empty MSA-2 is
      reported as its code instead);
    * ``invalidAck``: an unframed, oversized or unparseable reply, or an MSA-1 outside table
      0008; also, without sending, a stored message with no readable MSH-10 (nothing to
      match an ACK to) or containing the end-block byte 0x1C (it cannot be framed);
    * ``connection``: refused, reset, DNS or TLS failure, or closed before a whole reply;
      detail is the socket error text.

    Every failure, and a cancellation, drops the connection; so does a reply followed by
    further bytes. Only a clean AA/CA exchange leaves it open for the next message.
    """

    def __init__(self, config: MllpSenderConfig, *, timeout_seconds: float | None = None) -> None:
        self.config = config
        self.timeout_seconds = timeout_seconds
        self._ssl = client_context(config.tls) if config.tls is not None else None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._out_of_step = False
        #: Connections opened so far (for tests and diagnostics).
        self.connections_opened = 0

    def describe(self) -> str:
        """``mllp://host:port``, or ``mllps://host:port`` with TLS."""
        scheme = "mllps" if self.config.tls is not None else "mllp"
        return f"{scheme}://{self.config.host}:{self.config.port}"

    @property
    def connected(self) -> bool:
        """Whether a connection is held for the next message and the peer has not closed it."""
        reader, writer = self._reader, self._writer
        if reader is None or writer is None:
            return False
        return not (reader.at_eof() or reader.exception() is not None or writer.is_closing())

    async def send(self, payload: bytes) -> None:
        """Send one message and wait for its ACK; see the class docstring for outcomes.

        ``payload`` is sent as :func:`inturn.worker.hl7.terminators.normalise_terminators`
        makes it: a message terminated by CR goes byte for byte.

        Raises:
            DeliveryError: the receiver did not accept it, or the transport failed.
        """
        try:
            control_id, data = self._prepare(payload)
            try:
                async with asyncio.timeout(self.timeout_seconds):  # None: no bound of our own
                    ack = await self._exchange(data)
            except TimeoutError:
                raise DeliveryError("timeout", f"no ACK within {self.timeout_seconds}s") from None
            self._check(ack, control_id)
            if self._out_of_step:
                self._abort()
        except BaseException:
            # Whatever went wrong (including cancellation), the stream may still carry a
            # reply meant for this message: never reuse it.
            self._abort()
            raise

    @staticmethod
    def _prepare(payload: bytes) -> tuple[str, bytes]:
        """The message's MSH-10 and its framed bytes."""
        try:
            control_id = parse_header(payload).control_id.strip()
        except HeaderError as exc:
            raise DeliveryError(
                "invalidAck", f"the stored message has no usable MSH: {exc}"
            ) from None
        try:
            return control_id, frame(normalise_terminators(payload))
        except ValueError as exc:
            raise DeliveryError(
                "invalidAck", f"the stored message cannot be framed: {exc}"
            ) from None

    def _check(self, ack: Ack, control_id: str) -> None:
        acked = ack.control_id.strip()
        if ack.code not in ACK_CODES:
            raise DeliveryError("invalidAck", f"unknown acknowledgment code {ack.code[:10]!r}")
        if ack.accepted:
            if acked != control_id:
                raise DeliveryError("controlIdMismatch", self._mismatch(acked, control_id))
            return
        if acked and acked != control_id:
            raise DeliveryError("controlIdMismatch", self._mismatch(acked, control_id))
        raise DeliveryError(_NACK_OUTCOMES[ack.code], _nack_detail(ack))

    @staticmethod
    def _mismatch(acked: str, control_id: str) -> str:
        return f"MSA-2 {acked[:40]!r} does not match MSH-10 {control_id[:40]!r}"

    async def _exchange(self, data: bytes) -> Ack:
        reader, writer = await self._connection()
        try:
            writer.write(data)
            await writer.drain()
            reply = await self._read_reply(reader)
        except (OSError, EOFError) as exc:
            raise DeliveryError("connection", _error_text(exc)) from None
        try:
            return parse_ack(reply)
        except AckParseError as exc:
            raise DeliveryError("invalidAck", str(exc)) from None

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = self._reader, self._writer
        if reader is not None and writer is not None:
            if self.connected:
                return reader, writer
            # The peer closed (or reset) the idle connection: start afresh rather than lose
            # an attempt to it.
            self._abort()
        host, port = self.config.host, self.config.port
        server_hostname = None
        if self._ssl is not None:
            server_hostname = (self.config.tls and self.config.tls.server_name) or host
        try:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=self._ssl, server_hostname=server_hostname, limit=READ_CHUNK
            )
        except (OSError, EOFError) as exc:
            raise DeliveryError(
                "connection", f"connect {host}:{port}: {_error_text(exc)}"
            ) from None
        self.connections_opened += 1
        _enable_keepalive(writer)
        self._reader, self._writer = reader, writer
        return reader, writer

    async def _read_reply(self, reader: asyncio.StreamReader) -> bytes:
        frames = FrameReader(self.config.max_ack_bytes)
        self._out_of_step = False
        while True:
            chunk = await reader.read(READ_CHUNK)
            if not chunk:
                where = "in the middle of the reply" if frames.mid_frame else "before replying"
                raise DeliveryError("connection", f"the receiver closed the connection {where}")
            events = frames.feed(chunk)
            for index, event in enumerate(events):
                if isinstance(event, Frame):
                    # Bytes after the reply mean more than one answer to one message: the
                    # stream is out of step, so the connection is dropped after this send.
                    self._out_of_step = frames.mid_frame or index + 1 < len(events)
                    return event.payload
                if isinstance(event, FrameTooLarge):
                    raise DeliveryError(
                        "invalidAck", f"the reply is larger than {event.limit} bytes"
                    )
                if isinstance(event, Garbage):
                    raise DeliveryError(
                        "invalidAck",
                        f"the reply is not MLLP-framed ({event.count} bytes outside a block)",
                    )

    def _abort(self) -> None:
        writer = self._writer
        self._reader = self._writer = None
        if writer is not None:
            writer.transport.abort()

    async def close(self) -> None:
        """Close the held connection, if any. The sender stays usable: ``send`` reconnects."""
        writer = self._writer
        self._reader = self._writer = None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
