"""The Makefile as a newcomer meets it: the first `make demo` says it is installing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_first_make_demo_says_it_installs(tmp_path: Path) -> None:
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "demo", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    first = dry.stdout.splitlines()[0]
    assert first.startswith("echo ") and "installing inturn" in first and "a minute" in first
