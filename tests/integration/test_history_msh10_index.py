"""MSH-10 across days of history indexed two ways (issue 37, migration 0056): a day that held
rows when 0056 ran keeps its hash index on control_id (its own now, no longer the parent's),
the day prepared ahead and every later one index MSH-10 with a GIN over ARRAY[control_id];
a lookup and its count by MSH-10 find the rows of both kinds of day (and the hot table's),
each day read through the index it has."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import history, queue, reads
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from tests.support.db import migrate_below

pytestmark = pytest.mark.store

DEST = "ward/msh10"


def adt(control_id: str) -> bytes:
    return f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|{control_id}|P|2.5\r".encode()


async def never_stop() -> bool:
    return True


async def delivered_and_moved(dsn: str, control_ids: list[str]) -> None:
    """Rows queued, delivered an hour ago, and moved to history by the maintenance."""
    items = [NewItem(DEST, "adt", c, "ADT^A01", adt(c)) for c in control_ids]
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        ids = await queue.enqueue(conn, items, None)
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', attempts = 1,"
            " finished_at = now() - interval '1 hour' WHERE id = ANY(%s)",
            (ids,),
        )
        settings = history.Settings(retention_seconds=86400 * 30, hot_seconds=600)
        assert await history.move(conn, settings, never_stop) == len(ids)


def indexes(dsn: str) -> dict[str, tuple[str, str | None]]:
    """Each history partition's index on MSH-10: its access method and its parent index."""
    with psycopg.connect(dsn) as conn:
        rows: list[Any] = conn.execute(
            """
            SELECT c.relname, am.amname,
                   (SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                     WHERE i.inhrelid = ic.oid)
              FROM pg_inherits h
              JOIN pg_class c ON c.oid = h.inhrelid
              JOIN pg_index x ON x.indrelid = c.oid
              JOIN pg_class ic ON ic.oid = x.indexrelid
              JOIN pg_am am ON am.oid = ic.relam
             WHERE h.inhparent = 'inturn_history'::regclass
               AND pg_get_indexdef(ic.oid) LIKE '%%control_id%%'
            """
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


async def test_msh10_lookups_read_old_hash_days_and_new_gin_days(empty_db: str) -> None:
    migrate_below(empty_db, 56)
    await delivered_and_moved(empty_db, ["OLD-1", "BOTH"])  # epoch 1, under the hash index
    with psycopg.connect(empty_db, autocommit=True) as sync:
        sync.execute("SELECT inturn_epoch_prepare(500)")  # epoch 2 prepared ahead, empty
    migrate(empty_db)
    assert indexes(empty_db) == {
        "inturn_history_e1": ("hash", None),
        "inturn_history_e2": ("gin", "inturn_history_msh10"),
    }
    with psycopg.connect(empty_db, autocommit=True) as sync:
        sync.execute("UPDATE inturn_epoch SET opened_at = now() - interval '2 hours' WHERE n = 1")
        assert sync.execute("SELECT inturn_epoch_turn(3600)").fetchone() == (2,)
        sync.execute("SELECT inturn_epoch_prepare(500)")  # epoch 3, made after 0056
    assert indexes(empty_db)["inturn_history_e3"] == ("gin", "inturn_history_msh10")
    await delivered_and_moved(empty_db, ["NEW-1", "BOTH"])  # epoch 2, under the GIN
    async with await AsyncConnection.connect(empty_db, autocommit=True) as conn:
        await queue.enqueue(conn, [NewItem(DEST, "adt", "BOTH", "ADT^A01", adt("BOTH"))], None)
        where: dict[str, set[str]] = {}
        for control_id, expected in (("OLD-1", 1), ("NEW-1", 1), ("BOTH", 3), ("NONE", 0)):
            items, total = await reads.list_items(conn, control_id=control_id)
            assert (len(items), total) == (expected, expected), control_id
            assert {i.control_id for i in items} <= {control_id}
            cur = await conn.execute(
                "SELECT tableoid::regclass::text FROM inturn_history WHERE control_id = %s",
                (control_id,),
            )
            where[control_id] = {str(r[0]) for r in await cur.fetchall()}
        assert where["BOTH"] == {"inturn_history_e1", "inturn_history_e2"}
        # each day can be read through the index it has, the hash index or the GIN (two rows a
        # day here: a scan is cheaper, so scans are priced out to show the indexes that match)
        await conn.execute("SET enable_seqscan = off")
        params = {
            "destination": None,
            "channel": None,
            "state": None,
            "control_id": "BOTH",
            "before": None,
            "limit": 100,
            "offset": 0,
        }
        cur = await conn.execute("EXPLAIN " + queue.Q["list_items"], params, prepare=False)
        plan = "\n".join(str(r[0]) for r in await cur.fetchall())
    assert "inturn_history_e1_control_id_idx" in plan, plan
    assert "Bitmap Index Scan on inturn_history_e2_array_idx" in plan, plan
    assert "Seq Scan on inturn_history" not in plan, plan
