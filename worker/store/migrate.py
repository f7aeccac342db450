"""Versioned schema migrations kept as ``.sql`` files in ``inturn.worker.store.migrations``.

Each file is named ``NNNN_description.sql`` and is applied once, in version order, inside its own
transaction, and recorded in ``inturn_schema_migrations``. Each transaction holds the migrate
advisory lock (transaction level) and checks what is applied inside it, so two pods starting
together apply each migration exactly once: the second waits, then finds nothing left to do.
Nothing is held across transactions, so it works behind a transaction-mode pooler. Running it
again changes nothing. Every run then indexes the rows whose identifier index keys are still
missing (:func:`inturn.worker.store.identifiers.backfill`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg.rows import dict_row

from inturn.worker.errors import Invalid
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
        Invalid: a file in the migrations folder is misnamed, or two share a version.
    """
    found: dict[int, Migration] = {}
    for entry in resources.files("inturn.worker.store").joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _NAME.match(entry.name)
        if match is None:
            raise Invalid(f"migration file {entry.name!r} is not named NNNN_description.sql")
        version = int(match.group(1))
        if version in found:
            raise Invalid(f"two migrations share version {version}")
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
    # One transaction per migration, each under the transaction-level migrate lock and checking
    # what is applied inside it: two pods migrating at once apply each migration once, and
    # nothing is held across transactions, so it works through a transaction-mode pooler too
    # (never a prepared statement: a pooler would hand it to another backend).
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None, **write_target(dsn)) as conn:
        with conn.transaction():
            conn.execute(locks.Q["xact_lock"], {"key": locks.MIGRATE})
            conn.execute(Q["ensure_table"])
        for migration in available():
            with conn.transaction():
                conn.execute(locks.Q["xact_lock"], {"key": locks.MIGRATE})
                with conn.cursor(row_factory=dict_row) as cur:
                    done = {row["version"] for row in cur.execute(Q["applied"]).fetchall()}
                if migration.version in done:
                    continue
                conn.execute(migration.sql.encode())
                conn.execute(Q["record"], {"version": migration.version, "name": migration.name})
            applied_now.append(migration)
        # Rows stored before the identifier index, or by an older ingest since.
        backfill(conn)
    return applied_now
