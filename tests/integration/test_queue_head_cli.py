"""Finding the stuck message from the command line: ``queue depth`` names each destination's
head (its id and last error, in the table and in ``--json``), ``queue skip`` of an item that is
not its destination's head says so (and skips it all the same), and a delivered item's last
error reads as an earlier attempt's, not as its state. A real worker, a real MLLP receiver
answering AE, a real Postgres, the real ``inturn`` command.
"""

from __future__ import annotations

import json

import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.pipeline import cli, rows, until, worker, worker_config

pytestmark = pytest.mark.store

DEST = "ward/stuck"


def message(n: int) -> bytes:
    return (
        f"MSH|^~\\&|LAB|HOSP|EHR|WARD|20260101120000||ORU^R01|H{n:04d}|P|2.5.1\r"
        f"PID|1||{n}^^^HOSP^MR||DOE^JANE\r"
    ).encode()


async def enqueue(dsn: str, count: int) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        items = [
            NewItem(DEST, "c", f"H{n:04d}", "ORU^R01", message(n)) for n in range(1, count + 1)
        ]
        return await queue.enqueue(conn, items)


def out(dsn: str, *args: str) -> tuple[str, str]:
    done = cli(dsn, *args)
    return done.stdout.decode(), done.stderr.decode()


async def test_depth_names_the_head_skip_warns_off_it_and_a_delivered_error_is_earlier(
    fresh_db: str,
) -> None:
    ids = await enqueue(fresh_db, 4)
    async with MllpReceiver(ack_code="AE") as rx:
        async with worker(worker_config(DEST, rx.port), fresh_db):
            await until(lambda: rows(fresh_db, DEST)[0]["attempts"] >= 1)
        head = rows(fresh_db, DEST)[0]
        error = head["last_error"]
        assert error.startswith("AE: ")

        # queue depth: the head's id and its last error, in JSON (additive keys) and the table
        (depth,) = json.loads(out(fresh_db, "queue", "depth", "--json")[0])
        assert (depth["headId"], depth["headAttempts"], depth["headLastError"]) == (
            ids[0],
            head["attempts"],
            error,
        )
        assert (depth["pending"], depth["mostAttempts"]) == (4, head["attempts"])
        table, _ = out(fresh_db, "queue", "depth")
        header, line = table.splitlines()[:2]
        assert "HEAD" in header.split() and "HEAD-LAST-ERROR" in header.split()
        assert f" {ids[0]} " in line and line.rstrip().endswith(error)

        # queue skip of an item behind the head: skipped, with a warning naming the head
        skipped, warning = out(
            fresh_db, "queue", "skip", str(ids[3]), "--who", "ann", "--why", "wrong one"
        )
        assert skipped == f"skipped {ids[3]}\n"
        assert f"warning: {ids[3]} was not the head of its destination" in warning
        said = f"is {ids[0]}: {head['attempts']} failed attempt(s), last error: {error}"
        assert said in warning
        assert rows(fresh_db, DEST)[3]["state"] == "skipped"

        # the receiver takes it now: delivered after a failed attempt
        rx.ack_code = "AA"
        async with worker(worker_config(DEST, rx.port), fresh_db):
            await until(lambda: rows(fresh_db, DEST)[2]["state"] == "delivered")
    first = rows(fresh_db, DEST)[0]
    assert (first["state"], first["last_error"]) == ("delivered", error)

    # queue list: its error reads as an earlier attempt's (the JSON keeps the stored text)
    listing, _ = out(fresh_db, "queue", "list", "-d", DEST)
    (row,) = [r for r in listing.splitlines() if r.startswith(f"{ids[0]} ")]
    assert "delivered" in row and f"earlier attempt: {error}" in row
    items = json.loads(out(fresh_db, "queue", "list", "-d", DEST, "--json")[0])["items"]
    assert [i["lastError"] for i in items if i["id"] == ids[0]] == [error]
    shown, _ = out(fresh_db, "queue", "show", str(ids[0]))
    assert f"lastError:     earlier attempt: {error}" in shown.splitlines()
    assert json.loads(out(fresh_db, "queue", "depth", "--json")[0]) == []  # nothing to show


async def test_skipping_the_head_says_nothing_more(fresh_db: str) -> None:
    ids = await enqueue(fresh_db, 2)
    skipped, warning = out(fresh_db, "queue", "skip", str(ids[0]), "--who", "ann", "--why", "x")
    assert (skipped, warning) == (f"skipped {ids[0]}\n", "")
    # the next is the head now
    (depth,) = json.loads(out(fresh_db, "queue", "depth", "--json")[0])
    assert (depth["headId"], depth["headAttempts"], depth["headLastError"]) == (ids[1], 0, None)
