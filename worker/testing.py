"""Testing helpers (``inturn.worker.testing``, as ``kopf.testing``): real receiver peers for
tests, the demo, benchmarks and ``inturn receiver``: an MLLP listener and an HTTP one. Kept out
of the runtime's modules; nothing a worker, ingest or the operator runs imports it.

They behave like a downstream system: every message that arrives is recorded in order and
answered. What they answer is settable while they run, so failure paths (AE, AR, a wrong
MSA-2, a slow or absent ACK, an outage) can be exercised against real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from aiohttp import web

from inturn.worker.hl7.ack import AckErrorDetail, build_ack, build_reject
from inturn.worker.hl7.errors import ErrorCode, HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, FrameTooLarge, frame

#: The largest message the test receiver takes, in bytes.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Largest HTTP body the HTTP receiver reads, in bytes: ingest's largest message and then some.
HTTP_MAX_BODY_BYTES = 2 * DEFAULT_MAX_FRAME_BYTES


class MllpReceiver:
    """An MLLP listener that records each message and answers it with an ACK.

    Args:
        host: address to bind.
        port: port to bind; 0 picks a free one (see :attr:`port` after :meth:`start`).
        ack_code: MSA-1 of every ACK (AA, AE, AR, CA, CE, CR); settable at any time.
        ssl_context: a server TLS context, or None for plain TCP.

    Attributes:
        received: payloads in arrival order (exactly the bytes inside each block).
        ack_code: as above.
        ack_text: MSA-3 of every ACK, or None.
        delay_seconds: wait this long before each ACK.
        followup_code: when set (e.g. ``AA`` after a ``CA``), a second ACK with this code is
            written ``followup_delay_seconds`` after the first, like an enhanced-mode receiver
            that sends its application ACK a moment after its commit ACK.
        followup_delay_seconds: as above (default 0.02).
        ack_control_id_override: MSA-2 to write instead of the message's MSH-10.
        reply: False to read messages and never answer them.
        close_after_receive: close the connection right after a message, without answering.
        connections: connections accepted so far.
        on_message: called with each payload and the ACK sent (None when none is), after it is
            answered (or not); for ``inturn receiver``'s one line per message.

    A message whose MSH cannot be read is answered with an AR built by ``build_reject``; a
    message over ``max_frame_bytes`` with an AR (error 104) after which the connection closes.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        ack_code: str = "AA",
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.host = host
        self._port = port
        self.ack_code = ack_code
        self.ack_text: str | None = None
        self.delay_seconds = 0.0
        self.followup_code: str | None = None
        self.followup_delay_seconds = 0.02
        self.ack_control_id_override: str | None = None
        self.reply = True
        self.close_after_receive = False
        self.received: list[bytes] = []
        self.connections = 0
        self.on_message: Callable[[bytes, bytes | None], None] | None = None
        self.ssl_context = ssl_context
        self.max_frame_bytes = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._arrived = asyncio.Condition()

    @property
    def port(self) -> int:
        """The bound port (the requested one before the first :meth:`start`)."""
        return self._port

    @property
    def running(self) -> bool:
        """Whether the listener is accepting connections."""
        return self._server is not None

    async def start(self) -> None:
        """Listen. After a :meth:`stop`, listens again on the same port ("comes back")."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._handle, self.host, self._port, ssl=self.ssl_context, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every open connection ("goes down"); the port is kept."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        for task in handlers:
            with contextlib.suppress(BaseException):
                await task
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> MllpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[bytes]:
        """Wait until at least ``count`` messages arrived; returns :attr:`received`.

        Raises:
            TimeoutError: fewer arrived within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.received) >= count)
        return self.received

    def answer(self, payload: bytes) -> bytes:
        """The ACK this receiver gives to ``payload`` with its current settings (unframed)."""
        try:
            header = parse_header(payload)
        except HeaderError as exc:
            return build_reject(payload, "AR", AckErrorDetail(exc.code, user_message=exc.text))
        error = None
        if self.ack_code not in ("AA", "CA"):
            error = AckErrorDetail(ErrorCode.APPLICATION_INTERNAL_ERROR, user_message=self.ack_text)
        if self.ack_control_id_override is not None:
            header = replace(header, control_id=self.ack_control_id_override)
        return build_ack(header, self.ack_code, text=self.ack_text, error=error)

    @staticmethod
    def _followup(payload: bytes, code: str) -> bytes:
        try:
            return build_ack(parse_header(payload), code)
        except HeaderError:
            return b""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        self.connections += 1
        frames = FrameReader(self.max_frame_bytes)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for event in frames.feed(data):
                    if isinstance(event, FrameTooLarge):
                        too_large = AckErrorDetail(
                            ErrorCode.VALUE_TOO_LONG,
                            user_message=f"message larger than {event.limit} bytes",
                        )
                        writer.write(frame(build_reject(b"", "AR", too_large)))
                        await writer.drain()
                        return
                    if not isinstance(event, Frame):
                        continue
                    async with self._arrived:
                        self.received.append(event.payload)
                        self._arrived.notify_all()
                    if self.close_after_receive or not self.reply:
                        if self.on_message is not None:
                            self.on_message(event.payload, None)
                        if self.close_after_receive:
                            return
                        continue
                    if self.delay_seconds:
                        await asyncio.sleep(self.delay_seconds)
                    ack = self.answer(event.payload)
                    writer.write(frame(ack))
                    await writer.drain()
                    if self.followup_code is not None:
                        later = frame(self._followup(event.payload, self.followup_code))
                        asyncio.get_running_loop().call_later(
                            self.followup_delay_seconds, _write_unless_closed, writer, later
                        )
                    if self.on_message is not None:
                        self.on_message(event.payload, ack)
        except (OSError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # Cancelled by stop(). Ending normally keeps asyncio's stream callback, which
            # inspects the finished task, from reporting the cancellation as an error.
            return
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.transport.abort()


def _write_unless_closed(writer: asyncio.StreamWriter, data: bytes) -> None:
    if data and not writer.is_closing():
        writer.write(data)


class HttpReceiver:
    """An HTTP listener that records every POST body and answers a settable status.

    Args:
        host: address to bind.
        port: port to bind; 0 picks a free one.
        status: the HTTP status of every answer; settable at any time.

    Attributes:
        received: request bodies in arrival order.
        headers: the request headers, one dict per request, in the same order.
        status: as above.
        on_message: called with each body and the status answered.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, status: int = 200) -> None:
        self.host = host
        self._port = port
        self.status = status
        self.received: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.on_message: Callable[[bytes, int], None] | None = None
        #: When True, requests are read and never answered (the sender times out).
        self.silent = False
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    @property
    def port(self) -> int:
        """The bound port (the requested one before the first :meth:`start`)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port/`` of the listener."""
        return f"http://{self.host}:{self._port}/"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append(body)
        self.headers.append(dict(request.headers))
        status = self.status
        if self.on_message is not None:
            self.on_message(body, status)
        if self.silent:
            await self._stopping.wait()  # no answer before stop()
            if request.transport is not None:
                request.transport.close()
        return web.Response(status=status)

    async def start(self) -> None:
        """Listen (again on the same port after a :meth:`stop`)."""
        if self._runner is not None:
            return
        # as large a body as ingest accepts (16 MiB frames), not aiohttp's 1 MiB default
        app = web.Application(client_max_size=HTTP_MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port, reuse_address=True)
        await site.start()
        self._runner = runner
        self._port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop listening and drop open connections; the port is kept for :meth:`start`."""
        runner, self._runner = self._runner, None
        if runner is not None:
            self._stopping.set()
            await runner.cleanup()
            self._stopping = asyncio.Event()

    async def __aenter__(self) -> HttpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


#: The MSH of every message :func:`worst_shapes` builds (its MSH-10 is ``SHAPE``).
SHAPE_MSH = b"MSH|^~\\&|APP|FAC|RECV|RFAC|20240101120000||ADT^A08^ADT_A01|SHAPE|P|2.5.1\r"


def worst_shapes(size: int) -> dict[str, bytes]:
    """Valid ADT messages of about ``size`` bytes each, shaped to cost the most per byte in
    what ingest does with a message (MSH parsing, terminator normalisation, the digest, the
    patient identifier scan of :mod:`inturn.worker.hl7.pid`), for tests and ``bench/shapes.py``.

    Returns ``{name: payload}``:

    * ``distinct_repetitions``: PID-3 with as many distinct identifiers as fit, each with an
      assigning authority (the shape that froze ingest when de-duplication was quadratic);
    * ``same_repetitions``: PID-3 repeating one identifier;
    * ``segments``: as many short PID segments as fit, one identifier each;
    * ``deep_components``: one PID-3 repetition with as many components and subcomponents as fit;
    * ``long_field``: one identifier as long as the message;
    * ``escapes``: one identifier made of escape sequences (``\\F\\``, ``\\X41\\``);
    * ``lone_escape``: one identifier holding a single escape character and then plain text;
    * ``lf_terminators``: ``segments`` terminated by LF, which ingest rewrites to CR.
    """
    room = max(size - len(SHAPE_MSH) - 16, 64)

    def fill(unit: bytes, sep: bytes) -> bytes:
        return sep.join([unit] * max(1, room // (len(unit) + len(sep))))

    def numbered(make: Callable[[int], bytes], sep: bytes) -> bytes:
        parts: list[bytes] = []
        used = 0
        n = 0
        while used < room:
            part = make(n)
            parts.append(part)
            used += len(part) + len(sep)
            n += 1
        return sep.join(parts)

    distinct = numbered(lambda i: b"ID%d^^^AUTH%d" % (i, i % 7), b"~")
    segments = numbered(lambda i: b"PID|%d||S%d^^^H" % (i, i), b"\r")
    return {
        "distinct_repetitions": SHAPE_MSH + b"PID|1||" + distinct + b"\r",
        "same_repetitions": SHAPE_MSH + b"PID|1||" + fill(b"12345^^^HOSP^MR", b"~") + b"\r",
        "segments": SHAPE_MSH + segments + b"\r",
        "deep_components": SHAPE_MSH + b"PID|1||X^" + fill(b"c&s&t", b"^") + b"\r",
        "long_field": SHAPE_MSH + b"PID|1||" + b"7" * room + b"^^^HOSP\r",
        "escapes": SHAPE_MSH + b"PID|1||" + fill(b"\\F\\\\X41\\", b"") + b"^^^H\r",
        "lone_escape": SHAPE_MSH + b"PID|1||\\" + b"a" * room + b"\r",
        "lf_terminators": (SHAPE_MSH + segments + b"\r").replace(b"\r", b"\n"),
    }


#: Where Debian puts the PostgreSQL 15 server programs.
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")


class ScratchPostgres:
    """A PostgreSQL server of its own, to stop and start at will (outage tests and benchmarks).

    ``initdb`` makes a cluster in a temporary folder (trust authentication, user ``postgres``);
    the server listens on 127.0.0.1 at a port chosen once, so :attr:`dsn` stays valid across
    :meth:`stop` and :meth:`start`. Run as root, every server program runs as the ``postgres``
    user (PostgreSQL refuses to run as root). Use as a context manager: the server is stopped
    and its folder removed on exit.

    Args:
        bin_dir: folder of ``initdb`` and ``pg_ctl`` (default: Debian's PostgreSQL 15).

    Raises:
        FileNotFoundError: ``bin_dir`` holds no ``initdb``.
        subprocess.CalledProcessError: a server program failed (its output is in the error).
    """

    def __init__(self, bin_dir: Path = POSTGRES_BIN) -> None:
        if not (bin_dir / "initdb").exists():
            raise FileNotFoundError(f"no initdb in {bin_dir}")
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="inturn-scratch-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user is not None:
            shutil.chown(self.root, self._user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")  # fmt: skip

    @property
    def dsn(self) -> str:
        """The libpq connection string of the server's ``postgres`` database."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [str(self.bin_dir / program), *args],
            check=True,
            capture_output=True,
            user=self._user,
            cwd=self.root,
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
            " -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: sessions are ended; ``immediate``: as a crash would)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        """Whether the server is up (``pg_ctl status``)."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "status")
        except subprocess.CalledProcessError:
            return False
        return True

    def close(self) -> None:
        """Stop the server if it runs and remove its folder."""
        if self.running():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ScratchPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
