"""A database connection lost with the worker alive sends nothing twice (issue 40, part 2):
the worker remembers what its receiver acknowledged and, once the database is back, writes
those delivered marks before it sends anything. The session is ended exactly while a message
is at the receiver, before its ACK (the window in which the mark is lost), in the single stream
and in lanes; the receiver counts no duplicate."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.pipeline import control_ids, count, until, worker, worker_config

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.store, pytest.mark.slow]

DEST = "ward/remember"


def message(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|MSG{n:05d}|P|2.5\r"
        f"PID|1||P{n % 3}^^^HOSP^MR\r"
    ).encode()


async def _terminate_worker_sessions(dsn: str) -> int:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (f"inturn-worker {DEST}",),
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("lanes", [1, 3], ids=["one-stream", "lanes"])
async def test_a_lost_session_between_send_and_mark_sends_nothing_twice(
    fresh_db: str, lanes: int, caplog: Any
) -> None:
    total, cuts = 12, 3
    caplog.set_level(logging.INFO, logger="inturn.drain")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(
            conn,
            [NewItem(DEST, "adt", f"MSG{n:05d}", "ADT^A01", message(n)) for n in range(total)],
        )
    cfg = worker_config(DEST, 0, channel="adt", lanes=lanes, idle_seconds=1)
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.5  # each message waits at the receiver before its ACK
        cfg = worker_config(DEST, rx.port, channel="adt", lanes=lanes, idle_seconds=1)
        async with worker(cfg, fresh_db):
            done = seen = 0
            while done < cuts:
                # a message arrives at the receiver, its ACK not sent yet: end the session
                await until(lambda s=seen: len(rx.received) > s, timeout=30)
                seen = len(rx.received)
                done += await _terminate_worker_sessions(fresh_db) > 0
            await until(lambda: _all_delivered(fresh_db, total), timeout=60)
        got = control_ids(rx.received)
    assert sorted(got) == [f"MSG{n:05d}" for n in range(total)]
    assert len(got) == len(set(got))  # not one duplicate
    remembered = [r for r in caplog.records if "receiver had acknowledged" in r.getMessage()]
    assert remembered  # the marks were written from memory after the session was lost


async def _all_delivered(dsn: str, total: int) -> bool:
    return await count(dsn, "delivered", DEST) == total


def test_a_terminated_session_is_what_the_test_makes(fresh_db: str) -> None:
    """The fault is real: pg_terminate_backend ends a session, which a later statement sees."""
    with psycopg.connect(fresh_db, autocommit=True, application_name=f"inturn-worker {DEST}") as c:
        assert asyncio.run(_terminate_worker_sessions(fresh_db)) == 1
        with pytest.raises(psycopg.OperationalError):
            c.execute("SELECT 1")


async def test_remembered_marks_touch_only_pending_rows_under_the_lease(fresh_db: str) -> None:
    """The batch of remembered marks (delivery.mark_remembered): a row still pending is marked
    delivered with the attempts the worker counted; one already marked (its commit was lost to
    the worker's eyes only) or skipped by a person meanwhile is left as it is; a holder whose
    epoch is gone marks nothing."""
    from inturn.worker.store import delivery, lease
    from inturn.worker.store.lease import LeaseLost
    from inturn.worker.store.model import Sendable

    dest = "ward/batch"
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        ids = await queue.enqueue(
            conn, [NewItem(dest, "adt", f"B{n}", "ADT^A01", message(n)) for n in range(4)]
        )
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() WHERE id = %s",
            (ids[1],),
        )
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'skipped', finished_at = now() WHERE id = %s",
            (ids[2],),
        )
        old = await lease.acquire(conn, dest, "old", 600)
        assert old is not None
        await conn.execute(
            "UPDATE inturn_lease SET expires_at = now() WHERE destination = %s", (dest,)
        )
        held = await lease.acquire(conn, dest, "new", 600)
        assert held is not None

        def remembered(*chosen: int) -> list[delivery.Delivered]:
            return [
                delivery.Delivered(Sendable(i, "adt", dest, f"B{ids.index(i)}", "ADT^A01", 0), 2)
                for i in chosen
            ]

        with pytest.raises(LeaseLost):
            await delivery.mark_remembered(conn, dest, remembered(ids[0]), lease=old)
        marked = await delivery.mark_remembered(conn, dest, remembered(*ids[:3]), lease=held)
        assert set(marked) == {ids[0]}
        cur = await conn.execute(
            "SELECT id, state, attempts FROM inturn_delivery WHERE destination = %s ORDER BY id",
            (dest,),
        )
        rows = await cur.fetchall()
    assert rows == [
        (ids[0], "delivered", 2),
        (ids[1], "delivered", 0),
        (ids[2], "skipped", 0),
        (ids[3], "pending", 0),
    ]
