"""Connections and pools: how every process talks to Postgres.

* ``connect_worker``: the one dedicated connection a worker uses for everything (its advisory
  lock, LISTEN, the head query, its updates and its depth gauge).
* :class:`Pools`: two pools for ingest, the CLI and the operator: one for writes, and one
  read-only with a short statement timeout for listings and dashboards, so that a slow page
  never holds up a delivery.

The DSN comes from ``--dsn`` or ``INTURN_DSN`` (libpq connection string or URI) or, when
neither is given, from the embedded Postgres that ``inturn local`` runs under ``./.inturn``.

**A session that loses its peer ends within a bound.** Every session (the worker's and both
pools') sets TCP keepalives and a TCP user timeout on both ends: on the server, per session
(``tcp_keepalives_idle``, ``tcp_keepalives_interval``, ``tcp_keepalives_count``,
``tcp_user_timeout``; PostgreSQL manual, "Connections and Authentication"), so that Postgres
ends the session of a worker cut off by a network partition (and so frees its advisory lock)
within :data:`SESSION_LOSS_BOUND_SECONDS`, rather than after its retransmissions give up (about
15 minutes) or the kernel's keepalive default (2 hours); and in libpq (``keepalives*``,
``tcp_user_timeout``, ``connect_timeout``; libpq "Parameter Key Words"), so that the worker
notices within the same bound and never waits on a dead socket. Values the DSN gives win.

**Multi-host DSNs** (``host=a,b``, libpq failover) work with every ``target_session_attrs``:
the read pool takes the DSN's value (``prefer-standby`` sends listings to a standby); whatever
writes (the worker's session, the write pool, migrations) asks for ``read-write`` when the DSN
says ``read-only``, ``standby`` or ``prefer-standby``, or names several hosts with ``any``, so a
failover finds the new primary. The read pool's sessions are made read-only after they connect,
never by a startup option, which would make every server, the primary too, look read-only to
``target_session_attrs=read-write``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from inturn.worker.errors import Invalid

if TYPE_CHECKING:  # imported where a pool is made: a worker (one connection) never loads it
    from psycopg_pool import AsyncConnectionPool

#: Statement timeout (milliseconds) of the read-only pool.
READ_STATEMENT_TIMEOUT_MS = 5000

#: Seconds of silence before the first keepalive probe, then between probes, and the probes
#: unanswered before the peer is declared gone (server side per session, and in libpq).
KEEPALIVE_IDLE_SECONDS = 10
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
#: Milliseconds sent data may stay unacknowledged (and keepalives unanswered) before the
#: connection is dropped (Linux ``TCP_USER_TIMEOUT``, RFC 5482), on both ends.
TCP_USER_TIMEOUT_MS = 20_000
#: Seconds libpq waits for a connection to one host (a partitioned host never refuses).
CONNECT_TIMEOUT_SECONDS = 10
#: The bound, in seconds, within which either end ends a session whose peer stopped answering:
#: the first probe after :data:`KEEPALIVE_IDLE_SECONDS` of silence, the connection dropped once
#: nothing was acknowledged for :data:`TCP_USER_TIMEOUT_MS` (on a busy connection, the user
#: timeout alone), rounded up to the next probe.
SESSION_LOSS_BOUND_SECONDS = (
    KEEPALIVE_IDLE_SECONDS + TCP_USER_TIMEOUT_MS // 1000 + KEEPALIVE_INTERVAL_SECONDS
)
#: ``target_session_attrs`` values under which a writer would not find the primary.
_NOT_FOR_WRITING = frozenset({"read-only", "standby", "prefer-standby"})


def session_options(extra: str = "") -> str:
    """The ``options`` every session starts with: ``synchronous_commit`` on and the server-side
    keepalive and user-timeout settings (see the module docstring), then ``extra``."""
    return (
        "-c synchronous_commit=on"
        f" -c tcp_keepalives_idle={KEEPALIVE_IDLE_SECONDS}"
        f" -c tcp_keepalives_interval={KEEPALIVE_INTERVAL_SECONDS}"
        f" -c tcp_keepalives_count={KEEPALIVE_COUNT}"
        f" -c tcp_user_timeout={TCP_USER_TIMEOUT_MS}" + extra
    )


def session_kwargs(dsn: str, *, writes: bool, options: str = "") -> dict[str, Any]:
    """libpq keyword arguments for a session on ``dsn``: the client-side keepalives, user
    timeout and connect timeout (unless the DSN sets them), ``options`` from
    :func:`session_options` followed by ``options`` and the DSN's own (later ``-c`` win), and
    for a session that ``writes``, a ``target_session_attrs`` that finds the primary (see the
    module docstring).

    Raises:
        psycopg.ProgrammingError: ``dsn`` cannot be parsed.
    """
    params = conninfo_to_dict(dsn)
    kwargs: dict[str, Any] = {
        key: value
        for key, value in (
            ("keepalives", 1),
            ("keepalives_idle", KEEPALIVE_IDLE_SECONDS),
            ("keepalives_interval", KEEPALIVE_INTERVAL_SECONDS),
            ("keepalives_count", KEEPALIVE_COUNT),
            ("tcp_user_timeout", TCP_USER_TIMEOUT_MS),
            ("connect_timeout", CONNECT_TIMEOUT_SECONDS),
        )
        if key not in params
    }
    own = str(params.get("options") or "")
    kwargs["options"] = session_options(options) + (f" {own}" if own else "")
    if writes:
        kwargs.update(write_target(dsn))
    return kwargs


def write_target(dsn: str) -> dict[str, Any]:
    """``{"target_session_attrs": "read-write"}`` when a session that writes on ``dsn`` could
    otherwise land on a standby (the DSN asks for one, or names several hosts and accepts
    ``any``); ``{}`` when the DSN's own value finds the primary.

    Raises:
        psycopg.ProgrammingError: ``dsn`` cannot be parsed.
    """
    params = conninfo_to_dict(dsn)
    attrs = str(params.get("target_session_attrs") or "any")
    hosts = str(params.get("host") or params.get("hostaddr") or "")
    if attrs in _NOT_FOR_WRITING or (attrs == "any" and "," in hosts):
        return {"target_session_attrs": "read-write"}
    return {}


class DsnError(Invalid):
    """The database connection string is absent or unusable (the message says why, in one line,
    and never repeats the string, which may hold a password)."""


class DsnMissing(DsnError):
    """Neither ``--dsn``, ``INTURN_DSN`` nor a running ``./.inturn`` says where the database is."""


#: Where ``inturn local`` keeps its embedded Postgres by default (relative to the working folder).
LOCAL_DATA_DIR = Path(".inturn")

#: Set to ``off`` (or ``0``, ``no``, ``false``), commands never look for ``./.inturn``: only
#: ``--dsn`` or ``INTURN_DSN`` name a database. The test suite sets it, so that a tutorial's
#: ``inturn local`` running in the same folder is never found by a test.
LOCAL_DISCOVERY_ENV = "INTURN_LOCAL_DISCOVERY"


def local_discovery() -> bool:
    """Whether :func:`resolve_dsn` may fall back to a running ``./.inturn`` (see
    :data:`LOCAL_DISCOVERY_ENV`); on unless that variable says off."""
    value = os.environ.get(LOCAL_DISCOVERY_ENV, "").strip().lower()
    return value not in ("off", "0", "no", "false")


def schema_missing(exc: BaseException) -> str:
    """The one-line error for a query that found no inturn table or column: the database was
    never migrated, or by an older inturn."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"the database has no inturn schema, or an old one ({detail}): run `inturn migrate`"


#: The role of the DSN :func:`resolve_dsn` resolved last in this process (for error messages).
_last_role: list[str] = []


def dsn_role(dsn: str) -> str:
    """The role a connection to ``dsn`` logs in as: its ``user``, else ``$PGUSER``, else the
    operating system user (libpq's own defaults, "Connection Strings" in the PostgreSQL manual).
    """
    try:
        user = conninfo_to_dict(dsn).get("user")
    except psycopg.ProgrammingError:
        user = None
    if user:
        return str(user)
    if os.environ.get("PGUSER"):
        return os.environ["PGUSER"]
    import getpass

    return getpass.getuser()


def permission_denied(exc: BaseException) -> str:
    """The one-line error for a statement the connected role may not run: the server's words
    (``permission denied for table inturn_delivery``), the role that lacks the privilege and
    where the roles' privileges are described."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    who = f"role {_last_role[-1]}" if _last_role else "the connected role"
    return (
        f"{detail}: {who} lacks a privilege this command needs; run it with the DSN of a role"
        " that has it (see docs/explanation/security.md)"
    )


def local_dsn(data_dir: Path = LOCAL_DATA_DIR) -> str | None:
    """The DSN of the embedded Postgres of ``data_dir`` if it is running, else None.

    Reads ``<data_dir>/pg/postmaster.pid`` (PostgreSQL's own record: line 1 the pid, line 4 the
    port, line 5 the socket directory; "Database File Layout" in the PostgreSQL manual) and
    checks that the pid is alive.
    """
    try:
        lines = (data_dir / "pg" / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, someone else's
    return make_conninfo(
        host=socket_dir or str((data_dir / "pg").resolve()),
        port=port,
        user="postgres",
        dbname="postgres",
    )


def normalize_dsn(dsn: str) -> str:
    """Check ``dsn`` and make relative socket folders absolute (``?host=.inturn/pg`` works).

    libpq takes a host with a ``/`` for a socket folder only when it is absolute; a relative one
    would be looked up as a host name.

    Raises:
        DsnError: the string cannot be parsed, or a host is not a valid name or address.
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        first = (str(exc).strip().splitlines() or ["malformed"])[0]
        first = first.split(' in URI: "')[0].replace(dsn, "the string")  # it may hold a password
        raise DsnError(f"invalid database connection string: {first}") from None
    hosts = str(params.get("host") or "")
    if not hosts:
        return dsn
    fixed = []
    for host in hosts.split(","):
        if "/" in host or host.startswith("."):
            fixed.append(host if os.path.isabs(host) else os.path.abspath(host))
            continue
        try:
            host.encode("idna")
        except UnicodeError:
            raise DsnError(f"invalid database host {host!r} in the connection string") from None
        fixed.append(host)
    if fixed == hosts.split(","):
        return dsn
    params["host"] = ",".join(fixed)
    return make_conninfo("", **params)


def resolve_dsn(dsn: str | None) -> str:
    """Return ``dsn``, ``$INTURN_DSN`` or the running embedded Postgres of ``./.inturn`` (unless
    :func:`local_discovery` is off), checked and normalized by :func:`normalize_dsn`.

    Raises:
        DsnMissing: none of them is there.
        DsnError: the one given is unusable.
    """
    discover = local_discovery()
    value = dsn or os.environ.get("INTURN_DSN") or (local_dsn() if discover else None)
    if not value:
        hint = ""
        if discover and (LOCAL_DATA_DIR / "pg").is_dir():
            hint = " (./.inturn holds an embedded Postgres that is not running: start inturn local)"
        raise DsnMissing(f"no database: pass --dsn or set INTURN_DSN{hint}")
    normalized = normalize_dsn(value)
    _last_role[:] = [dsn_role(normalized)]
    return normalized


async def probe(dsn: str, timeout_seconds: int = 5) -> None:
    """Connect once and close: fails fast with the server's own words, where a pool would
    retry (and log) for its whole timeout.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    conn = await AsyncConnection.connect(dsn, connect_timeout=timeout_seconds)
    await conn.close()


async def connect_worker(dsn: str, application_name: str = "inturn-worker") -> AsyncConnection[Any]:
    """Open one autocommit connection to the primary, with synchronous commit on and the
    session-loss settings of :func:`session_kwargs`.

    Cut off from its peer, the session ends on both sides within
    :data:`SESSION_LOSS_BOUND_SECONDS`: the server frees the worker's advisory lock for a
    replacement, and the worker sees its connection fail instead of waiting on it.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    return await AsyncConnection.connect(
        dsn,
        autocommit=True,
        application_name=application_name,
        **session_kwargs(dsn, writes=True),
    )


@dataclass(frozen=True)
class Pools:
    """The write pool and the read-only pool: where ingest, the CLI and the operator take a
    connection from, and hand it to a store function (:mod:`inturn.worker.store.actions`, ...)::

        async with await Pools.open(dsn) as pools:
            async with pools.write.connection() as conn:
                await actions.skip(conn, item_id, who="cli")

    Both pools hold autocommit connections with ``synchronous_commit`` on and the session-loss
    settings of :func:`session_kwargs`; the write pool's reach the primary; the read pool's
    are made read-only once connected (``SET default_transaction_read_only``, not a startup
    option: see the module docstring) with a statement timeout of
    :data:`READ_STATEMENT_TIMEOUT_MS`, for listings and dashboards.
    """

    write: AsyncConnectionPool
    read: AsyncConnectionPool

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        write_size: int = 4,
        read_size: int = 2,
        application_name: str = "inturn",
    ) -> Pools:
        """Open both pools against ``dsn`` and wait until each has a connection.

        Raises:
            psycopg_pool.PoolTimeout: the database could not be reached within 10 seconds.
        """
        write = _pool(dsn, "inturn-write", write_size, application_name, writes=True)
        read = _pool(dsn, "inturn-read", read_size, application_name, writes=False)
        await write.open(wait=True, timeout=10)
        try:
            await read.open(wait=True, timeout=10)
        except BaseException:
            await write.close()
            raise
        return cls(write, read)

    async def close(self) -> None:
        """Close both pools."""
        await self.write.close()
        await self.read.close()

    async def __aenter__(self) -> Pools:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def _read_only(conn: AsyncConnection[Any]) -> None:
    """Make a read pool's new session read-only (after connecting: see the module docstring)."""
    await conn.execute("SET default_transaction_read_only = on")


def _pool(
    dsn: str, name: str, size: int, application_name: str, *, writes: bool
) -> AsyncConnectionPool:
    from inturn.worker.store.pool import Pool

    extra = "" if writes else f" -c statement_timeout={READ_STATEMENT_TIMEOUT_MS}"
    kwargs = {
        "application_name": application_name,
        "autocommit": True,
        **session_kwargs(dsn, writes=writes, options=extra),
    }
    return Pool(
        dsn,
        min_size=1,
        max_size=size,
        kwargs=kwargs,
        configure=None if writes else _read_only,
        open=False,
        name=name,
    )
