"""Kind 8: fixing a destination takes effect at once.

A head backing off for an hour after failures at a wrong port: a worker started again tries it
at once (the backoff was an earlier process's, issue 28 item 4) and, with the same wrong port,
backs off again; the same worker taking its lease again keeps its own backoff; a worker with
the corrected port sends it at once; its first failure stays on the row (a refused port holds
the queue without counting an attempt).
"""

from __future__ import annotations

import pytest
from psycopg import AsyncConnection

from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy
from inturn.worker.store import delivery, queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.pipeline import rows, until, worker, worker_config
from tests.support.ports import free_port

pytestmark = pytest.mark.store

HOUR = RetryPolicy(
    max_attempts=0, backoff_seconds=3600, max_backoff_seconds=3600, timeout_seconds=5
)
MSG = b"MSH|^~\\&|A|B|C|D|2026||ADT^A01|FIX1|P|2.5.1\rPID|1||42\r"


async def test_a_corrected_address_is_tried_at_once(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [NewItem("ward/moved", "c", "FIX1", "ADT^A01", MSG)])
    wrong = MllpSenderConfig("127.0.0.1", free_port())
    async with worker(worker_config("ward/moved", wrong, retry=HOUR), fresh_db):
        await until(lambda: rows(fresh_db, "ward/moved")[0]["last_error"] is not None)
    [row] = rows(fresh_db, "ward/moved")
    assert row["state"] == "pending" and row["last_error"].startswith("unreachable")
    assert row["attempts"] == 0

    # The same settings in a new process: tried at once, refused again, an hour's wait again.
    async with worker(worker_config("ward/moved", wrong, retry=HOUR), fresh_db) as again:
        await until(lambda: rows(fresh_db, "ward/moved")[0]["last_attempt"] > row["last_attempt"])
        await until(lambda: rows(fresh_db, "ward/moved")[0]["next_attempt"] > row["next_attempt"])
        # the same process taking its lease again: its own backoff stands
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            assert await delivery.sender_changed(
                conn, "ward/moved", again.sender_fingerprint, lease=again.lease
            ) == (False, 0)
    [still] = rows(fresh_db, "ward/moved")
    assert still["attempts"] == 0 and still["reason"] == row["reason"]

    async with MllpReceiver() as receiver:
        fixed = MllpSenderConfig("127.0.0.1", receiver.port)
        async with worker(worker_config("ward/moved", fixed, retry=HOUR), fresh_db):
            await receiver.wait_for(1)
            await until(lambda: rows(fresh_db, "ward/moved")[0]["state"] == "delivered")
    [done] = rows(fresh_db, "ward/moved")
    assert done["attempts"] == 1  # the refused one held the queue and is not counted
    assert done["reason"] == row["reason"] and done["reason"].startswith("unreachable")
    assert receiver.received == [MSG]
