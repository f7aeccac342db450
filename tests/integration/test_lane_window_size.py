"""The lane window people read (``inturn_lane_window``, migration 0051) grows linearly with its
limit: counted in rows its plan handles, not in time. Migration 0020's version looked each
message's keys up in the whole window's keys, n * n rows for n messages of n patients, so one
lanes destination with 1,000 pending failed ``inturn queue depth`` and the console's page."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import queue, reads
from inturn.worker.store.model import NewItem

DEST = "ward/window"


def adt(n: int, patient: int) -> NewItem:
    payload = (
        f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261201080000||ADT^A08|M{n:06d}|P|2.5\r"
        f"PID|1||P{patient}^^^HOSP^MR~N{patient}^^^NHS^NH||DOE^JANE\r"
    ).encode()
    return NewItem(DEST, "adt", f"M{n:06d}", "ADT^A08", payload)


def handled(node: dict[str, Any]) -> int:
    """Rows every node of an EXPLAIN ANALYZE plan produced, over all its loops."""
    own = int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
    return own + sum(handled(child) for child in node.get("Plans", ()))


async def rows_handled(conn: AsyncConnection[Any], limit: int) -> int:
    """The rows the function's own statement handles for ``limit`` (its body, planned and run
    with EXPLAIN ANALYZE: the call of a SECURITY DEFINER function is one opaque node)."""
    cur = await conn.execute(
        "SELECT p.prosrc FROM pg_proc p WHERE p.proname = 'inturn_lane_window'"
        " AND p.pronamespace = current_schema()::regnamespace"
    )
    [(body,)] = await cur.fetchall()
    body = re.sub(r"\bdest\b", "%(dest)s", re.sub(r"\blim\b", "%(lim)s", str(body)))
    cur = await conn.execute(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {body}".encode(), {"dest": DEST, "lim": limit}
    )
    [(plan,)] = await cur.fetchall()
    return handled(plan[0]["Plan"])


async def test_the_lane_window_grows_linearly_with_its_limit(conn: AsyncConnection[Any]) -> None:
    # every message its own patient (two identifiers each): the worst case for the old lookup
    await queue.enqueue(conn, [adt(n, n) for n in range(1000)])
    small, large = await rows_handled(conn, 200), await rows_handled(conn, 1000)
    print(f"lane window rows handled: limit 200 -> {small}, limit 1000 -> {large}")
    # five times the limit: at most about five times the rows (the sorts' n log n aside);
    # quadratic would be 25 times
    assert 4 * small <= large <= 6 * small
    window: Sequence[Any] = await reads.lane_window(conn, DEST)
    assert len(window) == 1000
    # what it shows: four numbers per message (two identifiers, each with and without its
    # authority), distinct within the message, no two patients sharing one
    assert all(len(set(w.keys)) == 4 for w in window)
    assert len({k for w in window for k in w.keys}) == 4000


async def test_a_slow_lane_window_fails_only_its_own_view(fresh_db: str) -> None:
    """A lane window that takes longer than its bound (here: blocked by a lock another session
    holds) is None, and the caller's transaction goes on with its own statement timeout."""
    async with (
        await AsyncConnection.connect(fresh_db, autocommit=True) as conn,
        await AsyncConnection.connect(fresh_db) as locker,
    ):
        await queue.enqueue(conn, [adt(n, n % 3) for n in range(10)])
        await locker.execute("LOCK TABLE inturn_delivery IN ACCESS EXCLUSIVE MODE")
        async with conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 5000")
            assert await reads.lane_window_within(conn, DEST, timeout_ms=200) is None
            cur = await conn.execute("SELECT current_setting('statement_timeout')")
            assert await cur.fetchone() == ("5s",)
        await locker.rollback()
        window = await reads.lane_window_within(conn, DEST, timeout_ms=2000)
    assert window is not None and [w.id for w in window] == sorted(w.id for w in window)
    assert len(window) == 10
