"""``inturn receiver`` as a user runs it: a subprocess on free ports, real MLLP and HTTP."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from inturn.worker.hl7.mllp import frame

INTURN = str(Path(sys.executable).with_name("inturn"))
MESSAGE = b"MSH|^~\\&|LAB|H|EHR|H|20260101||ORU^R01^ORU_R01|CTRL-7|P|2.5\rPID|1||123^^^H^MR\r"


@contextmanager
def receiver(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, int]]]:
    proc = subprocess.Popen(
        [INTURN, "receiver", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ports: dict[str, int] = {}
    try:
        for line in proc.stdout:
            found = re.match(r"receiving (MLLP|HTTP) on [\d.]+:(\d+)", line)
            if found:
                ports[found.group(1)] = int(found.group(2))
            if line.startswith("Ctrl-C"):
                break
        yield proc, ports
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)


def send_mllp(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(frame(payload))
        data = b""
        while not data.endswith(b"\x1c\r"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_prints_one_line_per_message_and_acks() -> None:
    with receiver("--mllp", "0", "--http", "0") as (proc, ports):
        ack = send_mllp(ports["MLLP"], MESSAGE)
        assert b"MSA|AA|CTRL-7" in ack
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports['HTTP']}/hl7", data=MESSAGE, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
        assert send_mllp(ports["MLLP"], b"not hl7").startswith(b"\x0bMSH")  # an AR
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"mllp  CTRL-7  ORU^R01  {len(MESSAGE)} bytes  -> AA"
    assert lines[1] == f"http  CTRL-7  ORU^R01  {len(MESSAGE)} bytes  -> 200"
    assert lines[2].startswith("mllp  (unreadable MSH: ") and lines[2].endswith("-> AR")
    assert lines[-1] == "stopped; messages received: 2 over MLLP, 1 over HTTP"
    assert "123" not in out  # never the content


def test_answers_ae_or_stays_silent() -> None:
    with receiver("--mllp", "127.0.0.1:0", "--ack", "AE", "--ack-text", "try later") as (
        proc,
        ports,
    ):
        assert b"MSA|AE|CTRL-7|try later" in send_mllp(ports["MLLP"], MESSAGE)
    with receiver("--mllp", "0", "--silent") as (proc, ports):
        assert proc.stdout is not None
        with socket.create_connection(("127.0.0.1", ports["MLLP"]), timeout=10) as sock:
            sock.sendall(frame(MESSAGE))
            # the line is printed once the message is read (and, silent, not answered)
            line = proc.stdout.readline()
            sock.setblocking(False)
            try:
                got = sock.recv(100)
            except BlockingIOError:
                got = b"(nothing)"
        assert got == b"(nothing)"
    assert line == f"mllp  CTRL-7  ORU^R01  {len(MESSAGE)} bytes  -> no answer\n"


def test_http_takes_bodies_as_large_as_ingest_accepts_and_can_stay_silent() -> None:
    big = MESSAGE + b"OBX|1|ED|PDF||" + b"A" * (5 * 1024 * 1024) + b"\r"  # over aiohttp's 1 MiB
    with receiver("--mllp", "0", "--http", "0") as (proc, ports):
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports['HTTP']}/hl7", data=big, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200
    with receiver("--mllp", "0", "--http", "0", "--silent") as (proc, ports):
        assert proc.stdout is not None
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports['HTTP']}/hl7", data=MESSAGE, method="POST"
        )
        answered = "answered"
        try:
            urllib.request.urlopen(request, timeout=2)
        except TimeoutError:
            answered = "no answer"
        assert answered == "no answer"
        line = proc.stdout.readline()
    assert line == f"http  CTRL-7  ORU^R01  {len(MESSAGE)} bytes  -> no answer\n"


def test_bad_port_is_a_usage_error() -> None:
    done = subprocess.run(
        [INTURN, "receiver", "--mllp", "http"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--mllp" in done.stderr
