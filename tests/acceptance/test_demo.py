"""``make demo`` end to end: ``examples/demo.py`` as a subprocess, its exit status and summary.

It takes about 25 s (it paces its feed so the outage can be watched) and needs the fixed ports
2575, 2576 and 8090 (marked ``serial``: it runs alone, after the parallel part); deselect it
with ``-m "not demo"``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"

#: serial: its fixed ports would meet another run of it (make test runs it after the rest).
pytestmark = [pytest.mark.demo, pytest.mark.serial]


def figures(summary: str, label: str) -> list[int]:
    """The numbers on the summary line that starts with ``label``."""
    match = re.search(rf"^  {re.escape(label)}\s+(\d+)(?:\s+(\d+))?", summary, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{summary}"
    return [int(g) for g in match.groups() if g is not None]


def test_demo_delivers_everything_in_order_within_two_minutes() -> None:
    run = subprocess.run(
        [sys.executable, str(DEMO)], capture_output=True, text=True, timeout=120, check=False
    )
    if run.returncode == 2 and "already in use" in run.stderr:
        pytest.skip(run.stderr.strip())
    assert run.returncode == 0, run.stdout + run.stderr
    summary = run.stdout[run.stdout.index("\nSummary") :]

    [sent] = figures(summary, "sent")
    assert sent >= 200
    assert figures(summary, "acknowledged AA") == [sent]
    assert figures(summary, "delivered") == [sent, sent]  # MLLP receiver, HTTP receiver
    mllp_duplicates, http_duplicates = figures(summary, "duplicates")
    assert mllp_duplicates <= 1 and http_duplicates == 0
    assert figures(summary, "out of order") == [0, 0]
    assert figures(summary, "discharge before admission") == [0, 0]
    assert figures(summary, "missing") == [0, 0]
    assert figures(summary, "still pending") == [0]
    took = re.search(r"time taken\s+([\d.]+) s", summary)
    assert took and float(took.group(1)) < 120

    # the depth tables seen during the outage: the MLLP queue, growing
    backlog = [int(n) for n in re.findall(r"default/local-mllp\s+adt\s+(\d+)", summary)]
    assert len(backlog) == 2 and 0 < backlog[0] < backlog[1], summary
    assert "OK: every acknowledged message" in run.stdout
