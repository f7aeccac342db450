"""Versioned schema migrations kept as ``.sql`` files in ``inturn.worker.store.migrations``.

Each file is named ``NNNN_description.sql`` and is applied once, in version order, inside its own
transaction, and recorded in ``inturn_schema_migrations``. The whole run holds a session advisory
lock, so two pods starting together apply each migration exactly once: the second waits, then finds
nothing left to do. Running it again changes nothing. Every run then indexes the rows whose
identifier index keys are still missing (:func:`inturn.worker.store.identifiers.backfill`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg.rows import dict_row

from inturn.worker.store import locks
from inturn.worker.store.connect import write_target
from inturn.worker.store.identifiers import backfill
from inturn.worker.store.queries import load

Q = load("migrations.sql")

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One migration file: its version number, name and SQL text."""

    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Return every migration shipped in the package, sorted by version.

    Raises:
        ValueError: a file in the migrations folder is misnamed, or two share a version.
    """
    found: dict[int, Migration] = {}
    for entry in resources.files("inturn.worker.store").joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _NAME.match(entry.name)
        if match is None:
            raise ValueError(f"migration file {entry.name!r} is not named NNNN_description.sql")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two migrations share version {version}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def migrate(dsn: str) -> list[Migration]:
    """Apply every migration not yet applied to the database at ``dsn``.

    Returns:
        The migrations applied by this call (empty when the schema was already current).

    Raises:
        psycopg.OperationalError: the database cannot be reached.
        psycopg.Error: a migration failed; its transaction is rolled back and nothing after it runs.
    """
    applied_now: list[Migration] = []
    with psycopg.connect(dsn, autocommit=True, **write_target(dsn)) as conn:
        conn.execute(locks.Q["lock"], {"key": locks.MIGRATE})
        try:
            conn.execute(Q["ensure_table"])
            with conn.cursor(row_factory=dict_row) as cur:
                done = {row["version"] for row in cur.execute(Q["applied"]).fetchall()}
            for migration in available():
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        Q["record"], {"version": migration.version, "name": migration.name}
                    )
                applied_now.append(migration)
            # Rows stored before the identifier index, or by an older ingest since.
            backfill(conn)
        finally:
            conn.execute(locks.Q["unlock"], {"key": locks.MIGRATE})
    return applied_now
