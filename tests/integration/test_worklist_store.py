"""The worklist store against a real Postgres: place, clear, list, count, show, purge."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker import worklist
from inturn.worker.store.worklist_model import WorklistItem

pytestmark = pytest.mark.store


async def place(
    conn: AsyncConnection[Any],
    key: str = "41",
    reason: str = "gave-up",
    queue: str = "delivery-failed",
) -> worklist.Placement:
    return await worklist.place(
        conn,
        queue=queue,
        record_kind="delivery",
        record_key=key,
        reason=reason,
        details={"destination": "hospital/lab", "attempts": 5},
        placed_by="worker",
    )


async def test_place_reports_created_then_already_there(conn: AsyncConnection[Any]) -> None:
    first = await place(conn)
    again = await place(conn)
    assert first.created is True and again.created is False
    assert again.item_id == first.item_id
    assert first.item.details == {"destination": "hospital/lab", "attempts": 5}
    assert (first.item.state, first.item.placed_by, first.item.cleared_at) == (
        "pending",
        "worker",
        None,
    )
    other_reason = await place(conn, reason="expired")
    assert other_reason.created and other_reason.item_id != first.item_id


async def test_twenty_concurrent_placers_create_one_item(fresh_db: str) -> None:
    conns = [await AsyncConnection.connect(fresh_db, autocommit=True) for _ in range(20)]
    try:
        results = await asyncio.gather(*(place(c, key="7") for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert sum(r.created for r in results) == 1
    assert len({r.item_id for r in results}) == 1
    with psycopg.connect(fresh_db) as c:
        row = c.execute("SELECT count(*) FROM inturn_worklist_item").fetchone()
    assert row == (1,)


async def test_place_joins_the_callers_transaction(conn: AsyncConnection[Any]) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with conn.transaction():
            await place(conn)
            raise Boom
    page = await worklist.list_items(conn)
    assert page.items == []
    async with conn.transaction():
        placed = await place(conn)
    assert (await worklist.get(conn, placed.item_id)) == placed.item


async def test_place_many_in_one_statement(conn: AsyncConnection[Any]) -> None:
    from inturn.worker.store.worklist import NewPlacement, place_many

    there = await place(conn, key="2")

    def new(key: str) -> NewPlacement:
        return NewPlacement(
            queue="delivery-failed",
            record_kind="delivery",
            record_key=key,
            reason="gave-up",
            placed_by="sweeper",
            details={"n": key},
        )

    placements = await place_many(conn, [new("1"), new("2"), new("3"), new("1")])
    assert [(p.item.record_key, p.created) for p in placements] == [
        ("1", True),
        ("2", False),
        ("3", True),
        ("1", False),
    ]
    assert placements[1].item_id == there.item_id
    assert placements[0].item_id == placements[3].item_id
    assert placements[2].item.details == {"n": "3"}
    assert await place_many(conn, []) == []
    with pytest.raises(ValueError, match="reason"):
        await place_many(conn, [new("4"), NewPlacement("q", "delivery", "5", "Bad Reason", "x")])
    assert len((await worklist.list_items(conn)).items) == 3


async def test_bad_input_is_refused_before_writing(conn: AsyncConnection[Any]) -> None:
    with pytest.raises(ValueError, match="queue 'Delivery Failed'"):
        await place(conn, queue="Delivery Failed")
    with pytest.raises(ValueError, match="4096 bytes"):
        await worklist.place(
            conn,
            queue="q",
            record_kind="delivery",
            record_key="1",
            reason="r",
            details={"x": "y" * 5000},
            placed_by="me",
        )
    assert (await worklist.list_items(conn, state=None)).items == []


async def test_clear_records_who_and_note_and_is_audited(conn: AsyncConnection[Any]) -> None:
    placed = await place(conn)
    cleared = await worklist.clear(conn, placed.item_id, who="alice", note="resent by hand")
    assert (cleared.state, cleared.cleared_by, cleared.note) == (
        "cleared",
        "alice",
        "resent by hand",
    )
    assert cleared.cleared_at is not None and cleared.cleared_at >= cleared.placed_at
    with pytest.raises(worklist.AlreadyCleared, match="already cleared by alice at"):
        await worklist.clear(conn, placed.item_id, who="bob", note="me too")
    with pytest.raises(worklist.ItemNotFound, match="no worklist item 999"):
        await worklist.clear(conn, 999, who="bob", note="x")
    with pytest.raises(ValueError, match="note"):
        await worklist.clear(conn, placed.item_id, who="bob", note="  ")
    cur = await conn.execute("SELECT who, action, item_ids, why FROM inturn_audit")
    assert await cur.fetchall() == [("alice", "worklist-clear", [placed.item_id], "resent by hand")]
    # Cleared, the same record and reason can be placed again: new work.
    again = await place(conn)
    assert again.created and again.item_id != placed.item_id


async def test_clear_where_clears_only_matching_pending_items(conn: AsyncConnection[Any]) -> None:
    a = await place(conn, key="1")
    b = await place(conn, key="2")
    c = await place(conn, key="2", reason="expired")
    cleared = await worklist.clear_where(
        conn, record_kind="delivery", record_keys=["2"], reason="gave-up", note="drained"
    )
    assert [i.id for i in cleared] == [b.item_id]
    assert cleared[0].cleared_by == "system"
    pending = await worklist.list_items(conn)
    assert [i.id for i in pending.items] == [a.item_id, c.item_id]
    assert await worklist.clear_where(conn, record_kind="delivery", record_keys=[], note="x") == []


async def test_list_filters_orders_and_pages_with_a_cursor(conn: AsyncConnection[Any]) -> None:
    ids = [(await place(conn, key=str(n))).item_id for n in range(7)]
    other = await place(conn, key="x", queue="other", reason="stuck")
    await worklist.clear(conn, ids[3], who="alice", note="done")

    pending = await worklist.list_items(conn, queue="delivery-failed")
    assert [i.id for i in pending.items] == [i for i in ids if i != ids[3]]
    cleared = await worklist.list_items(conn, state="cleared")
    assert [i.id for i in cleared.items] == [ids[3]]
    assert [i.id for i in (await worklist.list_items(conn, reason="stuck")).items] == [
        other.item_id
    ]
    one = await worklist.list_items(conn, record_kind="delivery", record_key="5", state=None)
    assert [i.id for i in one.items] == [ids[5]]

    seen: list[int] = []
    cursor = None
    while True:
        page = await worklist.list_items(
            conn, state=None, newest_first=True, limit=3, cursor=cursor
        )
        seen += [i.id for i in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted([*ids, other.item_id], reverse=True)

    first = pending.items[0]
    window = await worklist.list_items(
        conn,
        placed_from=first.placed_at,
        placed_to=first.placed_at + timedelta(microseconds=1),
    )
    assert [i.id for i in window.items] == [first.id]
    with pytest.raises(ValueError, match="unknown state"):
        await worklist.list_items(conn, state="done")


async def test_list_limit_is_capped(conn: AsyncConnection[Any]) -> None:
    await conn.execute(
        "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, placed_by)"
        " SELECT 'q', 'delivery', g::text, 'r', 'test' FROM generate_series(1, 1100) g"
    )
    page = await worklist.list_items(conn, limit=5000)
    assert len(page.items) == 1000 and page.next_cursor == page.items[-1].id
    rest = await worklist.list_items(conn, limit=5000, cursor=page.next_cursor)
    assert len(rest.items) == 100 and rest.next_cursor is None


async def test_count_by_queue_and_reason(conn: AsyncConnection[Any]) -> None:
    await place(conn, key="1")
    await place(conn, key="2")
    await place(conn, key="2", reason="expired")
    done = await place(conn, key="3", queue="stuck", reason="destination-stuck")
    await worklist.clear(conn, done.item_id, who="bob", note="fixed")
    rows = await worklist.count(conn)
    assert [(r.queue, r.reason, r.items) for r in rows] == [
        ("delivery-failed", "expired", 1),
        ("delivery-failed", "gave-up", 2),
    ]
    cleared = await worklist.count(conn, state="cleared")
    assert [(r.queue, r.reason, r.items) for r in cleared] == [("stuck", "destination-stuck", 1)]
    assert await worklist.count(conn, queue="nothing") == []


async def test_show_gives_the_records_history(conn: AsyncConnection[Any]) -> None:
    first = await place(conn)
    await worklist.clear(conn, first.item_id, who="alice", note="resent")
    second = await place(conn)
    await place(conn, key="other")
    shown = await worklist.show(conn, second.item_id)
    assert shown.item.id == second.item_id
    assert [(i.id, i.state, i.cleared_by) for i in shown.history] == [
        (first.item_id, "cleared", "alice"),
        (second.item_id, "pending", None),
    ]
    assert shown.to_json()["history"][0]["note"] == "resent"
    with pytest.raises(worklist.ItemNotFound):
        await worklist.show(conn, 12345)


async def test_purge_deletes_only_old_cleared_items(conn: AsyncConnection[Any]) -> None:
    old = await place(conn, key="1")
    await worklist.clear(conn, old.item_id, who="a", note="n")
    kept_pending = await place(conn, key="2")
    await conn.execute(
        "UPDATE inturn_worklist_item SET placed_at = placed_at - interval '100 days'"
    )
    await conn.execute(
        "UPDATE inturn_worklist_item SET cleared_at = now() - interval '91 days'"
        " WHERE state = 'cleared'"
    )
    recent = await place(conn, key="3")
    await worklist.clear(conn, recent.item_id, who="a", note="n")
    assert await worklist.purge(conn, batch=1) == 1
    left = await worklist.list_items(conn, state=None)
    assert [i.id for i in left.items] == [kept_pending.item_id, recent.item_id]


async def test_purge_of_20000_cleared_items_in_bounded_transactions(
    conn: AsyncConnection[Any],
) -> None:
    """20,000 old cleared items and 1,000 pending ones: exactly the cleared go, at most one
    batch per transaction (a statement trigger records each DELETE's transaction and rows).
    Four full batches and an empty one say what forty did: 200,000 items took 3 to 7 s alone
    and 330 s in a busy suite (docs/explanation/architecture.md, Tests)."""
    await conn.execute(
        "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, placed_by,"
        " placed_at, state, cleared_at, cleared_by, note)"
        " SELECT 'q', 'delivery', g::text, 'r', 't', now() - interval '1 year',"
        "        'cleared', now() - interval '91 days', 'a', 'n'"
        "   FROM generate_series(1, 20000) g"
    )
    await conn.execute(
        "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, placed_by,"
        " placed_at) SELECT 'q', 'delivery', g::text, 'r', 't', now() - interval '1 year'"
        "   FROM generate_series(1, 1000) g"
    )
    await conn.execute(
        "CREATE TABLE purge_log (xid bigint, deleted bigint);"
        " CREATE FUNCTION purge_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        "   INSERT INTO purge_log SELECT txid_current(), count(*) FROM gone; RETURN NULL; END $$;"
        " CREATE TRIGGER purge_log AFTER DELETE ON inturn_worklist_item"
        "   REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION purge_log();"
    )
    try:
        assert await worklist.purge(conn, batch=5000) == 20_000
        cur = await conn.execute(
            "SELECT count(DISTINCT xid), max(deleted), sum(deleted) FROM purge_log"
        )
        assert await cur.fetchone() == (5, 5000, 20_000)  # 4 full batches and an empty one
    finally:
        await conn.execute(
            "DROP TRIGGER purge_log ON inturn_worklist_item; DROP FUNCTION purge_log();"
            " DROP TABLE purge_log"
        )
    cur = await conn.execute("SELECT state, count(*) FROM inturn_worklist_item GROUP BY state")
    assert await cur.fetchall() == [("pending", 1000)]


class Failing:
    name = "failing"

    async def publish(self, item: WorklistItem) -> None:
        raise ConnectionError("broker down")

    async def close(self) -> None:
        pass


class Recording:
    name = "recording"

    def __init__(self) -> None:
        self.items: list[WorklistItem] = []

    async def publish(self, item: WorklistItem) -> None:
        self.items.append(item)

    async def close(self) -> None:
        pass


async def test_a_failing_publisher_never_loses_a_placement(conn: AsyncConnection[Any]) -> None:
    def failures() -> float:
        return (
            REGISTRY.get_sample_value(
                "inturn_worklist_publish_failures_total", {"publisher": "failing"}
            )
            or 0.0
        )

    before = failures()
    recording = Recording()
    async with conn.transaction():
        placed = await place(conn)
        repeat = await place(conn)
    assert await worklist.announce([placed, repeat], [Failing(), recording]) == 1
    assert failures() == before + 1
    assert [i.id for i in recording.items] == [placed.item_id]  # the repeat is not announced
    stored = await worklist.get(conn, placed.item_id)
    assert stored is not None and stored.state == "pending"


async def test_metrics_count_placements_and_gauge_pending(
    conn: AsyncConnection[Any], fresh_db: str
) -> None:
    from psycopg_pool import AsyncConnectionPool

    from inturn.worker.worklist.metrics import refresh_pending

    def sample(name: str, queue: str = "gauge-q") -> float:
        return REGISTRY.get_sample_value(name, {"queue": queue, "reason": "gave-up"}) or 0.0

    before = sample("inturn_worklist_placements_total")
    first = await place(conn, key="1", queue="gauge-q")
    second = await place(conn, key="2", queue="gauge-q")
    repeat = await place(conn, key="2", queue="gauge-q")
    await worklist.announce([first, second, repeat])
    assert sample("inturn_worklist_placements_total") == before + 2
    async with AsyncConnectionPool(fresh_db, min_size=1, max_size=1, open=False) as pool:
        await refresh_pending(pool)
        assert sample("inturn_worklist_pending") == 2
        await worklist.clear(conn, first.item_id, who="a", note="n")
        await worklist.clear(conn, second.item_id, who="a", note="n")
        await refresh_pending(pool)
        assert sample("inturn_worklist_pending") == 0  # dropped to 0, not left at 2
