"""A finished item moved to history is still found, read and resent (issue 37): the listings
by MSH-10, destination and patient, one item's record, its payload for a person (sealed ones
opened with their binding) and a resend, whose copy links its original in history and is
delivered; the same for a slim row whose payload is its log row's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.hl7.header import parse_header
from inturn.worker.operations import privacy
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import actions, delivery, history, identifiers, queue, reads
from inturn.worker.store import lease as leases
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys
from tests.support.channel_log import append
from tests.support.pipeline import register, worker, worker_config

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

DEST = "ward/a"
CHANNEL = "adt"


def adt(n: int, mrn: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|HIST{n:03d}|P|2.5\r".encode()
        + f"PID|1||{mrn}^^^HOSP^MR||HISTORY^HANNA\r".encode()
    )


def item(payload: bytes) -> NewItem:
    header = parse_header(payload)
    return NewItem(DEST, CHANNEL, header.control_id, header.message_type.raw, payload)


def never_stop() -> Callable[[], Awaitable[bool]]:
    async def renew() -> bool:
        return True

    return renew


async def move_all(dsn: str) -> int:
    """Every finished row to history, as the maintenance job does past its hot window."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', attempts = 1,"
            " finished_at = now() - interval '1 hour' WHERE state = 'pending'"
        )
    settings = history.Settings(retention_seconds=86400 * 7, hot_seconds=600, batch=100)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await history.move(conn, settings, never_stop())


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
async def test_a_moved_item_is_listed_read_and_resent(
    fresh_db: str, keys_dir: Path, key_dsn: str, sealed: bool
) -> None:
    register(fresh_db, DEST, CHANNEL)
    codec = await keys.codec(keys_dir, key_dsn) if sealed else None
    messages = [adt(n, f"H-{n % 2}") for n in range(4)]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        ids = await queue.enqueue(conn, [item(m) for m in messages], codec)
    assert await move_all(fresh_db) == 4
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        # nothing is left in the hot table: every reader finds the items in history
        cur = await conn.execute("SELECT count(*) FROM inturn_delivery")
        assert await cur.fetchone() == (0,)
        by_msh10, total = await reads.list_items(conn, control_id="HIST002")
        assert ([i.id for i in by_msh10], total) == ([ids[2]], 1)
        listed, total = await reads.list_items(conn, destination=DEST, limit=3)
        assert ([i.id for i in listed], total) == (ids[::-1][:3], 4)
        page, _ = await reads.list_items(conn, destination=DEST, before=ids[1])
        assert [i.id for i in page] == [ids[0]]
        one = await reads.get_item(conn, ids[1])
        assert one is not None and (one.state, one.control_id) == ("delivered", "HIST001")
        patient = identifiers.lookup_text("H-1", None, codec)
        found, total = await reads.list_items(conn, patient_key=patient)
        assert ([i.id for i in found], total) == ([ids[3], ids[1]], 2)
        shown = await privacy.view_payload(conn, Trusted("dpo"), ids[2], "ticket 5", codec)
        assert shown.data == messages[2]
        # a resend of a moved item: the copy is queued, sealed for its own row, linked
        done = await actions.resend_many(
            conn,
            [ids[0]],
            who="ops",
            why="lost by the receiver",
            payloads=codec,
            include_delivered=True,
        )
        assert len(done.copies) == 1 and done.refused == ()
    with psycopg.connect(fresh_db) as sync:
        [(copy_id, resent_from)] = sync.execute(
            "SELECT id, resent_from FROM inturn_delivery"
        ).fetchall()
        assert resent_from == ids[0]
        assert sync.execute(
            "SELECT resent_as FROM inturn_history WHERE id = %s", (ids[0],)
        ).fetchone() == (copy_id,)
    options = {"payloads": codec} if codec is not None else {}
    async with (
        MllpReceiver() as rx,
        worker(worker_config(DEST, rx.port, channel=CHANNEL), fresh_db, **options),
    ):
        await rx.wait_for(1)
    assert rx.received == [messages[0]]


async def test_a_moved_slim_row_reads_its_log_rows_payload(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        [log_id] = append(sync, [DEST], 1, tag="SLIM")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, DEST, "w", 60)
        assert lease is not None
        await delivery.pull(conn, DEST, CHANNEL, lease=lease)
        cur = await conn.execute("SELECT id FROM inturn_delivery")
        [(row_id,)] = await cur.fetchall()
    assert await move_all(fresh_db) == 1
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        shown = await privacy.view_payload(conn, Trusted("dpo"), row_id, "ticket 6")
        assert shown.data.startswith(b"MSH|") and b"SLIM0" in shown.data
        done = await actions.resend_many(
            conn, [row_id], who="ops", why="again", include_delivered=True
        )
        assert len(done.copies) == 1
    with psycopg.connect(fresh_db) as sync:
        [(payload,)] = sync.execute("SELECT payload FROM inturn_delivery").fetchall()
        [(stored,)] = sync.execute(
            "SELECT payload FROM inturn_message WHERE id = %s", (log_id,)
        ).fetchall()
    assert bytes(payload) == bytes(stored)
