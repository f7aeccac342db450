"""Where the database is, and what a command says when it cannot use it: the DSN from
``--dsn``, ``INTURN_DSN`` or the embedded Postgres that ``inturn local`` runs under ``./.inturn``
(:func:`resolve_dsn`, checked and made usable by :func:`normalize_dsn`), and the one-line
errors of a DSN that is missing or unusable, of a database without the schema and of a role
without a privilege.

The command line and the front ends call it before any connection is opened; how a session is
then set up is :mod:`inturn.worker.store.connect`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from inturn.worker.errors import Invalid


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


def local_runner_pid(data_dir: Path = LOCAL_DATA_DIR) -> int | None:
    """The pid of the ``inturn local`` running on ``data_dir`` (it holds the ``flock`` of
    ``<data_dir>/inturn-local.lock``, :class:`inturn.worker.local.embedded.DataDirLock`), or
    None when none does. Takes and drops the lock to find out; never creates the file."""
    import fcntl

    try:
        fd = os.open(data_dir / "inturn-local.lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


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
            runner = local_runner_pid()
            if runner is None:
                hint = (
                    " (./.inturn holds an embedded Postgres that is not running:"
                    " start inturn local)"
                )
            else:
                hint = (
                    f" (inturn local, pid {runner}, runs on ./.inturn but its embedded Postgres"
                    " is down: it restarts it, or exits if it cannot; see its log)"
                )
        raise DsnMissing(f"no database: pass --dsn or set INTURN_DSN{hint}")
    normalized = normalize_dsn(value)
    _last_role[:] = [dsn_role(normalized)]
    return normalized


#: A destination's own worker login (docs/explanation/security.md, "One login per destination"):
#: the operator gives a worker its role name and password in these, from the Destination's
#: Secret, and they replace the user and password of the shared DSN (``INTURN_DSN``).
LOGIN_USER_ENV = "INTURN_DB_USER"
LOGIN_PASSWORD_ENV = "INTURN_DB_PASSWORD"


def apply_login(dsn: str, environ: Mapping[str, str] | None = None) -> str:
    """``dsn`` with its ``user`` (and ``password``) replaced by ``$INTURN_DB_USER`` (and
    ``$INTURN_DB_PASSWORD``) when set; ``dsn`` unchanged otherwise.

    Raises:
        DsnError: a password without a user.
    """
    env = os.environ if environ is None else environ
    user = env.get(LOGIN_USER_ENV, "").strip()
    password = env.get(LOGIN_PASSWORD_ENV, "")
    if not user:
        if password:
            raise DsnError(f"{LOGIN_PASSWORD_ENV} is set without {LOGIN_USER_ENV}")
        return dsn
    changes = {"user": user}
    if password:
        changes["password"] = password
    return make_conninfo(dsn, **changes)
