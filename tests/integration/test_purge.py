"""``inturn purge`` as the purge role, a real process: it removes what nobody has to act on any
more and keeps what a person still has to (a given-up message whose ``delivery-failed`` item is
pending, resent or not; an expired one on its worklist; an order whose reply is overdue and
raised); ``--dry-run`` counts and changes nothing; a real purge leaves one audit entry with its
counts; an age needs a unit."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import actions, queue, reads, worklist
from inturn.worker.store.model import Item, NewItem
from tests.support import db
from tests.support.pipeline import INTURN, refused

pytestmark = pytest.mark.store

DEST = "ward/purge"


def message(control_id: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|{control_id}|P|2.5\r"
        "PID|1||P1^^^HOSP^MR||DOE^JOHN\r"
    ).encode()


def purge(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``inturn purge --dsn DSN ARGS`` as a process."""
    return subprocess.run(
        [INTURN, "purge", "--dsn", dsn, *args], capture_output=True, text=True, timeout=120
    )


async def item(conn: AsyncConnection[Any], item_id: int) -> Item:
    found = await reads.get_item(conn, item_id)
    assert found is not None
    return found


def snapshot(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT d.id, d.state, d.resent_as,"
            " (SELECT array_agg(w.state ORDER BY w.id) FROM inturn_worklist_item w"
            "   WHERE w.record_kind = 'delivery' AND w.record_key = d.id::text)"
            " FROM inturn_delivery d ORDER BY d.id"
        ).fetchall()


async def seed(dsn: str) -> dict[str, int]:
    """One row of each kind, all finished nine days ago (but the pending ones)."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await db.register(conn, DEST, "adt")
        names = ["delivered", "failed_open", "failed_cleared", "resent_done", "resent_open"]
        names += ["skipped_open", "skipped", "order_unanswered", "order_answered", "pending"]
        ids = dict(
            zip(
                names,
                await queue.enqueue(
                    conn, [NewItem(DEST, "adt", f"PURGE-{n}", "ADT^A01", message(n)) for n in names]
                ),
                strict=True,
            )
        )
        for name in ("failed_open", "failed_cleared", "resent_done", "resent_open"):
            assert await refused(conn, await item(conn, ids[name]), attempts=2) is not None
        page = await worklist.list_items(conn, queue="delivery-failed")
        items = {i.record_key: i.id for i in page.items}
        await worklist.clear(
            conn, items[str(ids["failed_cleared"])], who="ana", note="not to be sent again"
        )
        ids["copy_done"] = await actions.resend(conn, ids["resent_done"], who="ana") or 0
        ids["copy_open"] = await actions.resend(conn, ids["resent_open"], who="ana") or 0
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', finished_at = now()"
            " WHERE id = ANY(%s)",
            ([ids["delivered"], ids["copy_done"]],),
        )
        # the sweeper's resent-delivered rule: the copy was delivered, nothing left to do
        await worklist.clear(
            conn, items[str(ids["resent_done"])], who="sweeper", note="resent, copy delivered"
        )
        for name in ("skipped_open", "skipped"):
            assert await actions.skip(conn, ids[name], who="sweeper", why="expired")
        await worklist.place(
            conn,
            queue="delivery-expired",
            record_kind="delivery",
            record_key=str(ids["skipped_open"]),
            reason="expired",
            placed_by="sweeper",
        )
        # two orders delivered: one's reply is overdue and on the orders worklist, one's came
        for name, answered in (("order_unanswered", None), ("order_answered", "now()")):
            await conn.execute(
                "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() WHERE id = %s",
                (ids[name],),
            )
            cur = await conn.execute(
                "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
                " message_type, order_key, key_digest, reply_channel, reply_types, due_at,"
                f" answered_at) VALUES (%s, %s, %s, 'ORM^O01', 'K', 'd', 'lab', '{{ORU^R01}}',"
                f" now() - interval '8 days', {answered or 'NULL'}) RETURNING id",
                (DEST, ids[name], f"PURGE-{name}"),
            )
            row = await cur.fetchone()
            assert row is not None
            ids[f"{name}_expectation"] = row[0]
        await worklist.place(
            conn,
            queue="orders",
            record_kind="order",
            record_key=str(ids["order_unanswered_expectation"]),
            reason="unanswered-order",
            placed_by="sweeper",
        )
        await conn.execute(
            "UPDATE inturn_delivery SET finished_at = now() - interval '9 days'"
            " WHERE state <> 'pending'"
        )
    return ids


async def test_purge_keeps_what_a_person_still_has_to_act_on(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    ids = await seed(fresh_db)
    before = snapshot(fresh_db)
    dry = purge(role_dsns["purge"], "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "would purge delivered 3, failed 2, skipped 1, worklist cleared 0, leases 0"
        " (dry run: nothing deleted)",
        # the kept rows are kept by the move too (the rows stored before the channel log move
        # to history after the hot window, unless past their age: deleted first)
        "would move 0 finished item(s) to history",
    ]
    assert snapshot(fresh_db) == before
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM inturn_audit WHERE action = 'purge'"
        ).fetchone() == (0,)

    done = purge(role_dsns["purge"], "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        "purged delivered 3, failed 2, skipped 1, worklist cleared 0, leases 0",
        "moved 0 finished item(s) to history",
    ]
    kept = {row[0] for row in snapshot(fresh_db)}
    assert kept == {
        ids["failed_open"],  # given up, its delivery-failed item pending: still to resend
        ids["resent_open"],  # resent, the copy not delivered yet: the item is still pending
        ids["copy_open"],
        ids["skipped_open"],  # expired, on delivery-expired
        ids["order_unanswered"],  # its reply overdue, on the orders worklist
        ids["pending"],
    }
    with psycopg.connect(fresh_db) as conn:
        audit = conn.execute(
            "SELECT who, action, destination, item_ids, why FROM inturn_audit"
            " WHERE action = 'purge'"
        ).fetchall()
    assert audit == [
        (
            "purge",
            "purge",
            None,
            [],
            "delivered 3, failed 2, skipped 1, worklist cleared 0, leases 0",
        )
    ]
    # what the worklist item says to do still works
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        copy = await actions.resend(conn, ids["failed_open"], who="ana")
        assert copy is not None and (await item(conn, copy)).state == "pending"

    # once the item is cleared, the given-up message goes with its age
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        page = await worklist.list_items(
            conn, queue="delivery-expired", record_key=str(ids["skipped_open"])
        )
        [open_item] = page.items
        await worklist.clear(conn, open_item.id, who="ana", note="checked")
    again = purge(role_dsns["purge"], "--older-than", "7d")
    assert again.stdout.splitlines()[0] == (
        "purged delivered 0, failed 0, skipped 1, worklist cleared 0, leases 0"
    ), again.stdout


def test_windows_that_defeat_a_promise_are_said_before_the_run(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """A hot window under ingest's lost-ACK window (10 minutes by default) and a retention not
    longer than the hot window are each said in one warning line; the run still goes."""
    done = purge(role_dsns["purge"], "--hot-window", "0s", "--older-than", "1m", "--dry-run")
    assert done.returncode == 0
    assert [line for line in done.stderr.splitlines() if line.startswith("warning:")] == [
        "warning: --hot-window 0s is shorter than ingest's --duplicate-delivered-window (600s by"
        " default): a message sent again after a lost ACK is delivered again once its copy has"
        " moved to history"
    ]
    done = purge(role_dsns["purge"], "--hot-window", "1m", "--older-than", "1m", "--dry-run")
    assert done.returncode == 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "deleted from the hot table row by row" in warnings[1]
    quiet = purge(role_dsns["purge"], "--dry-run")  # the defaults: 15m hot, 7d retention
    assert "warning:" not in quiet.stderr


def test_a_person_removing_an_item_in_history_is_told_where_it_is(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """``inturn queue remove`` of an item moved to history deletes nothing and says why (it
    said "pending or missing" of a delivered item), one line an id, exit 2 (a one-line error)."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        [(moved,), (pending,)] = conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, finished_at) VALUES"
            " (%s, 'adt', 'H1', 'ADT^A01', 'MSH|x', 5, 'delivered', now() - interval '1 hour'),"
            " (%s, 'adt', 'H2', 'ADT^A01', 'MSH|x', 5, 'pending', NULL) RETURNING id",
            (DEST, DEST),
        ).fetchall()
    assert purge(role_dsns["purge"], "--hot-window", "15m").returncode == 0
    done = subprocess.run(
        [INTURN, "queue", "remove", str(moved), str(pending), "--dsn", fresh_db, "--who", "ops"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout.splitlines() == ["removed 0 item(s)"]
    assert done.stderr.splitlines() == [
        f"not removed: item {moved} is delivered and in history, which leaves by the day"
        " (`inturn purge` drops its day after the retention; `inturn queue erase` takes a"
        " patient's messages now)",
        f"not removed: item {pending} is pending, not finished: nothing to remove",
        f"inturn: error: not removed: {moved}, {pending}",
    ]


@pytest.mark.parametrize("bare", ["7", "0", "90"])
def test_an_age_without_a_unit_is_refused_and_nothing_is_deleted(
    fresh_db: str, role_dsns: dict[str, str], bare: str
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO inturn_audit (who, action) VALUES ('t', 'marker')")
    for option in ("--older-than", "--failed", "--worklist-cleared"):
        done = purge(role_dsns["purge"], option, bare)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"inturn: error: Invalid value for '{option}': '{bare}' has no unit: add one, e.g."
            f" {bare}d, {bare}h, {bare}m or {bare}s (see 'inturn purge --help')"
        ]
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT action FROM inturn_audit").fetchall() == [("marker",)]
