"""Applying the privileges :mod:`inturn.worker.store.roles` declares: ``inturn migrate
--create-roles`` creates the missing component roles and makes each role's table, sequence and
function privileges exactly those of :data:`~inturn.worker.store.roles.GRANTS`,
:data:`~inturn.worker.store.roles.SEQUENCES` and :data:`~inturn.worker.store.roles.FUNCTIONS`
(everything else revoked), in one transaction, then revokes the server's advisory lock
functions from PUBLIC.

What a role may do changes in ``roles.py`` (a new table is a line there); how the grants are
put in place changes here. The catalog reads and the checks are in ``sql/roles.sql``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from inturn.worker.errors import InturnError
from inturn.worker.store import locks
from inturn.worker.store.connect import write_target
from inturn.worker.store.queries import load
from inturn.worker.store.roles import (
    ADVISORY_LOCKS,
    COMPONENTS,
    DEFAULT_PREFIX,
    FUNCTIONS,
    GRANTS,
    SEQUENCES,
    WORKER_SCOPED,
    Grant,
    role_name,
)

Q = load("roles.sql")


class RolesError(InturnError):
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


def functions(conn: psycopg.Connection[Any]) -> list[str]:
    """The functions of the current schema whose names start with ``inturn_``, as signatures
    (``inturn_worker_lock(text)``), sorted."""
    return _column(conn, "functions", None, "signature")


@dataclass
class RolesReport:
    """What :func:`apply_roles` did.

    Attributes:
        created: the roles this call created (empty when they all existed).
        warnings: protections it could not put in place, one sentence each (the advisory lock
            functions still executable by every role when not run by a superuser).
    """

    created: list[str]
    warnings: list[str]


def _grant_functions(
    conn: psycopg.Connection[Any], present: list[str], names: dict[str, str]
) -> None:
    for signature in present:
        function = sql.SQL(signature)  # from the catalog and a key of FUNCTIONS: not user text
        conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(function))
        for component, role in names.items():
            ident = sql.Identifier(role)
            conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(function, ident))
            if component in FUNCTIONS[signature]:
                conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(function, ident))


def _revoke_advisory_locks(conn: psycopg.Connection[Any], names: dict[str, str]) -> list[str]:
    """Revoke the advisory lock functions from PUBLIC and the component roles, granting them to
    the owner of our functions (who takes the locks for them). Returns warnings."""
    [owner] = _column(conn, "function_owner", {"signature": "inturn_worker_lock(text)"}, "owner")
    every = sql.SQL(", ").join(map(sql.SQL, ADVISORY_LOCKS))
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the grants above in place
            conn.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(every))
            for role in names.values():
                conn.execute(
                    sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM {}").format(
                        every, sql.Identifier(role)
                    )
                )
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(every, sql.Identifier(owner))
            )
    except psycopg.errors.InsufficientPrivilege:
        pass  # reported below, from what PUBLIC may still do
    still = _column(conn, "public_executes", {"signatures": list(ADVISORY_LOCKS)}, "signature")
    if not still:
        return []
    return [
        f"every role may still take any advisory lock ({len(still)} of the server's advisory"
        " lock functions are executable by PUBLIC): a role other than the worker's could hold a"
        " destination's worker lock and stop its delivery. Revoking them needs a superuser: run"
        " `inturn migrate --create-roles` once as one (see docs/explanation/security.md)"
    ]


def _scope_worker(conn: psycopg.Connection[Any], worker: str) -> None:
    """Record the worker role for the login functions and (re)make its restrictive row policy
    on every table of :data:`~inturn.worker.store.roles.WORKER_SCOPED` (migration 0036), and the
    pull's on ``inturn_delivery`` (a scoped login inserts slim rows of its own messages only)."""
    conn.execute(Q["record_worker_role"], {"role": worker})
    policy = sql.Identifier(f"{worker}_scope")
    for table in WORKER_SCOPED:
        conn.execute(
            sql.SQL(Q["drop_worker_policy"]).format(policy=policy, table=sql.Identifier(table))
        )
        conn.execute(
            sql.SQL(Q[f"worker_policy_{table}"]).format(policy=policy, role=sql.Identifier(worker))
        )
    pull = sql.Identifier(f"{worker}_pull")
    delivery = sql.Identifier("inturn_delivery")
    conn.execute(sql.SQL(Q["drop_worker_policy"]).format(policy=pull, table=delivery))
    conn.execute(sql.SQL(Q["worker_pull_policy"]).format(policy=pull, role=sql.Identifier(worker)))


def _narrow_sweeper(conn: psycopg.Connection[Any], sweeper: str) -> None:
    """(Re)make the sweeper role's restrictive policy on ``inturn_delivery``: its one change of
    a delivery row is a skip of a pending one, with who decided (``delivery-expired``)."""
    policy = sql.Identifier(f"{sweeper}_skip")
    delivery = sql.Identifier("inturn_delivery")
    conn.execute(sql.SQL(Q["drop_worker_policy"]).format(policy=policy, table=delivery))
    conn.execute(
        sql.SQL(Q["sweeper_skip_policy"]).format(policy=policy, role=sql.Identifier(sweeper))
    )


def apply_roles(dsn: str, prefix: str = DEFAULT_PREFIX) -> RolesReport:
    """Create the missing component roles and set every role's table privileges to
    :data:`GRANTS` and its function privileges to :data:`FUNCTIONS`, in one transaction, then
    revoke the server's advisory lock functions from PUBLIC (:data:`ADVISORY_LOCKS`).

    Returns:
        The roles created by this call, and what could not be protected (warnings).

    Raises:
        Invalid: a bad prefix.
        RolesError: the connecting role may not create roles or grant on the tables, or a
            table or function of the schema has no entry in :data:`GRANTS` / :data:`FUNCTIONS`.
        psycopg.OperationalError: the database cannot be reached.
    """
    names = {component: role_name(component, prefix) for component in COMPONENTS}
    created: list[str] = []
    with psycopg.connect(dsn, autocommit=True, **write_target(dsn)) as conn:
        present = tables(conn)
        present_functions = functions(conn)
        undecided = sorted(set(present) - set(GRANTS)) + sorted(
            set(present_functions) - set(FUNCTIONS)
        )
        if undecided:
            raise RolesError(f"no grant decision for {', '.join(undecided)}")
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
                for sequence, components in SEQUENCES.items():
                    for component in components:
                        conn.execute(
                            sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
                                sql.Identifier(sequence), sql.Identifier(names[component])
                            )
                        )
                _grant_functions(conn, present_functions, names)
                _scope_worker(conn, names["worker"])
                _narrow_sweeper(conn, names["sweeper"])
                warnings = _revoke_advisory_locks(conn, names)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise RolesError(
                f"not allowed to create roles or grant on the tables ({exc.diag.message_primary});"
                " run it as the tables' owner with CREATEROLE"
            ) from None
    return RolesReport(created=created, warnings=warnings)
