"""Connection strings: checked, relative socket folders made absolute, the local one found."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from inturn.worker.store.dsn import DsnError, local_dsn, normalize_dsn


def test_relative_socket_folder_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = normalize_dsn("postgresql://postgres:secret@/postgres?host=.inturn/pg")
    assert conninfo_to_dict(uri) == {
        "host": str(tmp_path / ".inturn" / "pg"),
        "user": "postgres",
        "password": "secret",
        "dbname": "postgres",
    }
    kv = normalize_dsn("host=run/pg,db.example dbname=x")
    assert conninfo_to_dict(kv)["host"] == f"{tmp_path / 'run' / 'pg'},db.example"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://inturn:pw@db.example:5432/inturn?sslmode=verify-full",
        "host=/var/run/postgresql dbname=inturn",
        "dbname=inturn",
    ],
)
def test_good_strings_are_kept_as_they_are(dsn: str) -> None:
    assert normalize_dsn(dsn) == dsn


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("postgresql://user:pw@a..b/db", "invalid database host 'a..b' in the connection string"),
        ("host=x port", "invalid database connection string: "),
        ("postgresql://user:pw@[::1/db", "invalid database connection string: "),
    ],
)
def test_bad_strings_are_one_line_without_the_password(dsn: str, message: str) -> None:
    with pytest.raises(DsnError) as caught:
        normalize_dsn(dsn)
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text and "pw" not in text


def test_local_dsn_reads_a_live_postmaster_pid(tmp_path: Path) -> None:
    assert local_dsn(tmp_path) is None
    pg = tmp_path / "pg"
    pg.mkdir()
    lines = [str(os.getpid()), str(pg), "1796064000", "5433", "/tmp/sock", "", "1 2", "ready"]
    (pg / "postmaster.pid").write_text("\n".join(lines) + "\n")
    assert conninfo_to_dict(local_dsn(tmp_path) or "") == {
        "host": "/tmp/sock",
        "port": "5433",
        "user": "postgres",
        "dbname": "postgres",
    }
    lines[0] = "999999999"  # no such process: a stale file after a crash
    (pg / "postmaster.pid").write_text("\n".join(lines) + "\n")
    assert local_dsn(tmp_path) is None
