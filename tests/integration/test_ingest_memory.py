"""Ingest under a real memory limit: ``inturn ingest`` runs as its own process inside a memory
cgroup of 225 MiB (the chart's formula for 16 MiB messages, 2 at once), and peers push it the
way that used to take it to 370-443 MiB: 20 senders of 12 MiB at once, and 24 connections that
send 15 MiB of a frame and stall before finishing it. The process must live (no OOM kill), every
peer must get an answer (AA, or AE with ERR "busy"), and every AA must be stored."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import SB, Frame, FrameReader, frame
from inturn.worker.ingest.budget import budget_for, limit_for
from tests.support.pipeline import register
from tests.support.ports import free_port

#: serial: a memory limit, and hundreds of MiB in flight: alone, after the parallel part.
pytestmark = [pytest.mark.store, pytest.mark.serial]

HOST = "127.0.0.1"
MIB = 1024 * 1024
INTURN = Path(sys.executable).parent / "inturn"
#: The limit under test: the chart's formula for 16 MiB messages, two at once.
LIMIT = limit_for(16 * MIB, 2)
V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


@dataclass
class Cgroup:
    """A memory cgroup made for the test (v2 when the memory controller is there, else v1)."""

    path: Path
    v2: bool

    @classmethod
    def make(cls, limit: int) -> Cgroup:
        name = f"inturn-test-{uuid.uuid4().hex[:8]}"
        if (V2 / "cgroup.controllers").exists() and "memory" in (
            V2 / "cgroup.controllers"
        ).read_text().split():
            path = V2 / name
            path.mkdir()
            (path / "memory.max").write_text(str(limit))
            (path / "memory.swap.max").write_text("0")
            return cls(path, True)
        path = V1 / name
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(limit))
        return cls(path, False)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def peak(self) -> int:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except OSError:
            return 0

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def cgroups_usable() -> bool:
    if os.geteuid() != 0:
        return False
    return (V1 / "memory.limit_in_bytes").exists() or "memory" in (
        (V2 / "cgroup.controllers").read_text().split()
        if (V2 / "cgroup.controllers").exists()
        else []
    )


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    port: int
    cgroup: Cgroup
    log: Path


@pytest.fixture
def ingest(fresh_db: str, tmp_path: Path) -> Iterator[Running]:
    if not cgroups_usable():
        pytest.skip("needs root and a memory cgroup controller")
    register(fresh_db, "hospital/adt-out", "adt")
    cgroup = Cgroup.make(LIMIT)
    port, ops = free_port(), free_port()
    log = tmp_path / "ingest.log"
    args = [str(INTURN), "ingest", f"--listen=adt={HOST}:{port}", f"--ops={HOST}:{ops}",
            "--busy-wait=5", "--store-timeout=30"]  # fmt: skip
    env = {**os.environ, "INTURN_DSN": fresh_db, "MALLOC_ARENA_MAX": "2"}
    env.pop("INTURN_MEMORY_LIMIT", None)  # the cgroup's limit is what it must find
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=os.setsid
        )
    cgroup.add(process.pid)  # before it has read anything: it starts slowly (imports)
    try:
        deadline = time.monotonic() + 60
        while b"listening" not in log.read_bytes():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield Running(process, port, cgroup, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
        cgroup.remove()


def message(control_id: str, size: int) -> bytes:
    head = f"MSH|^~\\&|APP|FAC|RECV|RFAC|20240101120000||ADT^A08|{control_id}|P|2.5\r"
    head += "PID|1||12345^^^HOSP^MR||DOE^JANE\rOBX|1|ED|PDF||"
    body = b"A" * (size - len(head) - 1)
    return head.encode() + body + b"\r"


def exchange(port: int, payload: bytes, stall_after: int | None = None) -> tuple[str, str]:
    """Send one framed message (stopping ``stall_after`` bytes into it for 3 s when given);
    return (MSA-1, ERR/MSA text) of the answer, or ("none", why) when there is none."""
    wire = frame(payload)
    try:
        with socket.create_connection((HOST, port), timeout=120) as s:
            if stall_after is None:
                s.sendall(wire)
            else:
                s.sendall(wire[:stall_after])
                time.sleep(3)
                s.sendall(wire[stall_after:])
            reader = FrameReader(1 << 20)
            while True:
                data = s.recv(65536)
                if not data:
                    return "none", "closed"
                frames = [e for e in reader.feed(data) if isinstance(e, Frame)]
                if frames:
                    ack = parse_ack(frames[0].payload)
                    return ack.code, f"{ack.text or ''} {ack.error_text or ''}"
    except OSError as exc:
        return "none", type(exc).__name__


def at_once(
    port: int, payloads: list[bytes], stall_after: int | None = None
) -> list[tuple[str, str]]:
    results: list[tuple[str, str]] = [("none", "not run")] * len(payloads)

    def run(n: int) -> None:
        results[n] = exchange(port, payloads[n], stall_after)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(payloads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


def stored(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # ingest stores each message once, in its channel's log
        return {r[0] for r in conn.execute("SELECT control_id FROM inturn_message")}


def check(ingest: Running, dsn: str, names: list[str], results: list[tuple[str, str]]) -> None:
    print(
        f"peak {ingest.cgroup.peak() / MIB:.0f} MiB of {LIMIT / MIB:.0f} MiB;"
        f" AA {sum(r[0] == 'AA' for r in results)}, AE {sum(r[0] == 'AE' for r in results)}"
    )
    assert ingest.process.poll() is None, ingest.log.read_text()[-3000:]
    assert ingest.cgroup.oom_kills() == 0
    assert all(code in ("AA", "AE") for code, _ in results), results
    assert all("busy" in text for code, text in results if code == "AE"), results
    accepted = {name for name, (code, _) in zip(names, results, strict=True) if code == "AA"}
    assert accepted and accepted <= stored(dsn)  # every AA is stored
    refused = {name for name, (code, _) in zip(names, results, strict=True) if code == "AE"}
    assert not refused & stored(dsn)  # nothing of an AE was kept


def test_the_budget_comes_from_the_cgroup_limit(ingest: Running) -> None:
    text = ingest.log.read_text()
    said = f"memory for messages: {budget_for(LIMIT) // MIB} MiB of the {LIMIT // MIB} MiB"
    assert said in text


def test_twenty_senders_of_12_mib_at_once(ingest: Running, fresh_db: str) -> None:
    names = [f"BIG{n:02d}" for n in range(20)]
    results = at_once(ingest.port, [message(n, 12 * MIB) for n in names])
    check(ingest, fresh_db, names, results)
    # and the survivors: once the crowd is gone, a resend of every refused one is taken
    again = [n for n, (code, _) in zip(names, results, strict=True) if code != "AA"]
    for name in again:
        assert exchange(ingest.port, message(name, 12 * MIB))[0] == "AA"
    assert set(names) <= stored(fresh_db)


def test_24_connections_stalling_in_the_middle_of_15_mib_frames(
    ingest: Running, fresh_db: str
) -> None:
    names = [f"STALL{n:02d}" for n in range(24)]
    results = at_once(
        ingest.port, [message(n, 15 * MIB) for n in names], stall_after=15 * MIB - 4096
    )
    check(ingest, fresh_db, names, results)
    assert SB == 0x0B
