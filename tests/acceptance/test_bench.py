"""Every benchmark still runs: each ``bench/*.py`` at its ``--tiny`` size, end to end.

A benchmark nobody runs rots (``bench/scale.py`` once failed on a table added elsewhere, and
nothing noticed). Here each one runs as ``make bench`` runs it, but at a toy size, against this
session's Postgres server, and must exit 0 with its last line the JSON object of its figures
(``bench/figures.py``). The figures themselves are never asserted: timing on a shared machine
says nothing, and the full-size run is ``make bench``'s. A benchmark that sends messages
(``bench/corpus.py``) runs on a fresh clone too, with the demo's made-up messages when the
samples are absent, and its ``messages`` figure says which it sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
#: The samples, as tests/conftest.py finds them (read in place, never copied).
SAMPLES = Path(os.environ.get("INTURN_SAMPLES") or BENCH.parents[1] / "shared" / "samples" / "hl7")
#: A benchmark is a script (it runs itself); the other files there are its shared helpers.
BENCHMARKS = sorted(p for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())
#: Longest tiny run, seconds (each takes well under a minute on an idle 2-core machine).
TIMEOUT_SECONDS = 600


def test_every_benchmark_is_in_make_bench() -> None:
    """``make bench`` runs every benchmark script, so the figures the README cites are all
    produced by one command."""
    makefile = (BENCH.parent / "Makefile").read_text()
    target = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    missing = [p.name for p in BENCHMARKS if f"bench/{p.name}" not in target]
    assert missing == []


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_runs_tiny(script: Path, pg_server_dsn: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "INTURN_DSN": pg_server_dsn,
        "INTURN_BENCH_DSN": pg_server_dsn,
        "INTURN_SAMPLES": str(SAMPLES),
    }
    run = subprocess.run(
        [sys.executable, str(script), "--tiny"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    figures = json.loads(last)
    assert figures["bench"] == script.stem
    if "import corpus" in script.read_text():
        expected = "samples" if any(SAMPLES.glob("*.hl7")) else "made-up"
        assert figures["messages"] == expected
        assert "messages: " in run.stdout
