"""Databases for tests: new ones of their own (:func:`database`); the session database with
every table emptied (the list read from the catalog, so a table a new migration adds is emptied
too); destinations registered as the operator registers them.

``fresh_db`` (the root conftest) calls :func:`empty_tables` before each test that asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.conninfo import make_conninfo

from inturn.worker.store import registry
from tests.support.channel_log import reset_epochs

#: What Postgres raises for a statement its role may not run.
Denied = psycopg.errors.InsufficientPrivilege

#: The one table that keeps its rows: the migrations that made the schema.
KEPT = ("inturn_schema_migrations", "inturn_epoch", "inturn_role_setting")


@contextlib.contextmanager
def database(server_dsn: str, prefix: str = "inturn_test") -> Iterator[str]:
    """A new, empty database on the server of ``server_dsn``, named ``<prefix>_<12 hex
    digits>``; yields its DSN and drops it afterwards (its sessions ended)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def tables(conn: psycopg.Connection[Any]) -> list[str]:
    """The names of the tables (plain and partitioned) in the connection's current schema, but
    :data:`KEPT`, sorted."""
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        " AND NOT tablename = ANY(%s) ORDER BY tablename",
        (list(KEPT),),
    ).fetchall()
    return [r[0] for r in rows]


#: The tables a test may have written to since they were last emptied: every table with a page
#: on disk (an INSERT extends the file before it commits, a TRUNCATE leaves it empty) and every
#: table owning a sequence that was advanced (an INSERT that failed on a constraint takes its id
#: without writing a page).
TOUCHED = """
SELECT c.relname FROM pg_class c
 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
   AND pg_relation_size(c.oid) > 0 AND NOT c.relname = ANY(%(kept)s)
UNION
SELECT t.relname FROM pg_sequences s
  JOIN pg_class q ON q.relname = s.sequencename AND q.relnamespace = current_schema()::regnamespace
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = q.oid
                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
  JOIN pg_class t ON t.oid = d.refobjid
 WHERE s.schemaname = current_schema() AND s.last_value IS NOT NULL
   AND NOT t.relname = ANY(%(kept)s)
 ORDER BY 1
"""


def empty_tables(dsn: str) -> list[str]:
    """Empty every table of the database at ``dsn`` but :data:`KEPT`: those a test wrote to
    (:data:`TOUCHED`, read from the catalog) in one ``TRUNCATE ... RESTART IDENTITY CASCADE``
    (ids start again at 1), the others being empty already; returns the tables emptied.

    Truncating only what was written is what makes ``fresh_db`` cheap (about 2 ms when a test
    wrote nothing, against 20 to 40 ms for all of them: docs/explanation/architecture.md, Tests).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(TOUCHED, {"kept": list(KEPT)}).fetchall()]
        if names:
            conn.execute(
                sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                    sql.SQL(", ").join(sql.Identifier(n) for n in names)
                )
            )
        [(migrated,)] = conn.execute("SELECT to_regclass('inturn_epoch') IS NOT NULL").fetchall()
        moved = migrated and conn.execute(EPOCHS_MOVED).fetchall()[0][0]
    if moved:
        reset_epochs(dsn)
    return names


#: Whether a test left the log's epochs other than migrated (an epoch opened, closed, detached
#: or dropped, or a partition more): :data:`KEPT` keeps ``inturn_epoch``, so without a reset the
#: next test would plan on partitions it never made (asked only where the schema has epochs).
EPOCHS_MOVED = """
SELECT (SELECT count(*) FROM inturn_epoch) <> 1
    OR EXISTS (SELECT 1 FROM inturn_epoch WHERE n = 1 AND (closed_at IS NOT NULL
               OR detached_at IS NOT NULL OR dropped_at IS NOT NULL))
    OR (SELECT count(*) FROM pg_class WHERE relname ~ '^inturn_(message|history)_e[0-9]+$'
         AND relnamespace = current_schema()::regnamespace) <> 2
"""


async def register(
    conn: AsyncConnection[Any],
    destination: str,
    channel: str = "adt",
    **fields: Any,
) -> bool:
    """Register ``destination`` (``namespace/name``) on ``channel`` as the operator would, at
    generation 1, live, for every message type; ``fields`` are more of
    :func:`inturn.worker.store.registry.register`'s keywords (``stuck_after_seconds``,
    ``schedule``, ``replies``, ...); whether the registry changed."""
    namespace, name = destination.split("/")
    fields.setdefault("message_types", [])
    fields.setdefault("generation", 1)
    fields.setdefault("suspended", False)
    return await registry.register(
        conn, destination=destination, namespace=namespace, name=name, channel=channel, **fields
    )


def refused(dsn: str, statement: str, params: Any = None) -> bool:
    """True when ``statement`` fails for lack of privilege (and changes nothing)."""
    with psycopg.connect(dsn) as conn:
        try:
            conn.execute(statement, params)
        except Denied:
            return True
        finally:
            conn.rollback()
    return False


def migrate_below(dsn: str, version: int) -> None:
    """The schema of an older release: every migration below ``version`` applied and recorded
    (what an upgrade test starts from)."""
    from inturn.worker.store.migrate import Q as MQ
    from inturn.worker.store.migrate import available

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(MQ["ensure_table"])
        for m in available():
            if m.version < version:
                conn.execute(m.sql.encode())
                conn.execute(MQ["record"], {"version": m.version, "name": m.name})


async def lock_waits(dsn: str, done: asyncio.Event, longest: list[float]) -> None:
    """Until ``done``: every 10 ms, the longest wait of any session of the database for a lock
    (pg_locks.waitstart), the longest seen kept in ``longest[0]``."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not done.is_set():
            cur = await conn.execute(
                "SELECT coalesce(extract(epoch FROM max(clock_timestamp() - waitstart)), 0)"
                " FROM pg_locks WHERE NOT granted AND database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())"
            )
            row = await cur.fetchone()
            longest[0] = max(longest[0], float(row[0]) if row else 0.0)
            await asyncio.sleep(0.01)
