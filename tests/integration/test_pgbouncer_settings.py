"""No session state left behind on a transaction-mode PgBouncer (issue 29, trial 6): after
ingest, ``inturn local`` (migrating an empty database through the pooler, its workers, sweeper
and console), a standalone ``inturn worker``, ``inturn sweep``, ``inturn purge`` and the read
commands ran through one transaction-mode PgBouncer (its defaults but the pool mode), a fresh
client on every server connection of the pool sees the server's stock settings: not read-only,
no statement timeout, the server's synchronous_commit, no setting of a session's own beyond the
parameters PgBouncer itself tracks, and no advisory lock left held."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import pgbouncer
from tests.support.local import (
    INTURN,
    LocalProcess,
    free_port,
    manifest,
    message,
    mllp_sender,
    send,
    worker_process,
)

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.skipif(bool(pgbouncer.missing()), reason=str(pgbouncer.missing())),
    pytest.mark.slow,
]

#: PgBouncer's default_pool_size: a client on each of this many server connections at once
#: reads every server connection the pool has.
POOL_SIZE = 20
#: The settings a leaked session SET or set_config(..., false) would change.
WATCHED = (
    "default_transaction_read_only",
    "statement_timeout",
    "synchronous_commit",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
    "search_path",
)
#: What PgBouncer itself sets on a server connection for each client (its tracked parameters).
TRACKED = {"application_name", "client_encoding", "datestyle", "timezone",
           "standard_conforming_strings", "intervalstyle"}  # fmt: skip

QUICK_LEASE = {
    "INTURN_LEASE_TTL_SECONDS": "6",
    "INTURN_LEASE_RENEW_SECONDS": "1",
    "INTURN_LEASE_ACQUIRE_SECONDS": "0.5",
    "INTURN_POLL_SECONDS": "0.2",
}

SETTINGS = (
    "SELECT name, setting, source FROM pg_settings WHERE name = ANY(%s) OR source = 'session'"
)


async def _settings(conn: AsyncConnection[Any]) -> dict[str, tuple[str, str]]:
    cur = await conn.execute(SETTINGS, (list(WATCHED),))
    return {str(r[0]): (str(r[1]), str(r[2])) for r in await cur.fetchall()}


async def _delivered(dsn: str) -> int:
    async with await AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None) as c:
        cur = await c.execute("SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'")
        row = await cur.fetchone()
    return int(row[0]) if row else -1


async def _until_delivered(dsn: str, n: int) -> None:
    async with asyncio.timeout(90):
        while await _delivered(dsn) < n:
            await asyncio.sleep(0.1)


async def test_every_process_leaves_the_pooled_server_connections_stock(
    dsn: str, empty_db: str, tmp_path: Path
) -> None:
    with pgbouncer.Bouncer(dsn, "transaction") as bouncer:
        pooled = bouncer.dsn(empty_db)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("INTURN_")}}
        env.update(QUICK_LEASE, INTURN_DSN=pooled)
        listen, console = free_port(), free_port()
        async with MllpReceiver() as rx:
            path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
            # inturn local through the pooler, INTURN_DSN as the trial had it: migrates the
            # empty database, ingests, delivers, sweeps, serves the console
            local = LocalProcess(
                tmp_path / "local.log",
                ["-f", str(path), "--listen", f"adt={listen}",
                 "--console", f"127.0.0.1:{console}", "--sweep-every", "1s"],
                env={**QUICK_LEASE, "INTURN_DSN": pooled},
            )  # fmt: skip
            try:
                await local.start(listen)
                await local.wait_log("lease held", timeout=60)
                assert await send(listen, [message(n) for n in range(30)]) == ["AA"] * 30
                await _until_delivered(pooled, 30)
                for page in (
                    "overview",
                    "destinations/default/lab/items",
                    "worklists/counts",
                    "audit",
                ):
                    url = f"http://127.0.0.1:{console}/api/v1/{page}"
                    with urllib.request.urlopen(url, timeout=10) as r:
                        assert r.status == 200
                await local.wait_log("sweep", timeout=30)
                assert await local.interrupt() == 0
            finally:
                await local.kill()
            assert "read-only transaction" not in local.log(), local.log()
            assert "Traceback" not in local.log(), local.log()

            # a standalone worker drains what is enqueued meanwhile
            async with await AsyncConnection.connect(
                pooled, autocommit=True, prepare_threshold=None
            ) as c:
                await queue.enqueue(
                    c,
                    [NewItem("default/lab", "adt", f"W{n:05d}", "ADT^A01", message(n, "W"))
                     for n in range(20)],
                )  # fmt: skip
            worker = await worker_process(path, env)
            try:
                await _until_delivered(pooled, 50)
            finally:
                worker.terminate()
                await asyncio.wait_for(worker.wait(), 30)

        # the sweeper, purge and the read commands (the read pool's transactions)
        for args in (["sweep"], ["purge", "--older-than", "1s"], ["queue", "depth"],
                     ["queue", "list"], ["worklist", "list"]):  # fmt: skip
            done = subprocess.run([str(INTURN), *args], env=env, capture_output=True,
                                  text=True, timeout=120)  # fmt: skip
            assert done.returncode == 0, (args, done.stdout, done.stderr)

        # stock: what a direct session of the same database sees
        async with await AsyncConnection.connect(empty_db, autocommit=True) as direct:
            stock = await _settings(direct)
            cur = await direct.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
            )  # this database's: other tests' databases may share the server
            assert await cur.fetchone() == (0,)  # no session lock left on any server connection
        assert stock["default_transaction_read_only"][0] == "off"
        assert stock["statement_timeout"][0] == "0"

        # fresh clients, one on each server connection of the pool at once
        clients = [
            await AsyncConnection.connect(pooled, prepare_threshold=None) for _ in range(POOL_SIZE)
        ]
        try:
            seen = []
            for c in clients:  # each holds its transaction, so the next gets another backend
                seen.append(await _settings(c))
                cur = await c.execute("SELECT pg_backend_pid()")
                row = await cur.fetchone()
                assert row is not None
            pids = set()
            for c in clients:
                cur = await c.execute("SELECT pg_backend_pid()")
                row = await cur.fetchone()
                pids.add(row[0] if row else None)
        finally:
            for c in clients:
                await c.rollback()
                await c.close()
        assert len(pids) == POOL_SIZE  # every server connection was looked at
        for got in seen:
            for name in WATCHED:
                assert got[name][0] == stock[name][0], (name, got[name], stock[name])
            own = {n for n, (_, source) in got.items() if source == "session"} - TRACKED
            assert own == set(), own  # no session setting left by an inturn process


def test_the_code_sets_nothing_per_session(dsn: str) -> None:
    """No ``SET <setting>`` without LOCAL in worker/ and operator/ (SQL files, migrations and
    Python), but a function's own ``SET search_path`` clause and ``ALTER SYSTEM`` (the embedded
    server's max_connections, :mod:`inturn.worker.store.capacity`); the only session-level
    ``set_config(..., false)`` is connect's ``session_settings``, which runs on direct sessions
    only (``connect.set_session``, never on a pooled one)."""
    with psycopg.connect(dsn) as conn:
        gucs = {str(r[0]) for r in conn.execute("SELECT name FROM pg_settings").fetchall()}
    root = Path(__file__).resolve().parents[2]
    statement = re.compile(r"(?i)(\w+)?\s*\bSET\s+(SESSION\s+)?(\w+)\s*(=|\bTO\b)")
    # the word before a function's own SET clause: its attributes, the value of the SET clause
    # before it (``SET search_path = x, pg_temp SET jit = off``), or a number (``ROWS 1``)
    clause = {
        "DEFINER", "INVOKER", "VOLATILE", "STABLE", "IMMUTABLE", "STRICT", "SQL", "PLPGSQL",
        "PG_TEMP",
        "SYSTEM",  # ALTER SYSTEM SET: the embedded server's configuration file, no session's
    }  # fmt: skip
    offenders = []
    for folder in ("worker", "operator"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".py", ".sql"):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                where = f"{path.relative_to(root)}:{number}: {line.strip()}"
                for found in statement.finditer(line):
                    name = found.group(3).lower()
                    if name == "local" or name not in gucs:
                        continue  # SET LOCAL, or an UPDATE's column
                    before = (found.group(1) or "").upper()
                    if before in clause or before.isdigit():
                        # CREATE FUNCTION ... SET search_path: the function's own (after an
                        # attribute, or a number: the value of ROWS or COST)
                        continue
                    offenders.append(where)
            if path.name != "session.sql":
                text = path.read_text(errors="replace")
                for call in _set_config_calls(text):
                    if re.search(r"(?i),\s*false\s*\)$", call):
                        offenders.append(f"{path.relative_to(root)}: {call}")
    assert offenders == []


def _set_config_calls(text: str) -> list[str]:
    """Every ``set_config(...)`` call in ``text``, to its matching parenthesis."""
    calls = []
    for found in re.finditer(r"(?i)set_config\(", text):
        depth, end = 0, found.end() - 1
        for end in range(found.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        calls.append(" ".join(text[found.start() : end + 1].split()))
    return calls


def test_a_session_set_through_the_pooler_would_be_seen(dsn: str, empty_db: str) -> None:
    """The check above sees a leak: a session SET through a transaction-mode PgBouncer stays
    on its server connection for the next client (what the trial found)."""
    with pgbouncer.Bouncer(dsn, "transaction", settings={"default_pool_size": "1"}) as bouncer:
        pooled = bouncer.dsn(empty_db)
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as c:
            c.execute("SET default_transaction_read_only = on")
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as c:
            row = c.execute("SHOW default_transaction_read_only").fetchone()
        assert row == ("on",)
