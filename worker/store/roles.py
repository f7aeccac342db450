"""One Postgres role per component, each with only the privileges its job needs.

``inturn migrate --create-roles`` (run by a role allowed to create roles and owning the
tables, usually the one that runs the migrations) creates the roles below when they do not
exist, as ``LOGIN`` roles without a password (set one with ``ALTER ROLE ... PASSWORD``, or use
certificate or IAM authentication), and then makes each role's table privileges exactly those
of :data:`GRANTS`: everything else is revoked. Running it again after a migration grants the
new tables; it never touches other roles.

=========  ==================================================================================
role       may
=========  ==================================================================================
ingest     read the destination registry; insert delivery rows (and read back their ids); keep
           its duplicate window. It cannot read payloads back, change a delivery's state or
           delete one.
worker     read and update delivery rows (it sends payloads, so it reads them); record failed
           attempts; place items on worklists (``delivery-failed``); read its destination's
           hold. It cannot delete rows or change the registry.
operator   write the destination registry and its carrier claims; read queue depth (delivery
           metadata, never the payload or patient keys).
sweeper    read delivery metadata, the registry and the reservation records; skip expired
           messages (state and decider only); cancel expired bookings (withdraw their
           segments, record the events, enqueue the carriers' cancellation notices); place and
           clear worklist items; write the audit trail. It reads no payload and deletes nothing.
purge      delete finished deliveries and cleared worklist items, reading only the columns
           that decide which.
admin      the CLI's destructive commands (skip, drain, remove, resend, erase, imports, suspend
           and resume) and the console: read and change rows of every table, but no DDL and
           no role management.
reader     the CLI's listings and dashboards: read everything except payloads and patient keys.
=========  ==================================================================================

Privileges are table privileges (PostgreSQL "Privileges", ``GRANT``); a column list limits one
to those columns, and ``except`` grants it on every column but those named (resolved against
the table when the grants are applied, so a new column is covered by the next run). Identity
columns need no sequence privilege. Functions used by the queries (``pg_notify``, advisory
locks) are executable by every role by default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from inturn.worker.store import locks
from inturn.worker.store.queries import load

#: Component names, in the order roles are created.
COMPONENTS = ("ingest", "worker", "operator", "sweeper", "purge", "admin", "reader")
#: Default role name prefix: roles are ``inturn_ingest``, ``inturn_worker``, ...
DEFAULT_PREFIX = "inturn_"

_PREFIX = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
Q = load("roles.sql")


@dataclass(frozen=True)
class Grant:
    """One table privilege.

    Attributes:
        privilege: SELECT, INSERT, UPDATE or DELETE.
        columns: only these columns (empty: the whole table).
        but: every column except these (resolved when applied); exclusive with ``columns``.
    """

    privilege: str
    columns: tuple[str, ...] = ()
    but: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.privilege not in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            raise ValueError(f"unknown privilege {self.privilege!r}")
        if self.columns and self.but:
            raise ValueError("columns and but exclude each other")


SELECT = Grant("SELECT")
INSERT = Grant("INSERT")
UPDATE = Grant("UPDATE")
DELETE = Grant("DELETE")
ALL_DML = (SELECT, INSERT, UPDATE, DELETE)
#: Delivery columns that hold patient data: the payload, and digests of its patient IDs.
PATIENT_DATA = ("payload", "patient_keys")
NO_PATIENT_DATA = Grant("SELECT", but=PATIENT_DATA)

#: Every table of the schema -> role -> its privileges. A table missing here fails
#: tests/integration/test_roles.py: each new table needs a decision (an empty mapping is one).
GRANTS: dict[str, dict[str, tuple[Grant, ...]]] = {
    "inturn_schema_migrations": {"reader": (SELECT,)},
    "inturn_delivery": {
        # RETURNING id needs SELECT on id; nothing else is readable.
        "ingest": (INSERT, Grant("SELECT", ("id",))),
        "worker": (SELECT, UPDATE),
        "operator": (
            Grant(
                "SELECT",
                ("id", "destination", "channel", "state", "attempts", "enqueued_at", "last_error"),
            ),
        ),
        # cancellation notices of auto-cancelled bookings are enqueued by the sweeper;
        # delivery-expired skips a message: its state and who decided, never its content.
        "sweeper": (
            NO_PATIENT_DATA,
            INSERT,
            Grant("UPDATE", ("state", "decided_by", "finished_at", "reason")),
        ),
        "purge": (Grant("SELECT", ("id", "state", "finished_at")), DELETE),
        "admin": ALL_DML,
        "reader": (NO_PATIENT_DATA,),
    },
    # ingest's own duplicate window (it purges it itself); nobody else uses it
    "inturn_received": {
        "ingest": (SELECT, INSERT, Grant("UPDATE", ("received_at", "size")), DELETE),
    },
    "inturn_audit": {
        "sweeper": (INSERT,),
        "admin": (SELECT, INSERT),
        "reader": (SELECT,),
    },
    "inturn_worker_sender": {
        "worker": (SELECT, INSERT, UPDATE),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_destination": {
        "ingest": (SELECT,),
        # The head query honours a hold (suspend from the console or the CLI).
        "worker": (Grant("SELECT", ("destination", "held_at")),),
        "operator": (SELECT, INSERT, UPDATE),
        "sweeper": (SELECT,),
        # Suspend and resume set or lift a hold; nothing else of the registry changes.
        "admin": (SELECT, Grant("UPDATE", ("held_at", "held_by", "held_why", "updated_at"))),
        "reader": (SELECT,),
    },
    # Failed attempts (an item's history): written by the worker with each retry or give-up,
    # deleted with their item (ON DELETE CASCADE runs as the table's owner).
    "inturn_attempt": {
        "worker": (INSERT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_destination_carrier": {
        "operator": ALL_DML,
        "sweeper": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_worklist_item": {
        "worker": (SELECT, INSERT),
        "sweeper": (SELECT, INSERT, UPDATE),
        "purge": (Grant("SELECT", ("id", "state", "cleared_at")), DELETE),
        "admin": (SELECT, INSERT, UPDATE),
        "reader": (SELECT,),
    },
    "inturn_booking": {
        "sweeper": (SELECT, UPDATE),
        "admin": ALL_DML,
        "reader": (SELECT,),
    },
    "inturn_segment": {"sweeper": (SELECT, UPDATE), "admin": ALL_DML, "reader": (SELECT,)},
    "inturn_segment_event": {
        "sweeper": (SELECT, INSERT),
        "admin": ALL_DML,
        "reader": (SELECT,),
    },
}


def role_name(component: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The role of ``component``: ``prefix + component``.

    Raises:
        ValueError: an unknown component, or a prefix that is not a lower-case identifier.
    """
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")
    if not _PREFIX.match(prefix):
        raise ValueError(f"role prefix {prefix!r}: lower-case letters, digits and _ only")
    return prefix + component


class RolesError(Exception):
    """Roles cannot be created or granted (the message says why, in one line)."""


def _column(conn: psycopg.Connection[Any], query: str, params: Any, name: str) -> list[Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [row[name] for row in cur.execute(Q[query], params).fetchall()]


def _columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    return _column(conn, "columns", {"table": table}, "attname")


def _grant_sql(grant: Grant, table: str, role: str, columns: Iterable[str]) -> sql.Composed:
    chosen = list(grant.columns) or [c for c in columns if c not in grant.but]
    what: sql.Composable = sql.SQL(grant.privilege)
    if grant.columns or grant.but:
        what = sql.SQL("{} ({})").format(
            sql.SQL(grant.privilege), sql.SQL(", ").join(map(sql.Identifier, chosen))
        )
    return sql.SQL("GRANT {} ON TABLE {} TO {}").format(
        what, sql.Identifier(table), sql.Identifier(role)
    )


def tables(conn: psycopg.Connection[Any]) -> list[str]:
    """The tables of the current schema whose names start with ``inturn_``, sorted."""
    return _column(conn, "tables", None, "tablename")


def apply_roles(dsn: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Create the missing component roles and set every role's table privileges to
    :data:`GRANTS`, in one transaction.

    Returns:
        The roles created by this call (empty when they all existed).

    Raises:
        ValueError: a bad prefix.
        RolesError: the connecting role may not create roles or grant on the tables, or a
            table of the schema has no entry in :data:`GRANTS`.
        psycopg.OperationalError: the database cannot be reached.
    """
    names = {component: role_name(component, prefix) for component in COMPONENTS}
    created: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = tables(conn)
        undecided = sorted(set(present) - set(GRANTS))
        if undecided:
            raise RolesError(f"no grant decision for table(s) {', '.join(undecided)}")
        try:
            with conn.transaction():
                conn.execute(locks.Q["xact_lock"], {"key": locks.ROLES})
                for role in names.values():
                    if not _column(conn, "role_exists", {"role": role}, "present")[0]:
                        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                        created.append(role)
                database = conn.info.dbname
                [schema] = _column(conn, "current_schema", None, "schema")
                for role in names.values():
                    ident = sql.Identifier(role)
                    conn.execute(
                        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                            sql.Identifier(database), ident
                        )
                    )
                    conn.execute(
                        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                            sql.Identifier(schema), ident
                        )
                    )
                for table in present:
                    columns = _columns(conn, table)
                    for component, role in names.items():
                        conn.execute(
                            sql.SQL("REVOKE ALL ON TABLE {} FROM {}").format(
                                sql.Identifier(table), sql.Identifier(role)
                            )
                        )
                        for grant in GRANTS[table].get(component, ()):
                            conn.execute(_grant_sql(grant, table, role, columns))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise RolesError(
                f"not allowed to create roles or grant on the tables ({exc.diag.message_primary});"
                " run it as the tables' owner with CREATEROLE"
            ) from None
    return created
