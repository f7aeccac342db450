"""One MLLP connection held by a sender: a reader that never stops, and what it has heard.

A task reads the connection for as long as it is open and turns the bytes into framing events
(:class:`inturn.worker.hl7.mllp.FrameReader`), queued in arrival order. The sender can thus
look at what arrived *before* it writes a message (leftovers of an earlier exchange: a second
ACK, a late answer, trailing bytes, or the peer's close) and throw it away, since nothing that
arrived before a message was written can be its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass

from inturn.worker.hl7.mllp import Event, FrameReader

#: Bytes asked for per read.
READ_CHUNK = 64 * 1024
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


class Link:
    """An open connection and its reader task.

    Args:
        reader, writer: the stream pair (TCP or TLS).
        max_frame_bytes: the largest block accepted.

    Attributes:
        sent: MSH-10 values of the messages written on this connection, oldest first (the
            last :data:`REMEMBERED_IDS`).
        exchanges: messages written on it so far (0 for a fresh connection).
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_bytes: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.sent: deque[str] = deque(maxlen=REMEMBERED_IDS)
        self.exchanges = 0
        self._events: asyncio.Queue[Heard | Closed] = asyncio.Queue()
        self._closed: Closed | None = None
        self._task = asyncio.create_task(self._pump(FrameReader(max_frame_bytes)))

    async def _pump(self, frames: FrameReader) -> None:
        try:
            while True:
                chunk = await self.reader.read(READ_CHUNK)
                if not chunk:
                    self._events.put_nowait(Closed(frames.mid_frame))
                    return
                events = frames.feed(chunk)
                for event in events:
                    self._events.put_nowait(Heard(event))
                if frames.failed:
                    return
        except (OSError, EOFError) as exc:
            text = str(exc) or type(exc).__name__
            self._events.put_nowait(Closed(frames.mid_frame, text))

    @property
    def usable(self) -> bool:
        """Neither closed by the peer nor failed, as far as has been heard."""
        return self._closed is None and not self.writer.is_closing()

    def leftovers(self) -> list[Heard]:
        """Take every event heard so far without waiting (a close is remembered, not returned)."""
        taken: list[Heard] = []
        while not self._events.empty():
            item = self._events.get_nowait()
            if isinstance(item, Closed):
                self._closed = item
            else:
                taken.append(item)
        return taken

    async def next(self) -> Heard | Closed:
        """The next event, waiting for it; a :class:`Closed` once the connection has ended."""
        if self._closed is not None and self._events.empty():
            return self._closed
        item = await self._events.get()
        if isinstance(item, Closed):
            self._closed = item
        return item

    async def write(self, data: bytes, control_id: str) -> None:
        """Write one framed message and wait until it is flushed to the socket.

        Raises:
            OSError: the connection failed.
        """
        self.sent.append(control_id)
        self.exchanges += 1
        self.writer.write(data)
        await self.writer.drain()

    def abort(self) -> None:
        """Drop the connection at once (no close handshake) and stop the reader."""
        self._task.cancel()
        self.writer.transport.abort()

    async def close(self) -> None:
        """Close the connection politely and stop the reader."""
        self._task.cancel()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        with contextlib.suppress(BaseException):
            await self._task
