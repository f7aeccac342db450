"""``fresh_db`` empties what the migrations made, read from the catalog (tests/support/db.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.db import KEPT, empty_tables, tables

pytestmark = pytest.mark.store

MIGRATIONS = Path(__file__).resolve().parents[2] / "worker" / "store" / "migrations"


def created() -> set[str]:
    """Every table a migration creates, read from the migration files."""
    text = "\n".join(p.read_text() for p in MIGRATIONS.glob("*.sql"))
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", text))


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
    assert row is not None
    return int(row[0])


def test_every_table_a_migration_creates_is_emptied(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        listed = set(tables(conn))
    assert "inturn_worker_sender" in listed  # the one the hand-written list had missed
    assert created() - set(KEPT) <= listed
    assert not listed & set(KEPT)


def test_empty_tables_leaves_no_row_and_restarts_ids(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_worker_sender (destination, fingerprint) VALUES ('ward/a', 'f')"
        )
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size) VALUES ('ward/a', 'adt', 'M1', 'ADT^A01', '\\x4d'::bytea, 1)"
        )
    emptied = empty_tables(dsn)
    assert {"inturn_worker_sender", "inturn_delivery"} <= set(emptied)
    with psycopg.connect(dsn, autocommit=True) as conn:
        every = tables(conn)
        assert {name: count(conn, name) for name in every} == dict.fromkeys(every, 0)
        assert count(conn, "inturn_schema_migrations") > 0
        row = conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size) VALUES ('ward/a', 'adt', 'M1', 'ADT^A01', '\\x4d'::bytea, 1)"
            " RETURNING id"
        ).fetchone()
    assert row is not None and row[0] == 1
    empty_tables(dsn)


def test_an_id_taken_by_a_failed_insert_is_given_back(dsn: str) -> None:
    """An INSERT refused by a constraint takes its id without writing a page: the table is
    still found (by its sequence) and its ids start again at 1."""
    empty_tables(dsn)
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.NotNullViolation),
    ):
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size) VALUES (NULL, 'adt', 'M1', 'ADT^A01', '\\x4d'::bytea, 1)"
        )
    assert "inturn_delivery" in empty_tables(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size) VALUES ('ward/a', 'adt', 'M1', 'ADT^A01', '\\x4d'::bytea, 1)"
            " RETURNING id"
        ).fetchone()
    assert row is not None and row[0] == 1
    assert empty_tables(dsn) == ["inturn_delivery"]  # the one table written since
    assert empty_tables(dsn) == []  # nothing written: nothing to empty
