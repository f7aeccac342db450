"""Migrations produce the schema the code expects, once, even when two pods race."""

from __future__ import annotations

import re
import threading
from importlib import resources

import psycopg
import pytest
from psycopg import sql

from inturn.worker.store import delivery
from inturn.worker.store.migrate import available, migrate
from inturn.worker.store.queries import parse

pytestmark = pytest.mark.store


def test_second_run_changes_nothing(empty_db: str) -> None:
    first = migrate(empty_db)
    assert [m.version for m in first] == [m.version for m in available()]
    assert migrate(empty_db) == []


def test_two_pods_starting_together_apply_each_migration_once(empty_db: str) -> None:
    results: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(len(migrate(empty_db)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Each migration once, by whichever pod reached it first (each takes the lock per migration,
    # so that nothing is held across transactions: pooler-safe), in version order.
    assert sum(results) == len(available())
    with psycopg.connect(empty_db) as conn:
        rows = conn.execute("SELECT version FROM inturn_schema_migrations ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == [m.version for m in available()]


def test_delivery_table_has_the_expected_columns(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        cols = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'inturn_delivery'"
            ).fetchall()
        )
        head = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'inturn_delivery_head'"
        ).fetchone()
    assert cols == {
        "id": "bigint",
        "destination": "text",
        "channel": "text",
        "control_id": "text",
        "message_type": "text",
        "payload": "bytea",
        "size": "integer",
        "state": "text",
        "attempts": "integer",
        "enqueued_at": "timestamp with time zone",
        "next_attempt": "timestamp with time zone",
        "last_attempt": "timestamp with time zone",
        "last_error": "text",
        "reason": "text",
        "decided_by": "text",
        "finished_at": "timestamp with time zone",
        "patient_keys": "ARRAY",
        "traceparent": "text",
        "resent_as": "bigint",
        "resent_from": "bigint",
        "message_id": "bigint",
        "seal_id": "bigint",
        "seal_scope": "text",
    }
    assert head is not None
    assert "(destination, id)" in head[0] and "WHERE (state = 'pending'::text)" in head[0]


def test_retry_bookkeeping_columns_are_not_indexed(dsn: str) -> None:
    """So that a failed attempt's UPDATE can stay heap-only (HOT)."""
    with psycopg.connect(dsn) as conn:
        defs = [
            r[0]
            for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'inturn_delivery'"
            ).fetchall()
        ]
    for column in ("attempts", "next_attempt", "last_attempt", "last_error", "reason"):
        assert not any(re.search(rf"\b{column}\b", d) for d in defs), column


def test_every_named_query_plans_against_the_schema(dsn: str) -> None:
    """EXPLAIN each query of every .sql file with NULL parameters: names and columns resolve.
    The queries are those the package sends: their fragments composed in (queries.parse)."""
    sql_dir = resources.files("inturn.worker.store").joinpath("sql")
    checked = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for entry in sql_dir.iterdir():
            if not entry.name.endswith(".sql"):
                continue
            queries = parse(entry.read_text("utf-8"))
            if entry.name == "keystore.sql":
                # the key store's own database: its tables are made here, rolled back after
                with conn.transaction(force_rollback=True):
                    conn.execute(queries.pop("schema").encode())
                    for name, query in queries.items():
                        params = {p: None for p in re.findall(r"%\((\w+)\)s", query)}
                        try:
                            conn.execute(f"EXPLAIN {query}", params)  # type: ignore[arg-type]
                        except psycopg.Error as exc:
                            pytest.fail(f"{entry.name}:{name}: {exc}")
                        checked += 1
                continue
            assert not any("-- include:" in q for q in queries.values()), entry.name
            if entry.name == "queue.sql":
                assert "set_config('synchronous_commit'" in queries["take"]  # the guard, composed
            for name, query in queries.items():
                params = {p: None for p in re.findall(r"%\((\w+)\)s", query)}
                if "{role}" in query or "{table}" in query:
                    # roles.sql's worker policies: identifiers composed in as apply_roles does
                    query = (
                        sql.SQL(query)
                        .format(
                            policy=sql.Identifier("inturn_plan_check"),
                            role=sql.Identifier(conn.info.user),
                            table=sql.Identifier("inturn_delivery"),
                        )
                        .as_string(conn)
                    )
                # EXPLAIN plans queries only: utility statements (DDL, SET) run in a
                # transaction rolled back.
                utility = re.match(r"(?:\s*--[^\n]*\n)*\s*(CREATE|SET|DROP)\b", query)
                try:
                    if utility:
                        with conn.transaction(force_rollback=True):
                            conn.execute(query, params)  # type: ignore[arg-type]
                    else:
                        conn.execute(f"EXPLAIN {query}", params)  # type: ignore[arg-type]
                except psycopg.Error as exc:
                    pytest.fail(f"{entry.name}:{name}: {exc}")
                checked += 1
        # the per-message statements as sent between lease renewals (the guard's check alone)
        for name, query in delivery.CHECKING.items():
            params = {p: None for p in re.findall(r"%\((\w+)\)s", query)}
            try:
                conn.execute(f"EXPLAIN {query}", params)  # type: ignore[arg-type]
            except psycopg.Error as exc:
                pytest.fail(f"queue.sql:{name} (checking the lease): {exc}")
    assert checked >= 20
