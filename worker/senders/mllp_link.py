"""One MLLP connection held by a sender: what it has heard, read as the bytes arrive.

The connection is an asyncio protocol: every chunk the peer sends is turned into framing events
(:class:`inturn.worker.hl7.mllp.FrameReader`) in the event loop's read callback and kept in
arrival order, without a reader task of its own, so that an answer costs one wake-up of the
sender and no more. The sender can thus look at what arrived *before* it writes a message
(leftovers of an earlier exchange: a second ACK, a late answer, trailing bytes, or the peer's
close) and throw it away, since nothing that arrived before a message was written can be its
answer.

Bounds: one chunk is what the event loop reads at once (asyncio's own bound, 256 KiB); a block
is bounded by ``max_frame_bytes``, past which the connection is read no more.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from dataclasses import dataclass

from inturn.worker.hl7.mllp import Event, FrameReader

#: TCP keepalive: idle seconds before the first probe, seconds between probes, probe count.
KEEPALIVE = (60, 15, 4)
#: MSH-10 values remembered per connection, to recognise late answers to earlier messages.
REMEMBERED_IDS = 64


@dataclass(frozen=True)
class Closed:
    """The peer closed the connection or it failed.

    Attributes:
        mid_frame: it ended inside a block (part of a reply had arrived).
        error: the socket error text, or None for an orderly close.
    """

    mid_frame: bool
    error: str | None = None


@dataclass(frozen=True)
class Heard:
    """A framing event."""

    event: Event


class Link(asyncio.Protocol):
    """An open connection and what has been heard on it.

    Open one with :meth:`open`.

    Args:
        max_frame_bytes: the largest block accepted; a longer one is reported
            (:class:`inturn.worker.hl7.mllp.FrameTooLarge`) and nothing more is read.

    Attributes:
        sent: MSH-10 values of the messages written on this connection, oldest first (the
            last :data:`REMEMBERED_IDS`).
        exchanges: messages written on it so far (0 for a fresh connection).
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.sent: deque[str] = deque(maxlen=REMEMBERED_IDS)
        self.exchanges = 0
        self._frames = FrameReader(max_frame_bytes)
        self._events: deque[Heard | Closed] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        #: The close the sender has taken note of (through leftovers or next).
        self._closed: Closed | None = None
        #: No more events: the peer closed, the reader failed, or we dropped the connection.
        self._deaf = False
        self._lost = False
        self._lost_waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        max_frame_bytes: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> Link:
        """Connect (TCP, or TLS with ``ssl_context``) and return the link.

        Raises:
            OSError: refused, DNS or TLS handshake failure (``ssl.SSLError`` is one).
        """
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(
            lambda: cls(max_frame_bytes),
            host,
            port,
            ssl=ssl_context,
            server_hostname=server_hostname,
        )
        _enable_keepalive(link.transport)
        return link

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._lost_waiter = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self._deaf:
            return
        for event in self._frames.feed(data):
            self._events.append(Heard(event))
        if self._frames.failed:
            self._deaf = True  # nothing more is read from a peer past the bound
            if self._transport is not None:
                self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._hear_end(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is not None:
            self._hear_end(str(exc) or type(exc).__name__)
        else:
            self._hear_end(None)
        if self._lost_waiter is not None and not self._lost_waiter.done():
            self._lost_waiter.set_result(None)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _hear_end(self, error: str | None) -> None:
        if not self._deaf:
            self._deaf = True
            self._events.append(Closed(self._frames.mid_frame, error))
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- what the sender uses --------------------------------------------------------------

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport (for socket options), None before it is made."""
        return self._transport

    @property
    def usable(self) -> bool:
        """Neither closed by the peer nor failed, as far as has been heard."""
        transport = self._transport
        return self._closed is None and transport is not None and not transport.is_closing()

    def leftovers(self) -> list[Heard]:
        """Take every event heard so far without waiting (a close is remembered, not returned)."""
        taken: list[Heard] = []
        while self._events:
            item = self._events.popleft()
            if isinstance(item, Closed):
                self._closed = item
            else:
                taken.append(item)
        return taken

    async def next(self) -> Heard | Closed:
        """The next event, waiting for it; a :class:`Closed` once the connection has ended."""
        while not self._events:
            if self._closed is not None:
                return self._closed
            if self._deaf:  # dropped by us, or past the bound: nothing will come
                return Closed(self._frames.mid_frame)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._events.popleft()
        if isinstance(item, Closed):
            self._closed = item
        return item

    async def write(self, data: bytes, control_id: str) -> None:
        """Write one framed message and wait until the transport has taken it (its buffer
        below the high-water mark).

        Raises:
            OSError: the connection failed (``ConnectionResetError`` once it is lost).
        """
        self.sent.append(control_id)
        self.exchanges += 1
        transport = self._transport
        if transport is None or self._lost or transport.is_closing():
            raise ConnectionResetError("Connection lost")
        transport.write(data)
        while self._paused and not self._lost:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if self._lost:
            raise ConnectionResetError("Connection lost")

    def abort(self) -> None:
        """Drop the connection at once (no close handshake); nothing more is heard."""
        self._deaf = True
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        """Close the connection politely (buffered bytes are written first) and wait for it."""
        self._deaf = True
        if self._transport is None:
            return
        self._transport.close()
        if self._lost_waiter is not None:
            with contextlib.suppress(Exception):
                await self._lost_waiter


def _enable_keepalive(transport: asyncio.BaseTransport | None) -> None:
    """TCP keepalive on the connection's socket (:data:`KEEPALIVE`): a peer that vanished
    without a close is noticed by an idle connection too."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, interval, count = KEEPALIVE
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
