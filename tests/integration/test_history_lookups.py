"""Lookups and a resend across the days of history (issue 37): messages finished on two days
(two epochs, so two partitions of ``inturn_history``) and one still pending are found together
by MSH-10 and by patient, newest first, paged by destination across the partitions; the oldest
day's message is shown, read and resent, and its copy delivered after the pending one; the
command line (inturn queue list --control-id, inturn queue show) finds them the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.hl7.header import parse_header
from inturn.worker.operations import privacy
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import actions, history, identifiers, queue, reads
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys
from tests.support.channel_log import never_stop
from tests.support.pipeline import cli, register, worker, worker_config

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

DEST = "ward/days"
CHANNEL = "adt"


def adt(control_id: str, mrn: str, n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A08|{control_id}|P|2.5\r"
        f"PID|1||{mrn}^^^HOSP^MR||DAYS^DORA\rNTE|1||note {n}\r"
    ).encode()


async def queued(dsn: str, payloads: list[bytes], codec: PayloadCodec | None) -> list[int]:
    items = []
    for p in payloads:
        header = parse_header(p)
        items.append(NewItem(DEST, CHANNEL, header.control_id, header.message_type.raw, p))
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await queue.enqueue(conn, items, codec)


async def finish_and_move(dsn: str, ids: list[int]) -> int:
    """The rows delivered an hour ago, then the maintenance's move (hot window 10 minutes)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', attempts = 1,"
            " finished_at = now() - interval '1 hour' WHERE id = ANY(%s)",
            (ids,),
        )
    settings = history.Settings(retention_seconds=86400 * 30, hot_seconds=600)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await history.move(conn, settings, never_stop)


async def next_day(dsn: str) -> None:
    """The maintenance turns the epoch (the open day two hours old, a day of an hour)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_epoch SET opened_at = now() - interval '2 hours'"
            " WHERE closed_at IS NULL AND opened_at IS NOT NULL"
        )
    settings = history.Settings(retention_seconds=86400 * 30, epoch_seconds=3600)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        done = history.Upkeep()
        await history.turn(conn, settings, done)
        assert done.turned is not None


def partitions(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        rows: list[Any] = conn.execute(
            "SELECT id, tableoid::regclass::text FROM inturn_history"
        ).fetchall()
    return {int(i): str(t) for i, t in rows}


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
async def test_lookups_and_a_resend_reach_every_day_of_history(
    fresh_db: str, keys_dir: Path, key_dsn: str, sealed: bool
) -> None:
    register(fresh_db, DEST, CHANNEL)
    codec = await keys.codec(keys_dir, key_dsn) if sealed else None
    # a sender that repeats MSH-10 SAME every day, for patient P-1; P-2 in between
    msgs = [
        adt("SAME", "P-1", 0),
        adt("D1-B", "P-2", 1),
        adt("SAME", "P-1", 2),
        adt("D2-B", "P-2", 3),
        adt("SAME", "P-1", 4),
    ]
    day1 = await queued(fresh_db, msgs[0:2], codec)
    assert await finish_and_move(fresh_db, day1) == 2
    await next_day(fresh_db)
    day2 = await queued(fresh_db, msgs[2:4], codec)
    assert await finish_and_move(fresh_db, day2) == 2
    [pending] = await queued(fresh_db, msgs[4:5], codec)
    ids = [*day1, *day2, pending]
    where = partitions(fresh_db)
    assert {where[i] for i in day1} == {"inturn_history_e1"}
    assert {where[i] for i in day2} == {"inturn_history_e2"}
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        found, total = await reads.list_items(conn, control_id="SAME")
        assert [(i.id, i.state) for i in found] == [
            (ids[4], "pending"),
            (ids[2], "delivered"),
            (ids[0], "delivered"),
        ]
        assert total == 3
        patient = identifiers.lookup_text("P-1", None, codec)
        found, total = await reads.list_items(conn, patient_key=patient)
        assert ([i.id for i in found], total) == ([ids[4], ids[2], ids[0]], 3)
        other = identifiers.lookup_text("P-2", "HOSP", codec)
        found, total = await reads.list_items(conn, patient_key=other)
        assert ([i.id for i in found], total) == ([ids[3], ids[1]], 2)
        # a destination's pages run from the hot table through both days
        first, total = await reads.list_items(conn, destination=DEST, limit=2)
        assert ([i.id for i in first], total) == ([ids[4], ids[3]], 5)
        second, _ = await reads.list_items(conn, destination=DEST, limit=2, before=ids[3])
        third, _ = await reads.list_items(conn, destination=DEST, limit=2, before=ids[1])
        assert [i.id for i in second + third] == [ids[2], ids[1], ids[0]]
        oldest = await reads.get_item(conn, ids[0])
        assert oldest is not None and (oldest.state, oldest.control_id) == ("delivered", "SAME")
        shown = await privacy.view_payload(conn, Trusted("dpo"), ids[0], "ticket 37", codec)
        assert shown.data == msgs[0]
        if codec is None:  # what a person types: the command line reads history too
            listed = json.loads(
                cli(fresh_db, "queue", "list", "--control-id", "SAME", "--json").stdout
            )
            assert listed["total"] == 3
            assert [(i["id"], i["state"]) for i in listed["items"]] == [
                (ids[4], "pending"),
                (ids[2], "delivered"),
                (ids[0], "delivered"),
            ]
            shown_cli = json.loads(cli(fresh_db, "queue", "show", str(ids[0]), "--json").stdout)
            assert (shown_cli["id"], shown_cli["state"]) == (ids[0], "delivered")
        done = await actions.resend_many(
            conn, [ids[0]], who="ops", why="lost", payloads=codec, include_delivered=True
        )
        assert len(done.copies) == 1 and done.refused == ()
    options = {"payloads": codec} if codec is not None else {}
    async with (
        MllpReceiver() as rx,
        worker(worker_config(DEST, rx.port, channel=CHANNEL), fresh_db, **options),
    ):
        await rx.wait_for(2)
    # the pending message first, then the first day's copy, in the order they were queued
    assert rx.received == [msgs[4], msgs[0]]
