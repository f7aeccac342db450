"""How many connections a Postgres server lets a non-superuser open, and the one name for its
refusal of one more (SQLSTATE 53300, "too many clients").

PostgreSQL's ``max_connections`` counts every client backend; ``superuser_reserved_connections``
(default 3) and, from PostgreSQL 16, ``reserved_connections`` (for ``pg_use_reserved_connections``)
of them are kept for superusers and that role: a non-superuser gets ``max_connections`` minus
both. A server out of slots answers a new connection with ``FATAL: sorry, too many clients
already`` (or ``remaining connection slots are reserved ...``), SQLSTATE 53300. The server is up
and answering: that is "full", never "unreachable", and the cure is a setting, not a wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.sql

#: SQLSTATE of "too many connections" (PostgreSQL manual, Appendix A, class 53).
TOO_MANY_CONNECTIONS = "53300"
#: The server's texts for it, for connection failures that carry no SQLSTATE (libpq reports a
#: refused startup as text: psycopg's ``OperationalError`` then has ``sqlstate`` None).
TOO_MANY_TEXTS = ("too many clients already", "remaining connection slots are reserved")

#: max_connections of each server this process measured, by DSN (filled by :func:`limits`), so
#: that a refusal can name the number.
KNOWN: dict[str, int] = {}


@dataclass(frozen=True)
class Limits:
    """A server's connection limits.

    Attributes:
        max_connections: the ``max_connections`` setting.
        reserved: slots kept from non-superusers (``superuser_reserved_connections`` plus
            ``reserved_connections`` where the server has it).
        in_use: client backends connected when measured (this one included).
    """

    max_connections: int
    reserved: int
    in_use: int

    @property
    def usable(self) -> int:
        """Connections a non-superuser may open at once (``max_connections - reserved``)."""
        return self.max_connections - self.reserved


async def limits(conn: psycopg.AsyncConnection[Any], dsn: str | None = None) -> Limits:
    """Read the limits of the server ``conn`` is connected to (and remember its
    ``max_connections`` under ``dsn`` in :data:`KNOWN`).

    Raises:
        psycopg.Error: the statement failed.
    """
    cur = await conn.execute(
        "SELECT current_setting('max_connections')::int,"
        " current_setting('superuser_reserved_connections')::int"
        " + coalesce(current_setting('reserved_connections', true)::int, 0),"
        " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int"
    )
    row = await cur.fetchone()
    assert row is not None
    found = Limits(int(row[0]), int(row[1]), int(row[2]))
    if dsn is not None:
        KNOWN[dsn] = found.max_connections
    return found


def raise_max_connections(dsn: str, wanted: int) -> int:
    """On a server this process may reconfigure (the embedded one, as its superuser): its
    ``max_connections``, and when that is below ``wanted``, ``ALTER SYSTEM SET max_connections``
    to it (taken at the next server start: the caller restarts it). Blocking.

    Raises:
        psycopg.Error: the server could not be reached, or refused the change.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
        before = int(row[0]) if row else 0
        if before < wanted:
            conn.execute(
                psycopg.sql.SQL("ALTER SYSTEM SET max_connections = {}").format(
                    psycopg.sql.Literal(int(wanted))
                )
            )
    return before


def too_many(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing one more connection (SQLSTATE 53300, or its text
    in a connection failure without a SQLSTATE)."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate == TOO_MANY_CONNECTIONS:
        return True
    text = str(exc)
    return any(t in text for t in TOO_MANY_TEXTS)


def refused_text(dsn: str | None = None) -> str:
    """The one-line name of a 53300 refusal: the database is up and full, with its
    ``max_connections`` when this process measured it."""
    known = KNOWN.get(dsn) if dsn is not None else None
    if known is None and len(set(KNOWN.values())) == 1:  # the one server this process measured
        known = next(iter(KNOWN.values()))
    limit = f"max_connections {known}" if known is not None else "its max_connections"
    return (
        f"the database refuses more connections (too many clients, SQLSTATE 53300: {limit} reached)"
    )
