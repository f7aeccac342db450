"""With payload keys, no value of a message that identifies a patient or an order is stored in
clear (issue 41, part 2): a placer order number (ORC-2) that spec.replies waits on is recorded
only as its keyed digest, in the expectation and in the unanswered-order worklist item; a dump,
the tables' files and the WAL written meanwhile hold none of the message's values."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.orders.rules import unanswered_order
from inturn.worker.spec.replies import ReplyRule
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys
from tests.support.lab import DEST
from tests.support.lab import config as worker_config
from tests.support.pipeline import until
from tests.support.pipeline import worker as run_worker

pytestmark = pytest.mark.store

RULE = ReplyRule(("ORM^O01",), ("ORU^R01",), "results", 1)
#: Every value of the order that names its patient or the order itself.
VALUES = (b"PLACER-Q7731", b"MRN-Z99182", b"XAVIERSSON", b"QUILLFEATHER", b"19411207")


def order() -> bytes:
    return (
        b"MSH|^~\\&|EHR|HOSP|LIS|LAB|20261201||ORM^O01|ORD1|P|2.5\r"
        b"PID|1||MRN-Z99182^^^H^MR||XAVIERSSON^QUILLFEATHER||19411207\r"
        b"ORC|NW|PLACER-Q7731^EHR\r"
    )


async def test_an_orders_number_and_patient_are_nowhere_in_clear(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    codec = await keys.codec(keys_dir, key_dsn)
    not_here = keys.files_not_here(fresh_db)
    if not_here:  # a server elsewhere
        pytest.skip(not_here)
    with keys.wal_kept(fresh_db) as since:  # none of it recycled before it is read
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await queue.enqueue(conn, [NewItem(DEST, "orders", "ORD1", "ORM^O01", order())], codec)
            async with (
                MllpReceiver() as rx,
                run_worker(worker_config(rx.port, replies=(RULE,)), fresh_db, payloads=codec),
            ):

                async def recorded() -> bool:
                    cur = await conn.execute("SELECT count(*) FROM inturn_order_expectation")
                    row = await cur.fetchone()
                    return row is not None and row[0] == 1

                await until(recorded)
            assert rx.received == [order()]  # the receiver gets the order as it was sent
            cur = await conn.execute("SELECT order_key, key_digest FROM inturn_order_expectation")
            [(order_key, digest)] = await cur.fetchall()
            assert order_key == "" and digest and "PLACER" not in digest
            # the reply is due in 1 s: the sweeper raises it, naming the message, not the number
            await until(lambda: _overdue(fresh_db))
            outcome = await unanswered_order(conn, limit=10, dry_run=False)
            assert outcome.placed == 1
            cur = await conn.execute(
                "SELECT details FROM inturn_worklist_item WHERE reason = 'unanswered-order'"
            )
            [(details,)] = await cur.fetchall()
        assert details["orderKey"] is None and details["controlId"] == "ORD1"
        assert isinstance(details["deliveryId"], int)
        dumped = keys.dump(fresh_db)
        assert b"inturn_order_expectation" in dumped
        for value in VALUES:
            assert value not in dumped, value
        pages = b"".join(
            keys.relation_bytes(fresh_db, t)
            for t in ("inturn_delivery", "inturn_order_expectation", "inturn_worklist_item")
        )
        wal = keys.wal_bytes(fresh_db, since)
    assert wal
    for value in VALUES:
        assert value not in pages, value
        assert value not in wal, value


def _overdue(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM inturn_order_expectation WHERE due_at <= now()"
        ).fetchone()
    return row is not None and row[0] == 1


def test_the_wal_read_is_kept_through_checkpoints(fresh_db: str) -> None:
    """What the test above reads of the WAL stays on disk until it is read. A checkpoint removes
    or recycles a segment that nothing holds (a file gone under the read, which the test once took
    for a server elsewhere, and skipped); :func:`keys.wal_kept` holds them. (Without it, the
    segment is gone here; not asserted: another test's slot on a shared server would keep it.)"""
    if keys.files_not_here(fresh_db):
        pytest.skip("the server's files are not readable here")

    def checkpoints_then_first_segment(since: str) -> tuple[str, int]:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            for _ in range(3):
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS churn (a int)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            row = conn.execute(
                "SELECT w.name, count(d.name)::int FROM pg_walfile_name(%s::pg_lsn) AS w(name)"
                " LEFT JOIN pg_ls_waldir() AS d ON d.name = w.name GROUP BY w.name",
                (since,),
            ).fetchone()
        assert row is not None
        return row[0], row[1]

    with keys.wal_kept(fresh_db) as since:
        name, present = checkpoints_then_first_segment(since)
        assert present == 1, name
        assert keys.wal_bytes(fresh_db, since)
