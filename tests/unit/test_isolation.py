"""The test suite never finds or touches what belongs to the person running it (their
``./.inturn``, their database, their settings): tests/conftest.py's rules, held."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inturn.worker.store.connect import (
    LOCAL_DISCOVERY_ENV,
    DsnMissing,
    local_discovery,
    resolve_dsn,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_session_runs_from_a_temporary_folder_of_its_own(
    away_from_the_user: Path, pytestconfig: pytest.Config
) -> None:
    here = Path.cwd().resolve()
    assert here == away_from_the_user.resolve()
    assert here.name.startswith("inturn-tests-cwd-")
    assert not here.is_relative_to(ROOT)
    assert here != Path(pytestconfig.invocation_params.dir).resolve()
    assert not (here / ".inturn").exists()


def test_discovery_is_off_and_no_user_setting_passes() -> None:
    assert os.environ[LOCAL_DISCOVERY_ENV] == "off"
    assert local_discovery() is False
    assert "INTURN_DSN" not in os.environ


def fake_local(folder: Path) -> None:
    """A ``./.inturn`` as a running ``inturn local`` leaves it (postmaster.pid naming a live
    process: this one)."""
    pg = folder / ".inturn" / "pg"
    pg.mkdir(parents=True)
    (pg / "postmaster.pid").write_text(f"{os.getpid()}\n{pg}\n0\n54329\n{pg}\n")


def test_a_running_inturn_local_beside_a_test_is_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_local(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DsnMissing) as info:
        resolve_dsn(None)
    assert str(info.value) == "no database: pass --dsn or set INTURN_DSN"
    # the same folder, as the user's own shell sees it: found
    monkeypatch.setenv(LOCAL_DISCOVERY_ENV, "on")
    assert "port=54329" in resolve_dsn(None)
    for off in ("off", "0", "no", "FALSE"):
        monkeypatch.setenv(LOCAL_DISCOVERY_ENV, off)
        assert local_discovery() is False, off


def test_the_ingest_command_without_a_database_says_so_beside_a_running_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test that once hung for good (it found the tutorial's Postgres and served on port
    1): with a ``./.inturn`` right there, it still meets "no database"."""
    from click.testing import CliRunner

    from inturn.worker.cli.ingest import ingest_command

    fake_local(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(ingest_command, ["--listen", "adt=1"], env={"INTURN_DSN": ""})
    assert result.exit_code == 2
    assert "no database: pass --dsn or set INTURN_DSN" in result.output
