"""Resending tells the truth: copies go out in the original order, a resent item is shown as
such and no longer counted as failed, a second copy is never queued by mistake, and the
``delivery-failed`` item is cleared by the system once a copy is delivered."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.errors import Conflict, Invalid
from inturn.worker.operations import queue as actions
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import notify, queue, reads
from inturn.worker.store.model import NewItem
from inturn.worker.worklist.delivery_rules import resent_delivered
from tests.support.pipeline import refused, register

pytestmark = pytest.mark.store

DEST = "ward/lab"
DELIVERED = "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() WHERE id = %s"
INTURN = str(Path(sys.executable).with_name("inturn"))


def message(control_id: str, kind: str = "ORU^R01") -> NewItem:
    payload = f"MSH|^~\\&|A|B|C|D|20260101||{kind}|{control_id}|P|2.5\rPID|1||1\r".encode()
    return NewItem(DEST, "adt", control_id, kind, payload)


async def failed(conn: AsyncConnection[Any], *control_ids: str, kind: str = "ORU^R01") -> list[int]:
    """Enqueue messages and give each up as a worker would (failed mark + delivery-failed)."""
    ids = await queue.enqueue(conn, [message(c, kind) for c in control_ids])
    for item_id in ids:
        item = await reads.get_item(conn, item_id)
        assert item is not None
        await refused(conn, item)
    return ids


def cli_text(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``inturn ARGS --dsn DSN``, its output as text (not checked)."""
    return subprocess.run([INTURN, *args, "--dsn", dsn], capture_output=True, text=True, timeout=60)


def seeded(script: str, dsn: str) -> Any:
    """Run ``script`` (Python) with ``dsn`` as its argument; what it printed, read as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script, dsn], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def pending_work(conn: AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(
        "SELECT record_key FROM inturn_worklist_item"
        " WHERE queue = 'delivery-failed' AND state = 'pending' ORDER BY id"
    )
    return [r[0] for r in await cur.fetchall()]


async def test_copies_keep_the_original_order_and_link_both_ways(
    conn: AsyncConnection[Any],
) -> None:
    a, b, c = await failed(conn, "A", "B", "C")
    [(depth,)] = [(d.failed,) for d in await reads.depth(conn)]
    assert depth == 3
    # asked newest first, as `queue list -s failed` shows them: resent oldest first anyway
    done = await actions.resend_many(conn, Trusted("alice"), [c, b, a], "receiver fixed")
    copies = [copy for _, copy in done.copies]
    assert [original for original, _ in done.copies] == [a, b, c]
    assert copies == sorted(copies) and copies[0] > c
    for original, copy in done.copies:
        before, after = await reads.get_item(conn, original), await reads.get_item(conn, copy)
        assert before is not None and after is not None
        assert (before.state, before.resent_as) == ("failed", copy)
        assert (after.state, after.resent_from, after.control_id) == (
            "pending",
            original,
            before.control_id,
        )
    # what still needs a person: nothing failed any more; three copies wait
    [row] = await reads.depth(conn)
    assert (row.pending, row.failed) == (3, 0)
    # one audit entry names every original and copy
    cur = await conn.execute("SELECT who, item_ids, why FROM inturn_audit WHERE action = 'resend'")
    assert await cur.fetchall() == [("alice", sorted([a, b, c, *copies]), "receiver fixed")]


async def test_a_second_copy_is_never_queued_by_mistake(conn: AsyncConnection[Any]) -> None:
    [a] = await failed(conn, "A")
    [pending] = await queue.enqueue(conn, [message("P")])
    first = await actions.resend(conn, Trusted("alice"), a)
    with pytest.raises(Conflict, match=rf"item {a} was already resent as {first.copy}"):
        await actions.resend(conn, Trusted("bob"), a)
    again = await actions.resend_many(conn, Trusted("bob"), [a, pending, 999_999])
    assert again.copies == ()
    assert again.refused == (
        (a, f"already resent as {first.copy}"),
        (pending, "still pending (it will be sent anyway)"),
        (999_999, "no such item"),
    )


async def test_every_failed_item_of_a_destination_with_a_type_filter(
    conn: AsyncConnection[Any],
) -> None:
    await conn.execute(
        "INSERT INTO inturn_destination (destination, namespace, name, channel)"
        " VALUES ('ward/lab', 'ward', 'lab', 'adt')"
    )
    lab = await failed(conn, "L1", "L2", kind="ORU^R01")
    [adt] = await failed(conn, "A1", kind="ADT^A01")
    done = await actions.resend_failed(conn, Trusted("alice"), DEST, message_type="ORU^*")
    assert [o for o, _ in done.copies] == lab
    done = await actions.resend_failed(conn, Trusted("alice"), DEST)
    assert [o for o, _ in done.copies] == [adt]
    with pytest.raises(Conflict, match="has no failed item left to resend"):
        await actions.resend_failed(conn, Trusted("alice"), DEST)


async def test_delivery_failed_is_cleared_by_the_system_once_a_copy_is_delivered(
    conn: AsyncConnection[Any],
) -> None:
    a, b = await failed(conn, "A", "B")
    done = await actions.resend_many(conn, Trusted("alice"), [a, b])
    (_, copy_a), (_, copy_b) = done.copies
    assert await pending_work(conn) == [str(a), str(b)]
    # the copy of a is delivered; the copy of b fails again (its own item), then is resent
    # and that second copy is delivered
    await conn.execute(
        "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() WHERE id = %s",
        (copy_a,),
    )
    item_b = await reads.get_item(conn, copy_b)
    assert item_b is not None
    await refused(conn, item_b)
    outcome = await resent_delivered(conn, limit=10, dry_run=False)
    assert outcome.cleared == 1
    assert await pending_work(conn) == [str(b), str(copy_b)]
    second = await actions.resend(conn, Trusted("alice"), copy_b)
    await conn.execute(
        "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() WHERE id = %s",
        (second.copy,),
    )
    assert (await resent_delivered(conn, limit=10, dry_run=True)).cleared == 2  # changes nothing
    assert (await resent_delivered(conn, limit=10, dry_run=False)).cleared == 2
    assert await pending_work(conn) == []
    cur = await conn.execute(
        "SELECT DISTINCT cleared_by, note FROM inturn_worklist_item WHERE queue = 'delivery-failed'"
    )
    assert await cur.fetchall() == [("system", "resent, and the copy was delivered")]


def test_the_cli_resends_a_range_in_original_order(fresh_db: str) -> None:
    inturn = functools.partial(cli_text, fresh_db)
    first, last = seeded(SEED, fresh_db)
    done = inturn("queue", "resend", f"{first}-{last}", "--who", "alice", "--json")
    assert done.returncode == 0, done.stderr
    copies = json.loads(done.stdout)["copies"]
    assert [c["original"] for c in copies] == list(range(first, last + 1))
    assert [c["copy"] for c in copies] == sorted(c["copy"] for c in copies)
    listed = inturn("queue", "list", "-s", "failed")
    assert f"failed (resent as {copies[0]['copy']})" in listed.stdout
    depth = inturn("queue", "depth", "--json")
    [row] = json.loads(depth.stdout)
    assert (row["pending"], row["failed"]) == (3, 0)
    again = inturn("queue", "resend", str(first), str(last), "--who", "bob")
    assert again.returncode == 1
    assert again.stderr.splitlines() == [
        f"not resent: {first}: already resent as {copies[0]['copy']}",
        f"not resent: {last}: already resent as {copies[-1]['copy']}",
    ]
    usage = inturn("queue", "resend", "5-3", "--who", "bob")
    assert usage.returncode == 2 and "the range ends before it starts" in usage.stderr


SEED = """
import asyncio, json, sys
from psycopg import AsyncConnection
from inturn.worker.store import notify, queue
from inturn.worker.store.model import NewItem

async def main(dsn):
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        payload = b"MSH|^~\\\\&|A|B|C|D|1||ORU^R01|C%d|P|2.5\\r"
        ids = await queue.enqueue(
            conn, [NewItem("ward/lab", "adt", f"C{n}", "ORU^R01", payload % n) for n in range(3)]
        )
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now() WHERE id = ANY(%s)",
            (ids,),
        )
    print(json.dumps([ids[0], ids[-1]]))

asyncio.run(main(sys.argv[1]))
"""


async def test_a_bulk_resend_over_two_destinations_is_one_set_in_the_original_order(
    conn: AsyncConnection[Any],
) -> None:
    """The set-based resend: every copy in the original order with ascending ids, each copy
    pointing at its original and back, the identifier index keys copied with it, one NOTIFY
    per destination, one audit entry naming every original and copy."""
    other = [
        NewItem("ward/other", "adt", f"O{n}", "ADT^A01", message(f"O{n}").payload) for n in (1, 2)
    ]
    ids = await failed(conn, "R1", "R2", "R3")
    for item_id in await queue.enqueue(conn, other):
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now() WHERE id = %s",
            (item_id,),
        )
        ids.append(item_id)
    for destination in (DEST, "ward/other"):
        await conn.execute(f'LISTEN "{notify.notify_channel(destination)}"')
    done = await actions.resend_many(conn, Trusted("ops"), [*ids, 999_999], "again")
    assert [o for o, _ in done.copies] == sorted(ids)
    copies = [c for _, c in done.copies]
    assert copies == sorted(copies) and min(copies) > max(ids)
    assert done.refused == ((999_999, "no such item"),)
    cur = await conn.execute(
        "SELECT c.id, c.resent_from, o.resent_as, c.state, c.destination, c.control_id,"
        "       c.payload = o.payload, c.patient_keys = o.patient_keys, c.size = o.size"
        "  FROM inturn_delivery c JOIN inturn_delivery o ON o.id = c.resent_from"
        " ORDER BY c.id"
    )
    rows = await cur.fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [(c, o, c) for o, c in done.copies]
    assert {(r[3], r[6], r[7], r[8]) for r in rows} == {("pending", True, True, True)}
    assert [r[5] for r in rows] == ["R1", "R2", "R3", "O1", "O2"]
    heard = {n.payload async for n in conn.notifies(timeout=1, stop_after=2)}
    assert heard == {DEST, "ward/other"}
    cur = await conn.execute(
        "SELECT item_ids, destination FROM inturn_audit WHERE action = 'resend'"
    )
    [(audited, destination)] = await cur.fetchall()
    assert sorted(audited) == sorted([*ids, *copies]) and destination is None


INTERLEAVED = """
import asyncio, json, sys
from psycopg import AsyncConnection
from inturn.worker.store import notify, queue
from inturn.worker.store.model import NewItem

async def main(dsn):
    # ids interleave across three destinations: lab fails, ris and pacs got theirs
    plan = [("ward/lab", "failed"), ("ward/ris", "delivered"), ("ward/pacs", "delivered"),
            ("ward/lab", "failed"), ("ward/lab", "delivered"), ("ward/lab", "failed")]
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        ids = []
        for n, (dest, state) in enumerate(plan):
            payload = b"MSH|^~\\\\&|A|B|C|D|1||ADT^A01|C%d|P|2.5\\r" % n
            [i] = await queue.enqueue(conn, [NewItem(dest, "adt", f"C{n}", "ADT^A01", payload)])
            await conn.execute(
                "UPDATE inturn_delivery SET state = %s, finished_at = now() WHERE id = %s",
                (state, i),
            )
            ids.append(i)
    print(json.dumps(ids))

asyncio.run(main(sys.argv[1]))
"""


def test_a_range_resends_only_its_destinations_failed_items(fresh_db: str) -> None:
    """The clinical risk of issue 28's trial: `resend 25 19-22` where 19, 22 and 25 are one
    destination's failures, and 20, 21 delivered items of two other destinations, copies 19,
    22 and 25 only; the range's other rows are left out, counted by kind, and unchanged."""

    inturn = functools.partial(cli_text, fresh_db)
    lab1, ris, _pacs, lab2, lab_done, lab3 = seeded(INTERLEAVED, fresh_db)
    done = inturn("queue", "resend", str(lab3), f"{lab1}-{lab_done}", "--who", "alice", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [c["original"] for c in result["copies"]] == [lab1, lab2, lab3]
    assert result["refused"] == []
    assert result["leftOut"] == [
        {"kind": "delivered", "count": 1},
        {"kind": "of other destinations", "count": 2},
    ]
    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute(
            "SELECT destination, count(*), count(resent_as) FROM inturn_delivery"
            " GROUP BY destination ORDER BY destination"
        ).fetchall()
    # nothing queued for the other destinations, and their rows were not marked
    assert rows == [("ward/lab", 7, 3), ("ward/pacs", 1, 0), ("ward/ris", 1, 0)]
    # the text form says what it left out, one line per kind; nothing left to copy -> exit 1
    again = inturn("queue", "resend", f"{lab1}-{lab3}", "--who", "alice")
    assert again.returncode == 1
    assert again.stdout == ""
    assert again.stderr.splitlines() == [
        "left out: 3 items already resent",
        "left out: 1 delivered item (--include-delivered resends them)",
        "left out: 2 items of other destinations",
        "nothing resent",
    ]
    # named alone, a delivered item is refused unless asked for
    alone = inturn("queue", "resend", str(ris), str(lab_done), "--who", "alice")
    assert alone.returncode == 1
    assert alone.stderr.splitlines() == [
        f"not resent: {ris}: delivered (only failed items are resent without --include-delivered)",
        f"not resent: {lab_done}: delivered (only failed items are resent without"
        " --include-delivered)",
    ]
    asked = inturn(
        "queue", "resend", f"{lab1}-{lab3}", "--include-delivered", "--who", "alice", "--json"
    )
    assert asked.returncode == 0, asked.stderr
    assert [c["original"] for c in json.loads(asked.stdout)["copies"]] == [lab_done]
    with psycopg.connect(fresh_db) as conn:
        [(others,)] = conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE destination <> 'ward/lab'"
        ).fetchall()
    assert others == 2  # still only ris's and pacs's originals


async def test_a_range_whose_ends_name_two_destinations_is_refused(
    conn: AsyncConnection[Any],
) -> None:
    [a] = await failed(conn, "A")
    [b] = await queue.enqueue(conn, [NewItem("ward/other", "adt", "B", "ADT^A01", b"MSH|x")])
    await conn.execute(
        "UPDATE inturn_delivery SET state = 'failed', finished_at = now() WHERE id = %s", (b,)
    )
    with pytest.raises(Invalid, match=rf"the range {a}-{b} starts and ends in different"):
        await actions.resend_many(conn, Trusted("ops"), [], ranges=[(a, b)])
    cur = await conn.execute("SELECT count(*) FROM inturn_delivery")
    assert await cur.fetchone() == (2,)


async def test_a_resend_into_a_destination_no_longer_registered_warns(fresh_db: str) -> None:
    """A new user's trial: copies resent after the destination's manifest was removed sat
    pending with no worker, and the command said only "queued copy". It now says so; a
    registered destination's resend says nothing more."""
    register(fresh_db, DEST, "adt")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        first, second = await failed(conn, "G1", "G2")
    kept = cli_text(fresh_db, "queue", "resend", str(first), "--who", "ops")
    assert (kept.returncode, kept.stderr) == (0, "")
    register(fresh_db, DEST, "adt", deleted=True)
    gone = cli_text(fresh_db, "queue", "resend", str(second), "--who", "ops")
    assert gone.returncode == 0 and gone.stdout.startswith(f"queued copy of {second} as ")
    assert gone.stderr == (
        f"warning: {DEST} is not registered (its manifest or Destination is gone): no worker"
        " sends its copies until it is registered again (`inturn queue depth` shows it"
        " orphaned)\n"
    )
