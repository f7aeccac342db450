"""The MLLP listener of one channel: asyncio streams, one task per connection, no threads.

Per connection, messages are handled strictly one after another: read until a frame is
complete, store it, write its acknowledgement, and only then look at the next frame (frames
that arrived in the same read wait in a queue). Framing is :class:`inturn.worker.hl7.mllp.
FrameReader`'s (pipelined and split frames, a missing CR after EB, NUL / whitespace between
frames).

Timeouts, in seconds:

* ``idle_timeout`` (default 600): no byte at all between frames for this long closes the
  connection;
* ``frame_timeout`` (default 30): inside a frame, no new byte for this long closes the
  connection (a peer that stopped mid-frame); whatever it had sent is dropped, unanswered;
* ``frame_deadline`` (default 300): a frame not complete this long after its first byte closes
  the connection the same way, however steadily it trickles in.

Memory (:mod:`inturn.worker.ingest.budget`): each connection holds
:data:`~inturn.worker.ingest.budget.CONNECTION_BYTES` of the process's budget while open
(served before any frame: waiting frames give theirs up for it), and every frame holds its
bytes from the read that brings them until its answer is written. A frame that finds no room
waits, not reading, so TCP holds its sender back; one whose room is taken for an older frame,
or that waits too long, is dropped as it arrives (its first 4 KiB kept for its MSH) and
answered AE with ERR 207 "busy" at its end, and the connection goes on.

Who may connect: a channel's :class:`inturn.worker.ingest.access.AllowList` is checked as soon as
a connection is accepted: the source network before the TLS handshake, the client certificate's
subject right after it. A refused connection is closed before a single message byte is read,
counted in ``inturn_ingest_connections_refused_total`` and logged with the peer address (one
line per address and reason per minute at most, so a scanner cannot flood the log).

A frame over ``max_frame_bytes`` is answered with AR (ERR 104) and the connection is closed,
since the rest of the stream can no longer be trusted to be in step. An idle connection costs a
suspended coroutine, a 64 KiB read at most and one timer: thousands are cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass, field

from inturn.worker.errors import address_in_use
from inturn.worker.hl7.mllp import (
    EB,
    Dropped,
    Event,
    Frame,
    FrameReader,
    FrameTooLarge,
    Garbage,
    frame,
)
from inturn.worker.ingest import metrics
from inturn.worker.ingest.accept import Acceptor
from inturn.worker.ingest.access import AllowList, certificate_names
from inturn.worker.ingest.answer import UNKNOWN
from inturn.worker.ingest.budget import CONNECTION_BYTES, Busy, Hold, MemoryBudget
from inturn.worker.ingest.quiet import LogThrottle

log = logging.getLogger("inturn.ingest.mllp")

#: Default largest message accepted, in bytes (16 MiB).
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Default seconds without a byte between frames before a connection is closed.
DEFAULT_IDLE_TIMEOUT = 600.0
#: Default seconds without a byte inside a frame before a connection is closed.
DEFAULT_FRAME_TIMEOUT = 30.0
#: Default seconds one frame may take from its first byte to its last, however steadily it
#: trickles in (16 MiB at 1 Mbit/s takes 134 s).
DEFAULT_FRAME_DEADLINE = 300.0
#: Bytes kept of a frame dropped for want of memory: enough for its MSH, so that the AE "busy"
#: names its MSH-10.
DROPPED_HEAD_BYTES = 4096

_READ_SIZE = 64 * 1024
#: The stream reader's buffer limit (it stops reading from the socket at twice this), so that a
#: connection holds at most :data:`inturn.worker.ingest.budget.CONNECTION_BYTES` in its reads.
_STREAM_LIMIT = 16 * 1024
#: Seconds of silence after which the rest of a refused frame is taken to have been sent.
QUIET_SECONDS = 0.5
#: Seconds during which further refusals of one address (and reason) are counted, not logged.
REFUSAL_LOG_SECONDS = 60.0


@dataclass(frozen=True)
class ListenerConfig:
    """One MLLP listener.

    Attributes:
        channel: the channel its messages arrive on.
        host: address to bind ('' or ``0.0.0.0`` for every IPv4 address, ``::`` for IPv6).
        port: TCP port; 0 picks a free one (see ``Ingest.mllp_ports``).
        ssl: a server TLS context, or None for plain TCP.
        allow: who may connect (default: anyone the TLS settings let in).
    """

    channel: str
    host: str = "0.0.0.0"
    port: int = 2575
    ssl: ssl.SSLContext | None = None
    allow: AllowList = field(default_factory=AllowList)

    def __post_init__(self) -> None:
        if self.allow.subjects and (self.ssl is None or self.ssl.verify_mode != ssl.CERT_REQUIRED):
            raise ValueError(
                f"channel {self.channel}: allowed subjects need TLS with client certificates"
                " (--tls-client-ca)"
            )


class MllpListener:
    """Serves one channel's MLLP connections.

    Args:
        config: where to listen and for which channel.
        acceptor: stores messages and builds their answers.
        budget: the process's message memory (see :mod:`inturn.worker.ingest.budget`);
            None counts nothing.
        max_frame_bytes, idle_timeout, frame_timeout, frame_deadline: see the module
            docstring.
    """

    def __init__(
        self,
        config: ListenerConfig,
        acceptor: Acceptor,
        *,
        budget: MemoryBudget | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
        frame_deadline: float = DEFAULT_FRAME_DEADLINE,
    ) -> None:
        self.config = config
        self.acceptor = acceptor
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout = idle_timeout
        self.frame_timeout = frame_timeout
        self.frame_deadline = frame_deadline
        self.budget = budget if budget is not None else MemoryBudget(2**62)
        self._server: asyncio.Server | None = None
        self._idle: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._refusals_logged = LogThrottle(REFUSAL_LOG_SECONDS)

    @property
    def channel(self) -> str:
        """The channel this listener serves."""
        return self.config.channel

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`start`)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the listener is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections currently open."""
        return len(self._idle) + len(self._busy)

    async def start(self) -> None:
        """Bind and start accepting connections.

        Raises:
            AddressInUse: another program listens there (the message names
                ``--listen CHANNEL=HOST:PORT``).
            OSError: the address cannot be bound otherwise.
        """
        try:
            self._server = await asyncio.start_server(
                self._serve,
                host=self.config.host or None,
                port=self.config.port,
                backlog=1024,
                limit=_STREAM_LIMIT,
            )
        except OSError as exc:
            raise address_in_use(
                exc, f"--listen {self.channel}=", self.config.host, self.config.port
            ) from None

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, close idle connections, let busy ones finish their message.

        A connection in the middle of storing a message gets up to ``grace`` seconds to commit
        and answer; after that it is cancelled (its sender sends again, and the duplicate
        window absorbs the copy if the COMMIT had happened).
        """
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for task in list(self._idle):
            task.cancel()
        if self._busy:
            _, late = await asyncio.wait(set(self._busy), timeout=grace)
            for task in late:
                task.cancel()
        pending = self._idle | self._busy
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
            self._server = None

    def _mark(self, task: asyncio.Task[None], busy: bool) -> None:
        if busy:
            self._idle.discard(task)
            self._busy.add(task)
        else:
            self._busy.discard(task)
            self._idle.add(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        channel = self.channel
        if self._stopping:
            writer.close()
            return
        self._mark(task, busy=False)
        gauge = metrics.CONNECTIONS.labels(channel)
        gauge.inc()
        peer = writer.get_extra_info("peername")
        reason = "eof"
        try:
            if not await self._admit(writer, peer):
                reason = "refused"
                return
            reason = await self._converse(task, reader, writer)
        except asyncio.CancelledError:
            reason = "shutdown"
            if not self._stopping:
                raise
        except (ConnectionError, ssl.SSLError, OSError) as exc:
            reason = "error"
            log.info("channel %s: connection from %s ended: %s", channel, peer, type(exc).__name__)
        finally:
            self._idle.discard(task)
            self._busy.discard(task)
            gauge.dec()
            if reason not in ("eof", "error", "refused"):
                metrics.CLOSED.labels(channel, reason).inc()
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)

    async def _admit(self, writer: asyncio.StreamWriter, peer: object) -> bool:
        """Check the source network, do the TLS handshake, check the certificate's subject.

        Returns False (after counting and logging) when the allow-list refuses the peer.
        Raises ssl.SSLError / OSError / TimeoutError when the handshake fails.
        """
        allow = self.config.allow
        refusal = allow.network_refusal(peer)
        if refusal is None and self.config.ssl is not None:
            await writer.start_tls(self.config.ssl, ssl_handshake_timeout=self.frame_timeout)
            refusal = allow.subject_refusal(certificate_names(writer.get_extra_info("peercert")))
        if refusal is None:
            return True
        metrics.REFUSED_CONNECTIONS.labels(self.channel, refusal).inc()
        host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        if self._refusals_logged.allow((host, refusal)):
            log.warning(
                "channel %s: refused a connection from %s (%s not allowed)",
                self.channel,
                host,
                "source address" if refusal == "network" else "client certificate",
            )
        return False

    async def _discard_rest(self, reader: asyncio.StreamReader) -> None:
        """Read and drop what the peer still sends of a refused frame, until its end byte, its
        EOF, a pause of :data:`QUIET_SECONDS` or the frame timeout, so that closing does not
        reset the connection before the peer has read the AR (closing with unread input makes
        the kernel send RST, which can discard it)."""
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(self.frame_timeout):
                while True:
                    async with asyncio.timeout(QUIET_SECONDS):
                        chunk = await reader.read(_READ_SIZE)
                    if not chunk or EB in chunk:
                        return

    async def _converse(
        self, task: asyncio.Task[None], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> str:
        """Run the read-store-answer loop; return why it ended."""
        room = self.budget.hold(priority=True)  # the connection's own reads
        try:
            await room.grow(CONNECTION_BYTES)
        except Busy:
            log.warning(
                "channel %s: closing a new connection: ingest's memory is all in use", self.channel
            )
            return "busy"
        frames = self.budget.hold()  # the frames it holds (being read, being stored)
        try:
            return await self._loop(task, reader, writer, frames)
        finally:
            frames.release()
            room.release()

    async def _loop(
        self,
        task: asyncio.Task[None],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        frames: Hold,
    ) -> str:
        channel = self.channel
        framer = FrameReader(self.max_frame_bytes)
        events: deque[Event] = deque()
        frame_began: float | None = None
        while True:
            if not events:
                if self._stopping:
                    return "shutdown"
                mid_frame = framer.mid_frame
                now = time.monotonic()
                if not mid_frame:
                    frame_began = None
                elif frame_began is None:
                    frame_began = now
                timeout = self.idle_timeout
                if frame_began is not None:
                    left = self.frame_deadline - (now - frame_began)
                    if left <= 0:
                        log.info(
                            "channel %s: closing a connection whose frame took over %.0f s"
                            " (%d bytes of it dropped)",
                            channel,
                            self.frame_deadline,
                            framer.buffered_bytes,
                        )
                        return "deadline"
                    timeout = min(self.frame_timeout, left)
                try:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(_READ_SIZE)
                except TimeoutError:
                    if frame_began is not None and timeout < self.frame_timeout:
                        continue  # the deadline, not silence: said on the next turn
                    why = "stalled" if mid_frame else "idle"
                    log.info(
                        "channel %s: closing a connection %s for %.0f s%s",
                        channel,
                        "stalled mid-frame" if mid_frame else "idle",
                        timeout,
                        f" ({framer.buffered_bytes} bytes of a frame dropped)" if mid_frame else "",
                    )
                    return why
                if not data:
                    if framer.mid_frame:
                        log.info(
                            "channel %s: peer closed mid-frame; %d bytes dropped unanswered",
                            channel,
                            framer.buffered_bytes,
                        )
                    return "eof"
                events.extend(framer.feed(data))
                await self._account(framer, events, frames)
                continue
            event = events.popleft()
            if isinstance(event, Garbage):
                metrics.GARBAGE_BYTES.labels(channel).inc(event.count)
                if event.after_bare_end:
                    log.warning(
                        "channel %s: dropped %d bytes that followed a message's end-block byte"
                        " 0x1C sent without its CR: that message (answered already) may have"
                        " been cut at a 0x1C inside it; ask the sender to check it",
                        channel,
                        event.count,
                    )
                else:
                    log.info(
                        "channel %s: dropped %d bytes outside any MLLP block", channel, event.count
                    )
                continue
            if isinstance(event, FrameTooLarge):
                outcome = self.acceptor.reject_too_large(channel, event.limit)
                writer.write(frame(outcome.ack))
                await writer.drain()
                await self._discard_rest(reader)
                return "too_large"
            if isinstance(event, Dropped):
                outcome = self.acceptor.reject_busy(channel, event.head, event.size)
                if outcome.send:
                    writer.write(frame(outcome.ack))
                    await writer.drain()
                continue
            assert isinstance(event, Frame)
            received = time.perf_counter()
            self._mark(task, busy=True)
            try:
                outcome = await self.acceptor.handle(channel, event.payload, received)
                if outcome.code == UNKNOWN:
                    # Whether it was stored cannot be known: no answer rather than a wrong one;
                    # the sender sends again, as after any answer it did not get.
                    return "outcome_unknown"
                if outcome.send:
                    followup = frame(outcome.followup) if outcome.followup else b""
                    writer.write(frame(outcome.ack) + followup)
                    await writer.drain()
            finally:
                self._mark(task, busy=False)
                del event
                frames.trim(_held(framer, events))

    async def _account(self, framer: FrameReader, events: deque[Event], frames: Hold) -> None:
        """Make the frames hold what the framer and the pending frames keep; when the budget
        has no room for them (in time, or gave it to an older frame), drop them: each is
        answered AE "busy" at its end (:class:`Dropped`), and the connection stays in step."""
        need = _held(framer, events)
        if need <= frames.held:
            frames.trim(need)
            return
        try:
            await frames.grow(need - frames.held)
        except Busy as exc:
            metrics.BUSY.labels(self.channel).inc()
            log.warning(
                "channel %s: no memory for %d bytes of message now (%s); answering AE busy",
                self.channel,
                need,
                exc,
            )
            for n, event in enumerate(events):
                if isinstance(event, Frame):
                    events[n] = Dropped(event.payload[:DROPPED_HEAD_BYTES], len(event.payload))
            framer.drop(DROPPED_HEAD_BYTES)
            frames.release()


def _held(framer: FrameReader, events: deque[Event]) -> int:
    """Bytes of messages a connection keeps: its unfinished frame and its pending frames (the
    few KiB kept of dropped ones count with the connection's own bytes)."""
    pending = sum(len(e.payload) for e in events if isinstance(e, Frame))
    return (0 if framer.dropping else framer.buffered_bytes) + pending
