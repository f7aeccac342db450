"""A live ``inturn local`` (or ``inturn worker``) for the tests: a subprocess on the session
database, real receivers, messages over a real MLLP connection (imported as
``tests.support.local``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from ssl import SSLContext

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from tests.support.ports import free_port as free_port

INTURN = Path(sys.executable).parent / "inturn"
#: python-hl7's MLLP client, installed beside ``inturn``.
MLLP_SEND = Path(sys.executable).parent / "mllp_send"
HOST = "127.0.0.1"


def mllp_sender(port: int) -> str:
    """The ``spec.sender`` (YAML flow text) of an MLLP receiver on ``port`` of :data:`HOST`."""
    return f"{{mllp: {{host: {HOST}, port: {port}}}}}"


def http_sender(url: str) -> str:
    """The ``spec.sender`` (YAML flow text) of an HTTP receiver at ``url``."""
    return f"{{http: {{url: '{url}'}}}}"


def manifest(
    path: Path,
    name: str,
    sender: str,
    *,
    max_attempts: int = 0,
    max_backoff: int = 1,
    suspend: bool = False,
) -> Path:
    """Write a Destination of channel ``adt`` with ``sender`` (YAML flow text) retrying after
    1 s, then up to every ``max_backoff`` s, giving up after ``max_attempts`` (0: never),
    suspended or not."""
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        "  channel: adt\n"
        f"  sender: {sender}\n"
        f"  retry: {{maxAttempts: {max_attempts}, backoffSeconds: 1,"
        f" maxBackoffSeconds: {max_backoff}, timeoutSeconds: 5}}\n"
        "  idleSeconds: 1\n"
        f"  suspend: {'true' if suspend else 'false'}\n"
    )
    return path


def accepting_and_refusing(directory: Path, http_url: str, mllp_port: int) -> list[str]:
    """Manifests of two destinations of channel ``adt`` in ``directory``: ``to-http`` (an HTTP
    receiver at ``http_url``) and ``to-mllp`` (an MLLP receiver on ``mllp_port`` that refuses,
    given up after 2 attempts); ``inturn local``'s ``-f`` arguments for them."""
    files = [
        manifest(directory / "http.yaml", "to-http", http_sender(http_url)),
        manifest(directory / "mllp.yaml", "to-mllp", mllp_sender(mllp_port), max_attempts=2),
    ]
    return [a for f in files for a in ("-f", str(f))]


def message(n: int, prefix: str = "M") -> bytes:
    """An ADT^A01 of a made-up patient whose MSH-10 is ``<prefix><n>`` (five digits)."""
    return (
        f"MSH|^~\\&|TEST|LOCAL|INTURN|LOCAL|20260302120000||ADT^A01^ADT_A01|{prefix}{n:05d}|P|2.5\r"
        f"PID|1||P{n:05d}^^^LOCAL^MR||Testperson^Number{n}\r"
    ).encode()


async def send(port: int, payloads: list[bytes]) -> list[str]:
    """Send each payload over one MLLP connection, one at a time; the ACK codes (MSA-1)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    frames = FrameReader(1 << 20)
    codes: list[str] = []
    try:
        for payload in payloads:
            writer.write(frame(payload))
            await writer.drain()
            got: list[Frame] = []
            while not got:
                data = await asyncio.wait_for(reader.read(65536), 30)
                assert data, "ingest closed the connection"
                got = [e for e in frames.feed(data) if isinstance(e, Frame)]
            codes.append(parse_ack(got[0].payload).code)
    finally:
        writer.close()
    return codes


async def exchange(
    port: int, payload: bytes, *, ssl: SSLContext | None = None, timeout: float = 30.0
) -> bytes | None:
    """Send ``payload`` framed on a new MLLP connection to ``port`` of :data:`HOST` (over TLS
    with ``ssl``); the payload of the first framed reply, or None when the peer closed the
    connection without one. TimeoutError after ``timeout`` s."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=ssl)
    try:
        writer.write(frame(payload))
        await writer.drain()
        frames = FrameReader(1 << 20)
        async with asyncio.timeout(timeout):
            while True:
                data = await reader.read(65536)
                if not data:
                    return None
                for event in frames.feed(data):
                    if isinstance(event, Frame):
                        return event.payload
    finally:
        writer.close()


async def mllp_send_file(port: int, batch: Path, timeout: float = 60) -> bytes:
    """Run python-hl7's ``mllp_send -f BATCH`` against ``port`` of :data:`HOST` (AssertionError
    with its stderr unless it exits 0); what it printed (the replies, framed)."""
    assert MLLP_SEND.exists(), "python-hl7's mllp_send is not installed"
    proc = await asyncio.create_subprocess_exec(
        str(MLLP_SEND), "-p", str(port), "-f", str(batch), HOST,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, err.decode(errors="replace")
    return out


async def mllp_send(port: int, numbers: range, tmp_path: Path) -> list[str]:
    """Send ``message(n, "L")`` for each n of ``numbers`` with python-hl7's ``mllp_send`` (one
    batch file written in ``tmp_path``); the ACK codes (MSA-1), in order."""
    batch = tmp_path / f"batch-{numbers.start}.mllp"
    batch.write_bytes(b"".join(frame(message(n, "L")) for n in numbers))
    out = await mllp_send_file(port, batch)
    replies = [e.payload for e in FrameReader(1 << 20).feed(out) if isinstance(e, Frame)]
    return [parse_ack(r).code for r in replies]


def assert_clean(log: str) -> None:
    """A process's log shows no Python traceback (the whole log is the failure's message)."""
    assert "Traceback" not in log, log


class LocalProcess:
    """``inturn local ARGS`` (run in ``cwd``, by default the log's folder: the test's own,
    where its data folder ``.inturn`` goes, restore witness included) with its log in a file;
    started by :meth:`start`, stopped with Ctrl-C by :meth:`interrupt` (or killed by
    :meth:`kill`)."""

    def __init__(
        self,
        log_path: Path,
        args: list[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.args = args
        self.cwd = cwd if cwd is not None else log_path.parent
        self.env = {
            k: v for k, v in os.environ.items() if k != "INTURN_DSN" and not k.startswith("OTEL_")
        }
        self.env.update(env or {})
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, listen_port: int) -> None:
        """Start it and wait until ``listen_port`` accepts connections."""
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                str(INTURN),
                "local",
                *self.args,
                env=self.env,
                stdout=log,
                stderr=log,
                cwd=self.cwd,
            )
        async with asyncio.timeout(60):
            while True:
                assert self.proc.returncode is None, f"inturn local exited:\n{self.log()}"
                try:
                    _, writer = await asyncio.open_connection(HOST, listen_port)
                except OSError:
                    await asyncio.sleep(0.1)
                    continue
                writer.close()
                return

    def log(self) -> str:
        """Everything it wrote so far."""
        return self.log_path.read_text(errors="replace")

    async def wait_log(self, text: str, timeout: float = 15) -> None:
        """Wait until the log contains ``text`` (a manifest poll takes up to 2 s)."""
        async with asyncio.timeout(timeout):
            while text not in self.log():
                await asyncio.sleep(0.2)

    async def interrupt(self) -> int:
        """Ctrl-C (SIGINT), then its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            return await self.proc.wait()

    async def kill(self) -> None:
        """Kill it if it still runs."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), 30)


async def worker_process(
    manifest_path: Path, env: Mapping[str, str], stderr: int = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    """``inturn worker -f MANIFEST --http-port 0`` started with ``env`` (its output dropped, its
    stderr too unless ``stderr`` says otherwise: ``asyncio.subprocess.PIPE``); the caller stops
    it (and waits for it) in its own way."""
    return await asyncio.create_subprocess_exec(
        str(INTURN), "worker", "-f", str(manifest_path), "--http-port", "0", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
    )  # fmt: skip
