"""The tutorial, run as a reader follows it: the shell blocks of docs/tutorial/first-hour.md, in
order, with its own commands, on free ports (every port the page names is replaced by one of
this run's), in a folder holding a copy of ``examples/``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from inturn.worker.store.dsn import LOCAL_DISCOVERY_ENV
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial" / "first-hour.md"
INTURN = str(Path(sys.executable).with_name("inturn"))
#: The reader's environment: commands find the tutorial's ``./.inturn`` (in this test's own
#: folder), which the test suite otherwise never looks for.
ENV = {**os.environ, LOCAL_DISCOVERY_ENV: "on"}
FENCE = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
#: The ports the tutorial names: ingest's MLLP and HTTP listeners, the console, the receivers.
PORTS = (2575, 2576, 8080, 8081, 8090)


def blocks() -> list[str]:
    return [m.group(1) for m in FENCE.finditer(TUTORIAL.read_text())]


def block(containing: str) -> str:
    """The one shell block of the tutorial that contains ``containing``."""
    [found] = [b for b in blocks() if containing in b]
    return found


def shell(text: str, cwd: Path, ports: dict[int, int]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", adapt(text, ports)],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def adapt(text: str, ports: dict[int, int]) -> str:
    """The block as this run executes it: the installed ``inturn``, this run's ports."""
    text = text.replace(".venv/bin/inturn", INTURN)
    return re.sub(
        r"\b(" + "|".join(map(str, ports)) + r")\b", lambda m: str(ports[int(m[1])]), text
    )


@contextmanager
def background(
    text: str, cwd: Path, ports: dict[int, int], ready: int
) -> Iterator[subprocess.Popen[str]]:
    """Run a long-lived command of the tutorial until the block ends; ``ready``: a port that
    accepts connections once it is up."""
    proc = subprocess.Popen(
        ["bash", "-c", "exec " + adapt(text, ports).replace("\\\n", " ")],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", ready), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate(timeout=10)[0]
                time.sleep(0.2)
        else:
            raise AssertionError(f"nothing listens on {ready}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def depth(cwd: Path) -> dict[str, dict[str, int]]:
    out = subprocess.run(
        [INTURN, "queue", "depth", "--json"],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return {r["destination"]: r for r in json.loads(out.stdout)}


@pytest.fixture
def reader_home() -> Iterator[Path]:
    """The reader's folder, outside pytest's tmp tree: pytest sets /tmp/pytest-of-<user> back
    to mode 0700 whenever a pytest session starts (another developer's, on a shared machine),
    and the embedded Postgres's own user (pgserver runs it as one when we are root) must reach
    ``./.inturn/pg`` all along (an initdb failed with "Permission denied" midway that way)."""
    home = Path(tempfile.mkdtemp(prefix="inturn-tutorial-"))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_the_tutorial_runs_as_written(reader_home: Path) -> None:
    tmp_path = reader_home
    ports = {p: free_port() for p in PORTS}
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    for manifest in (tmp_path / "examples").glob("local-*.yaml"):
        manifest.write_text(adapt(manifest.read_text(), ports))

    receiver = block("inturn receiver")
    with (
        background(block("inturn local"), tmp_path, ports, ready=ports[2575]) as local,
        background(receiver, tmp_path, ports, ready=ports[2576]) as first,
    ):
        sent = shell(block("inturn send --mllp 127.0.0.1:2575 examples/messages/"), tmp_path, ports)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert [line.split()[:2] for line in sent.stdout.splitlines()] == [
            ["AA", "TUT0001"],
            ["AA", "TUT0002"],
            ["AA", "TUT0003"],
        ]
        again = shell(block("inturn send --url"), tmp_path, ports)
        assert again.returncode == 0, again.stdout + again.stderr
        looked = shell(block("inturn queue depth"), tmp_path, ports)
        assert looked.returncode == 0, looked.stderr

        # 5. the receiver goes down; more messages are still answered AA and wait
        first.send_signal(signal.SIGINT)
        first.wait(timeout=30)
        more = shell(block("mktemp -d"), tmp_path, ports)
        assert more.returncode == 0, more.stdout + more.stderr
        assert more.stdout.count("AA  TUT010") == 3
        waiting = depth(tmp_path)
        assert waiting["default/local-mllp"]["pending"] >= 1
        # as the page says: an unreachable receiver spends no attempt
        assert waiting["default/local-mllp"]["mostAttempts"] == 0

        # 6. it comes back: everything goes out
        with background(receiver, tmp_path, ports, ready=ports[2576]):
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(
                r["pending"] for r in depth(tmp_path).values()
            ):
                time.sleep(1)
            assert all(r["pending"] == 0 for r in depth(tmp_path).values())
    # 7. Ctrl-C stops it whole
    assert local.returncode == 0
    # the reader's folder holds what they brought and inturn local's data, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == [".inturn", "examples"]
