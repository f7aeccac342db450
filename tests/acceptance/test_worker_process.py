"""The ``inturn worker`` process: SIGKILL mid-stream loses nothing, SIGTERM exits cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.local import worker_process
from tests.support.pipeline import count
from tests.support.ports import free_port
from tests.support.sockets import listening_on

INTURN = Path(sys.executable).with_name("inturn")
DEST = "default/restart-test"


def manifest(tmp_path: Path, port: int, timeout: int = 5) -> Path:
    path = tmp_path / "destination.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        "metadata: {name: restart-test, namespace: default}\n"
        "spec:\n"
        "  channel: adt\n"
        f"  sender: {{mllp: {{host: 127.0.0.1, port: {port}}}}}\n"
        f"  retry: {{maxAttempts: 0, backoffSeconds: 1, maxBackoffSeconds: 2,"
        f" timeoutSeconds: {timeout}}}\n"
        "  idleSeconds: 1\n"
    )
    return path


async def start_worker(path: Path, dsn: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "INTURN_DSN": dsn}
    return await worker_process(path, env, stderr=asyncio.subprocess.PIPE)


def message(n: int) -> bytes:
    return f"MSH|^~\\&|A|B|C|D|||ADT^A01|M{n:06d}|P|2.5\rPID|1||{n}\r".encode()


async def enqueue(dsn: str, count: int) -> None:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await queue.enqueue(
            conn, [NewItem(DEST, "adt", f"M{n:06d}", "ADT^A01", message(n)) for n in range(count)]
        )


async def test_sigkill_mid_stream_loses_nothing_and_keeps_order(
    fresh_db: str, tmp_path: Path
) -> None:
    total = 400
    await enqueue(fresh_db, total)
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.005
        path = manifest(tmp_path, rx.port)
        proc = await start_worker(path, fresh_db)
        await rx.wait_for(120, timeout=60)
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
        killed_at = len(rx.received)
        proc = await start_worker(path, fresh_db)
        try:
            async with asyncio.timeout(120):
                while await count(fresh_db, "pending"):
                    await asyncio.sleep(0.1)
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)
    ids = [p.split(b"|")[9].decode() for p in rx.received]
    expected = [f"M{n:06d}" for n in range(total)]
    deduplicated = [x for i, x in enumerate(ids) if i == 0 or ids[i - 1] != x]
    assert deduplicated == expected  # every message, in order
    assert len(ids) - len(expected) <= 1  # at most the one in flight, sent twice
    assert 120 <= killed_at < total


async def test_sigterm_finishes_the_attempt_and_exits_zero(fresh_db: str, tmp_path: Path) -> None:
    await enqueue(fresh_db, 3)
    async with MllpReceiver() as rx:
        rx.delay_seconds = 1.0
        proc = await start_worker(manifest(tmp_path, rx.port, timeout=5), fresh_db)
        await rx.wait_for(1, timeout=30)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):  # within the attempt timeout plus start-up slack
            code = await proc.wait()
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
    assert code == 0, log
    assert "stopped" in log
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute("SELECT state FROM inturn_delivery ORDER BY id")
        states = [r[0] for r in await cur.fetchall()]
    # Nothing lost: the in-flight one is delivered or still pending; the rest are pending.
    assert states[1:] == ["pending", "pending"] and states[0] in ("delivered", "pending")


async def test_the_running_worker_keeps_no_validation_modules(
    fresh_db: str, tmp_path: Path
) -> None:
    """Once the manifest is valid the process becomes the runtime (same PID): neither the YAML
    parser nor the JSON-schema validator (nor aiohttp, for an MLLP destination) stays loaded."""
    await enqueue(fresh_db, 1)
    async with MllpReceiver() as rx:
        proc = await start_worker(manifest(tmp_path, rx.port), fresh_db)
        try:
            await rx.wait_for(1, timeout=60)
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert b"inturn.worker.drain.main" in cmdline
    for library in ("_yaml", "rpds", "aiohttp", "yarl", "multidict"):
        assert library not in maps, library
    assert proc.returncode == 0, err.decode()


async def test_the_runtime_refuses_to_start_alone() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "inturn.worker.drain.main", stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert err.decode().strip() == "inturn: error: start workers with `inturn worker`"


async def test_a_taken_http_port_is_one_line_naming_the_address(
    fresh_db: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            str(INTURN),
            "worker",
            "-f",
            str(manifest(tmp_path, 9)),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(port),
            env={**os.environ, "INTURN_DSN": fresh_db},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2
    assert lines[-1] == f"inturn: error: Address already in use: 127.0.0.1:{port}", lines


async def test_the_ops_endpoints_listen_on_loopback_unless_told(
    fresh_db: str, tmp_path: Path
) -> None:
    """/healthz, /readyz and /metrics are unauthenticated: outside a pod a worker serves them
    on 127.0.0.1 only; --http-host 0.0.0.0 (what the operator's pods pass) opens them to every
    interface."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("reads /proc/net/tcp")
    path = manifest(tmp_path, 9)  # nothing is enqueued: the sender is never used
    seen = {}
    for extra in ((), ("--http-host", "0.0.0.0")):
        port = free_port("0.0.0.0")  # free on every interface, as the second start needs
        proc = await asyncio.create_subprocess_exec(
            str(INTURN),
            "worker",
            "-f",
            str(path),
            "--http-port",
            str(port),
            *extra,
            env={**os.environ, "INTURN_DSN": fresh_db},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                while not listening_on(port):
                    assert proc.returncode is None
                    await asyncio.sleep(0.1)
            seen[extra] = listening_on(port)
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)
    assert seen == {(): {"127.0.0.1"}, ("--http-host", "0.0.0.0"): {"0.0.0.0"}}
