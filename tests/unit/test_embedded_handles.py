"""The embedded Postgres' handle list: pids of killed runs are dropped, so it is stopped again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_command_beside_a_running_local_whose_postgres_is_down_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``queue depth`` in a folder where ``inturn local`` runs but its embedded Postgres is
    down (being restarted) does not tell the user to start the inturn local that is running."""
    from inturn.worker.local.embedded import DataDirLock
    from inturn.worker.store.dsn import (
        LOCAL_DISCOVERY_ENV,
        DsnMissing,
        local_runner_pid,
        resolve_dsn,
    )

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(LOCAL_DISCOVERY_ENV, "on")
    monkeypatch.delenv("INTURN_DSN", raising=False)
    (tmp_path / ".inturn" / "pg").mkdir(parents=True)
    assert local_runner_pid() is None  # no lock file yet
    with pytest.raises(DsnMissing, match="not running: start inturn local"):
        resolve_dsn(None)
    lock = DataDirLock.acquire(tmp_path / ".inturn")
    try:
        assert local_runner_pid() == os.getpid()
        with pytest.raises(DsnMissing) as info:
            resolve_dsn(None)
        assert str(info.value) == (
            "no database: pass --dsn or set INTURN_DSN (inturn local, pid"
            f" {os.getpid()}, runs on ./.inturn but its embedded Postgres is down: it restarts"
            " it, or exits if it cannot; see its log)"
        )
    finally:
        lock.release()
    assert local_runner_pid() is None
