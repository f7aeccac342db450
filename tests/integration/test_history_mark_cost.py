"""The delivered mark costs the same with a history beside it (issue 37): a real worker drains
the same messages from a database whose history is empty and from one holding thousands of
moved rows, on a server of the test's own with pg_stat_statements, the worker under a login of
its own so that only its statements are counted (those inside functions and triggers too).
Statements per message, the statements themselves and the rows each writes are the same; none
of them reads or writes history."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo

from inturn.worker.store import history, queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import pgcluster
from tests.support.channel_log import never_stop
from tests.support.db import database
from tests.support.pipeline import register, until, worker, worker_config

#: slow (left out by make test-fast): a long run of whole parts
pytestmark = [
    pytest.mark.store,
    pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing())),
    pytest.mark.slow,
]

DEST = "ward/cost"
CHANNEL = "adt"
MESSAGES = 120
HISTORY_ROWS = 20_000
COUNTED = "inturn_counted"


@dataclass(frozen=True)
class Counted:
    """One statement the worker ran during a drain: its normalized text, calls, rows."""

    query: str
    calls: int
    rows: int


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A server of our own with pg_stat_statements loaded and a login for the worker."""
    cluster = pgcluster.Cluster()
    try:
        cluster.sql(
            cluster.primary, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
        )
        cluster.primary.stop()
        cluster.primary.start()
        # every statement, those inside functions and triggers too
        cluster.sql(cluster.primary, "ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        cluster.sql(cluster.primary, "SELECT pg_reload_conf()")
        dsn = cluster.primary.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute(f"CREATE ROLE {COUNTED} LOGIN SUPERUSER")
            assert conn.execute("SHOW pg_stat_statements.track").fetchone() == ("all",)
        yield dsn
    finally:
        cluster.close()


def adt(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261205080000||ADT^A08|COST{n:05d}|P|2.5\r"
        f"PID|1||C{n % 7}^^^HOSP^MR||COST^CARL\r"
    ).encode()


async def fill_history(dsn: str) -> int:
    """HISTORY_ROWS delivered rows, a day old, moved to history by the maintenance's move."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, attempts, finished_at, enqueued_at)"
            " SELECT %s, %s, 'OLD' || g, 'ADT^A08', convert_to(repeat('x', 500), 'UTF8'),"
            " 500, 'delivered', 1, now() - interval '1 day', now() - interval '1 day'"
            " FROM generate_series(1, %s) AS g",
            (DEST, CHANNEL, HISTORY_ROWS),
        )
    settings = history.Settings(retention_seconds=86400 * 30, hot_seconds=900)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await history.move(conn, settings, never_stop)


async def drain(server_dsn: str, db_dsn: str) -> list[Counted]:
    """Enqueue MESSAGES, reset the counters, let a worker logged in as COUNTED deliver them,
    stop it; the statements it ran in this database."""
    register(db_dsn, DEST, CHANNEL)
    async with await AsyncConnection.connect(db_dsn, autocommit=True) as conn:
        await queue.enqueue(
            conn,
            [NewItem(DEST, CHANNEL, f"COST{n:05d}", "ADT^A08", adt(n)) for n in range(MESSAGES)],
        )
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")

    async def delivered() -> bool:
        async with await AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'"
            )
            row = await cur.fetchone()
            return row is not None and row[0] == MESSAGES

    async with MllpReceiver() as rx:
        cfg = worker_config(DEST, rx.port, channel=CHANNEL)
        async with worker(cfg, make_conninfo(db_dsn, user=COUNTED)):
            await until(delivered, timeout=60)
    assert len(rx.received) == MESSAGES
    name = psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT s.query, sum(s.calls)::int, sum(s.rows)::int FROM pg_stat_statements s"
            " JOIN pg_roles r ON r.oid = s.userid JOIN pg_database d ON d.oid = s.dbid"
            " WHERE r.rolname = %s AND d.datname = %s GROUP BY s.query",
            (COUNTED, name),
        ).fetchall()
    return [Counted(str(q), int(c), int(r)) for q, c, r in rows]


def per_message(counted: list[Counted]) -> dict[str, tuple[int, int]]:
    """The statements run at least once per message: text -> (calls, rows)."""
    return {c.query: (c.calls, c.rows) for c in counted if c.calls >= MESSAGES}


async def test_the_delivered_mark_costs_the_same_with_history_beside_it(server: str) -> None:
    with (
        database(server, "inturn_cost_empty") as empty,
        database(server, "inturn_cost_hist") as full,
    ):
        for dsn in (empty, full):
            migrate(dsn)
        assert await fill_history(full) == HISTORY_ROWS
        without = await drain(server, empty)
        beside = await drain(server, full)
    # one statement per message (the mark and the next head in one round trip), the same one
    # with history beside it, called as often and writing as many rows
    [(mark, (calls, rows))] = per_message(without).items()
    # (the statement as sent: queue.sql's succeeded_next, its comment lines left in the file)
    assert "done AS (" in mark and "UPDATE inturn_delivery" in mark and "inturn_log_payload" in mark
    assert (calls, rows) == (MESSAGES, MESSAGES)
    assert per_message(beside) == per_message(without)
    # and every statement of the worker's, those inside the functions it calls too, keeps away
    # from history (rows move in the maintenance job)
    assert [c.query for c in without + beside if "inturn_history" in c.query] == []
    total = {
        label: sum(c.calls for c in counted)
        for label, counted in (("empty", without), ("history", beside))
    }
    # the rest (lease, idle poll, session setup) follows the clock, not the history: a few
    assert abs(total["history"] - total["empty"]) <= 0.1 * MESSAGES, total
