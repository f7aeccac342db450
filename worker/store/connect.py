"""Connections and pools: how every process talks to Postgres.

* ``connect_worker``: the one dedicated connection a worker uses for everything (its lease,
  LISTEN on a direct connection, the head query, its updates and its depth gauge).
* :class:`Pools`: two pools for ingest, the CLI and the operator: one for writes, and one
  read-only with a short statement timeout for listings and dashboards, so that a slow page
  never holds up a delivery.

**No session state a pooler can leak or lose.** A connection pooler in front of Postgres
(PgBouncer, CloudNativePG's ``Pooler``) refuses the startup parameter ``options`` by default, and
in transaction mode it hands each transaction to any server connection: a session ``SET`` then
leaks into other clients, and a session lock or LISTEN belongs to whichever backend it picked.
So no session sends startup ``options`` (a DSN's own are passed as given); what a statement
needs is set per transaction: synchronous commit by the statements that must be durable
(``set_config(..., true)`` or ``SET LOCAL``), read-only and the statement timeout by the read
pool's ``BEGIN READ ONLY`` and ``SET LOCAL``. :func:`detect_pooling` finds a pooler that moves
sessions (two statements of one session on different backends, ``pg_backend_pid()``), says so
in one line and names what is then not used; on such a DSN psycopg never prepares statements
(``prepare_threshold=None``), and on a direct one each session also sets the server-side
keepalives below with a session ``SET`` right after connecting (harmless there).

The DSN comes from ``--dsn`` or ``INTURN_DSN`` (libpq connection string or URI) or, when
neither is given, from the embedded Postgres that ``inturn local`` runs under ``./.inturn``:
:mod:`inturn.worker.store.dsn` resolves it (and words its errors).

**A session that loses its peer ends within a bound.** Every direct session (the worker's and
both pools') sets TCP keepalives and a TCP user timeout on both ends: on the server, per session
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

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from inturn.worker.store.queries import fetch_one, load

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

Q = load("session.sql")
log = logging.getLogger("inturn.store")

#: The server-side settings a direct session sets after connecting (never as startup options).
SESSION_SETTINGS = {
    "synchronous_commit": "on",
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE_SECONDS),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_SECONDS),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}
#: Seconds the pooling probe waits for its second statement while another session holds a
#: transaction (a pooler whose server connections are all held makes it wait: that is pooling
#: too). A pooler with one server connection is known without waiting (the two sessions share
#: it); the bound is long because a direct server under load may take seconds to answer, and a
#: direct connection read as pooled would lose LISTEN and prepared statements for the process's
#: life.
POOLING_PROBE_SECONDS = 15.0


@dataclass(frozen=True)
class Pooling:
    """What :func:`detect_pooling` found about a DSN.

    Attributes:
        pooled: two statements of one session ran on different backends (or the second waited
            for another session's transaction): a transaction- or statement-mode pooler.
        note: one line saying so and naming what is then not used, or "" for a direct one.
    """

    pooled: bool
    note: str = ""


#: Detections made by this process, per DSN (a process checks each DSN once), and those under way.
_detected: dict[str, Pooling] = {}
_detecting: dict[str, asyncio.Future[Pooling]] = {}


def session_kwargs(
    dsn: str, *, writes: bool, pooled: bool = False, options: str = ""
) -> dict[str, Any]:
    """Keyword arguments for a session on ``dsn``: libpq's client-side keepalives, user timeout
    and connect timeout (unless the DSN sets them), no startup ``options`` of our own (the DSN's
    own, and ``options``, are passed as given: a stock PgBouncer refuses them), psycopg's
    ``prepare_threshold=None`` when ``pooled`` (no server-side prepared statements, which a
    transaction-mode pooler would mix up), and for a session that ``writes``, a
    ``target_session_attrs`` that finds the primary (see the module docstring).

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
    own = " ".join(o for o in (options, str(params.get("options") or "")) if o)
    if own:
        kwargs["options"] = own
    if pooled:
        kwargs["prepare_threshold"] = None
    if writes:
        kwargs.update(write_target(dsn))
    return kwargs


async def set_session(conn: AsyncConnection[Any]) -> None:
    """Set :data:`SESSION_SETTINGS` on a direct session with one statement (never on a pooled
    one: it would leak into other clients); a setting the DSN's own ``options`` give is kept."""
    own = str(conn.info.get_parameters().get("options") or "")
    given = set(re.findall(r"(?:-c\s*|--)([a-z_]+)\s*=", own))
    params = {name: None if name in given else value for name, value in SESSION_SETTINGS.items()}
    await conn.execute(Q["session_settings"], params)


async def detect_pooling(dsn: str) -> Pooling:
    """Whether ``dsn`` reaches Postgres through a pooler that moves sessions between backends,
    found once per process and DSN, and said once in the log (one line, naming what is not
    used then).

    Two sessions: the first runs ``pg_backend_pid()``; the second opens a transaction, which
    holds a server connection; the first asks again. On a direct connection (or a session-mode
    pooler, which keeps a session on one backend) the answer is the same backend; a
    transaction-mode pooler gives another one, or makes the statement wait for the held one.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    known = _detected.get(dsn)
    if known is not None:
        return known
    running = _detecting.get(dsn)
    if running is None or running.get_loop() is not asyncio.get_running_loop():
        # one probe per DSN however many callers start at once (200 workers of one process)
        running = _detecting[dsn] = asyncio.ensure_future(_detect(dsn))
    try:
        return await asyncio.shield(running)
    finally:
        if running.done():
            _detecting.pop(dsn, None)


async def _detect(dsn: str) -> Pooling:
    kwargs = session_kwargs(dsn, writes=False, pooled=True)
    first = await AsyncConnection.connect(dsn, autocommit=True, **kwargs)
    try:
        second = await AsyncConnection.connect(dsn, **kwargs)
        try:
            server = await fetch_one(first, Q["server_settings"], row=dict_row)
            before = await _backend(first)
            held = await _backend(second)  # its transaction now holds a server connection
            if held == before:  # two sessions on one backend: only a pooler does that
                after = -1
            else:
                try:
                    after = await asyncio.wait_for(_backend(first), POOLING_PROBE_SECONDS)
                except TimeoutError:
                    after = -1  # it waited for a held server connection: pooled
        finally:
            await second.close()
    finally:
        await first.close()
    pooled = after != before
    result = Pooling(pooled, _pooled_note(dsn, server) if pooled else "")
    _detected[dsn] = result
    if pooled:
        log.log(_POOLING_LEVEL, "%s", result.note)
    return result


#: The level the pooling line is logged at: DEBUG for a command that runs and ends (`inturn
#: queue ...`, for which being pooled changes nothing it does), WARNING for a long-running
#: process (:func:`announce_pooling`), whose ``/readyz`` also says it.
_POOLING_LEVEL = logging.DEBUG


def announce_pooling() -> None:
    """Log the pooling line (:func:`detect_pooling`) at WARNING in this process: called by the
    long-running processes (ingest, a worker, ``inturn local``, the console), for which it says
    what works differently; a one-shot command keeps it at DEBUG."""
    global _POOLING_LEVEL
    _POOLING_LEVEL = logging.WARNING


def pooling_notes(dsns: Iterable[str]) -> list[str]:
    """The lines :func:`detect_pooling` said in this process for those of ``dsns`` it found
    pooled, sorted (for ``/readyz``). Only the caller's own DSNs: a process that has probed
    others (a test process, a tool serving several databases) must not say another database's
    pooling is its own."""
    return sorted({found.note for dsn in dsns if (found := _detected.get(dsn)) and found.note})


async def _backend(conn: AsyncConnection[Any]) -> int:
    row = await fetch_one(conn, Q["backend_pid"], row=dict_row)
    assert row is not None
    return int(row["pid"])


def _pooled_note(dsn: str, server: dict[str, Any] | None) -> str:
    """The one line a pooled process says: what it does instead, and what is lost."""
    lost = ["server-side TCP keepalives (tcp_keepalives_*, tcp_user_timeout: the pooler's own)"]
    if str(conninfo_to_dict(dsn).get("options") or ""):
        lost.append("the DSN's options= (a transaction pooler applies them to no later backend)")
    if server is not None and str(server.get("synchronous_commit")) not in ("on", "remote_apply"):
        lost.append(
            f"synchronous_commit={server.get('synchronous_commit')} on the server for other"
            " statements (inturn's durable writes set it per transaction)"
        )
    return (
        "pooled connection: statements of one session run on different backends (a"
        " transaction-mode pooler); settings are set per transaction, prepared statements are"
        " off, LISTEN needs a direct --listen-dsn (else the worker polls); not used: "
        + "; ".join(lost)
    )


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


async def probe(dsn: str, timeout_seconds: int = 5) -> None:
    """Connect once and close: fails fast with the server's own words, where a pool would
    retry (and log) for its whole timeout.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    conn = await AsyncConnection.connect(dsn, connect_timeout=timeout_seconds)
    await conn.close()


async def connect_worker(
    dsn: str, application_name: str = "inturn-worker", *, pooled: bool | None = None
) -> AsyncConnection[Any]:
    """Open one autocommit connection to the primary with the client-side session-loss
    settings of :func:`session_kwargs`; on a direct DSN, synchronous commit on and the
    server-side ones too (:func:`set_session`).

    Cut off from its peer, a direct session ends on both sides within
    :data:`SESSION_LOSS_BOUND_SECONDS`: the server frees the worker's advisory lock, and the
    worker sees its connection fail instead of waiting on it.

    Args:
        pooled: whether ``dsn`` goes through a pooler that moves sessions; None:
            :func:`detect_pooling` says.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    if pooled is None:
        pooled = (await detect_pooling(dsn)).pooled
    conn = await AsyncConnection.connect(
        dsn,
        autocommit=True,
        application_name=application_name,
        **session_kwargs(dsn, writes=True, pooled=pooled),
    )
    if not pooled:
        try:
            await set_session(conn)
        except BaseException:
            await conn.close()
            raise
    return conn


@dataclass(frozen=True)
class Pools:
    """The write pool and the read-only pool: where ingest, the CLI and the operator take a
    connection from, and hand it to a store function (:mod:`inturn.worker.store.actions`, ...)::

        async with await Pools.open(dsn) as pools:
            async with pools.write.connection() as conn:
                await actions.skip(conn, item_id, who="cli")

    Both pools hold autocommit connections with the session-loss settings of
    :func:`session_kwargs` (and, on a direct DSN, :func:`set_session`); the write pool's reach
    the primary. Each use of a read pool's connection is one transaction, ``BEGIN READ ONLY``
    with a statement timeout of :data:`READ_STATEMENT_TIMEOUT_MS` (``SET LOCAL``), for
    listings and dashboards: no session state, so nothing leaks through a pooler.
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
        check: bool = True,
    ) -> Pools:
        """Open both pools against ``dsn`` and wait until each has a connection.

        With ``check`` (the console's and people's commands' pools) every connection is checked
        before it is handed out (psycopg_pool's ``check_connection``: an empty statement, one
        round trip): one that died with the server (a restart, ``pg_terminate_backend``) is
        replaced, never handed to a person's action. Ingest, which stores again on a fresh
        connection when one is found gone, passes False and saves the round trip per message.

        Raises:
            psycopg_pool.PoolTimeout: the database could not be reached within 10 seconds.
        """
        pooled = (await detect_pooling(dsn)).pooled
        write = _pool(dsn, "inturn-write", write_size, application_name, True, pooled, check)
        read = _pool(dsn, "inturn-read", read_size, application_name, False, pooled, check)
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


def begin_read() -> sql.Composed:
    """The statement that opens a read pool's transaction: ``BEGIN READ ONLY`` and its
    statement timeout (a utility statement with a constant, composed here, not a named query:
    there is nothing in it to plan)."""
    return sql.SQL("BEGIN READ ONLY; SET LOCAL statement_timeout = {}").format(
        sql.Literal(READ_STATEMENT_TIMEOUT_MS)
    )


def _pool(
    dsn: str,
    name: str,
    size: int,
    application_name: str,
    writes: bool,
    pooled: bool,
    check: bool = True,
) -> AsyncConnectionPool:
    from inturn.worker.store.pool import Pool

    kwargs = {
        "application_name": application_name,
        "autocommit": True,
        **session_kwargs(dsn, writes=writes, pooled=pooled),
    }
    return Pool(
        dsn,
        min_size=1,
        max_size=size,
        kwargs=kwargs,
        configure=None if pooled else set_session,
        open=False,
        name=name,
        read_only=not writes,
        check=Pool.check_connection if check else None,
    )
