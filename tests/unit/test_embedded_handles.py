"""The embedded Postgres' handle list: pids of killed runs are dropped, so it is stopped again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inturn.worker.local.embedded import forget_dead_handles


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(done.stdout)


def test_pids_of_processes_that_no_longer_run_are_dropped(tmp_path: Path) -> None:
    gone = dead_pid()
    (tmp_path / ".handle_pids.json").write_text(json.dumps([gone, os.getpid()]))
    assert forget_dead_handles(tmp_path) == [gone]
    assert json.loads((tmp_path / ".handle_pids.json").read_text()) == [os.getpid()]


def test_a_clean_list_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / ".handle_pids.json"
    path.write_text(json.dumps([os.getpid()]))
    before = path.stat().st_mtime_ns
    assert forget_dead_handles(tmp_path) == []
    assert path.stat().st_mtime_ns == before


def test_no_list_or_an_unreadable_one_changes_nothing(tmp_path: Path) -> None:
    assert forget_dead_handles(tmp_path) == []
    (tmp_path / ".handle_pids.json").write_text("not json")
    assert forget_dead_handles(tmp_path) == []
    assert (tmp_path / ".handle_pids.json").read_text() == "not json"
