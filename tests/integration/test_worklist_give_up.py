"""Giving up on a message and placing it on ``delivery-failed`` commit together or not at all."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker import worklist
from inturn.worker.store import lease as leases
from inturn.worker.store import queue, reads
from inturn.worker.store.model import NewItem
from inturn.worker.worklist.delivery_failed import failure_reason, give_up
from tests.support.pipeline import refused

pytestmark = pytest.mark.store


def test_failure_reasons_are_codes() -> None:
    assert failure_reason("AR", exhausted=True) == "attempts-exhausted"
    assert failure_reason("AR", exhausted=False) == "ack-ar"
    assert failure_reason("invalidAck", exhausted=False) == "invalid-ack"
    assert failure_reason("controlIdMismatch", exhausted=False) == "control-id-mismatch"
    assert failure_reason("unsendable", exhausted=False) == "unsendable"


async def observed(dsn: str) -> tuple[str, int]:
    """What another session sees: the item's state and the number of worklist items."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT (SELECT state FROM inturn_delivery),"
            " (SELECT count(*) FROM inturn_worklist_item)"
        )
        row = await cur.fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


async def test_a_kill_between_the_two_writes_leaves_neither(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        [item_id] = await queue.enqueue(
            conn, [NewItem("ward/lab", "adt", "MSG1", "ADT^A01", b"MSH|^~\\&|x\r")]
        )
        item = await reads.get_item(conn, item_id)
    assert item is not None

    # Another session holds the same pending key uncommitted, so the placement waits on it
    # after the failed mark was written: the worker is stopped between its two writes.
    blocker = await AsyncConnection.connect(fresh_db)
    await blocker.execute(
        "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, placed_by)"
        " VALUES ('delivery-failed', 'delivery', %s, 'attempts-exhausted', 'test')",
        (str(item_id),),
    )
    worker = await AsyncConnection.connect(fresh_db, autocommit=True)
    pid = worker.info.backend_pid
    held = await leases.acquire(worker, item.destination, "test", 600)
    task = asyncio.create_task(
        give_up(worker, item, attempts=3, cause="AR: no", outcome="AR", exhausted=True, lease=held)
    )
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as watcher:
        async with asyncio.timeout(20):
            while True:
                cur = await watcher.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                )
                row = await cur.fetchone()
                if row is not None and row[0] == "Lock":
                    break
                await asyncio.sleep(0.02)
        assert await observed(fresh_db) == ("pending", 0)
        await watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        await task
    await blocker.rollback()
    await blocker.close()
    await worker.close()
    assert await observed(fresh_db) == ("pending", 0)

    # Run again to the end: both writes are there.
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        placement = await refused(conn, item)
        assert placement is not None and placement.created
        assert await observed(fresh_db) == ("failed", 1)
        # An item no longer pending is not failed again, and nothing is placed.
        assert await refused(conn, item, attempts=4) is None
        shown = await worklist.show(conn, placement.item_id)
    assert shown.item.details["attempts"] == 3


async def test_a_failed_placement_undoes_the_failed_mark(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        [item_id] = await queue.enqueue(
            conn, [NewItem("ward/lab", "adt", "MSG1", "ADT^A01", b"MSH|^~\\&|x\r")]
        )
        item = await reads.get_item(conn, item_id)
        assert item is not None
        await conn.execute(
            "ALTER TABLE inturn_worklist_item ADD CONSTRAINT refuse_all CHECK (false) NOT VALID"
        )
        try:
            with pytest.raises(psycopg.errors.CheckViolation):
                await give_up(
                    conn,
                    item,
                    attempts=1,
                    cause="AR",
                    outcome="AR",
                    exhausted=False,
                    lease=await leases.acquire(conn, item.destination, "test", 600),
                )
        finally:
            await conn.execute("ALTER TABLE inturn_worklist_item DROP CONSTRAINT refuse_all")
    assert await observed(fresh_db) == ("pending", 0)


async def test_erasing_a_failed_message_clears_its_work_item_in_the_same_transaction(
    fresh_db: str,
) -> None:
    """A person is never told to resend a message that is gone (issue 28, item 3): erasure
    clears the item by ``system``, with a note, or, if the erasure rolls back, leaves both."""
    from inturn.worker.store import actions

    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        ids = await queue.enqueue(
            conn,
            [NewItem("ward/lab", "adt", f"E{n}", "ADT^A01", b"MSH|^~\\&|x\r") for n in range(2)],
        )
        held = await leases.acquire(conn, "ward/lab", "test", 600)
        for item_id in ids:
            item = await reads.get_item(conn, item_id)
            assert item is not None
            await give_up(
                conn, item, attempts=3, cause="AR: no", outcome="AR", exhausted=True, lease=held
            )
        async with conn.transaction(force_rollback=True):  # an erasure that does not commit
            await actions.erase(conn, [ids[0]], who="dpo", why="ticket 7")
        pending = await worklist.list_items(conn, queue="delivery-failed", state="pending")
        assert [i.record_key for i in pending.items] == [str(ids[0]), str(ids[1])]

        assert await actions.erase(conn, [ids[0]], who="dpo", why="ticket 7") == [ids[0]]
        done = await worklist.list_items(conn, queue="delivery-failed", state="cleared")
        [cleared] = done.items
        assert (cleared.record_key, cleared.cleared_by, cleared.note) == (
            str(ids[0]),
            "system",
            actions.ERASED_NOTE,
        )
        still = await worklist.list_items(conn, queue="delivery-failed", state="pending")
        assert [i.record_key for i in still.items] == [str(ids[1])]
        cur = await conn.execute("SELECT who, action FROM inturn_audit ORDER BY id")
        assert [tuple(r) for r in await cur.fetchall()][-2:] == [
            ("dpo", "erase"),
            ("system", "worklist-clear"),
        ]
