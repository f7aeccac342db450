"""The delivery paths with the maintenance moving rows under them (issue 37): a lanes worker
delivering sealed messages while every finished row leaves the hot table as soon as it is
marked keeps each patient's order and sends every message once; the rows end in history,
sealed, found by patient and opened for a person."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from psycopg import AsyncConnection

from inturn.worker.drain.lanes import conflict
from inturn.worker.hl7.pid import index_keys
from inturn.worker.operations import privacy
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import history, identifiers, queue, reads
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support import keys
from tests.support.channel_log import never_stop
from tests.support.pipeline import register, worker, worker_config

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

DEST = "ward/moved"
CHANNEL = "adt"
PATIENTS = 12


def adt(n: int) -> bytes:
    """Message ``n``: patient ``n % PATIENTS``, a merge (A40) of the previous message's
    patient into this one's every 25th."""
    patient = n % PATIENTS
    if n % 25 == 24:
        return (
            f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261205080000||ADT^A40|MV{n:05d}|P|2.5\r"
            f"PID|1||P{patient}^^^HOSP^MR||MOVE^MIA\rMRG|P{(n - 1) % PATIENTS}^^^HOSP^MR\r"
        ).encode()
    return (
        f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261205080000||ADT^A08|MV{n:05d}|P|2.5\r"
        f"PID|1||P{patient}^^^HOSP^MR||MOVE^MIA\r"
    ).encode()


def control_id(payload: bytes) -> str:
    return payload.split(b"|")[9].decode()


def reorders(sent: Sequence[bytes], received: Sequence[bytes]) -> list[tuple[str, str]]:
    """Pairs that share a patient (lanes' conflict rule) but arrived out of enqueue order."""
    order = {control_id(p): i for i, p in enumerate(sent)}
    keys_of = {control_id(p): tuple(index_keys(p)) for p in sent}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, payload in enumerate(received):
        first.setdefault(control_id(payload), position)
        last[control_id(payload)] = position
    arrived = sorted(first, key=order.__getitem__)
    return [
        (a, b)
        for i, a in enumerate(arrived)
        for b in arrived[i + 1 :]
        if conflict(keys_of[a], keys_of[b]) and last[a] > first[b]
    ]


async def states(dsn: str) -> tuple[int, int]:
    """(rows still pending in the hot table, delivered rows in hot table and history)."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM inturn_delivery WHERE state = 'pending'),"
            " (SELECT count(*) FROM inturn_delivery WHERE state = 'delivered')"
            " + (SELECT count(*) FROM inturn_history WHERE state = 'delivered')"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def test_lanes_deliver_sealed_messages_while_the_maintenance_moves_every_finished_row(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    register(fresh_db, DEST, CHANNEL)
    codec = await keys.codec(keys_dir, key_dsn)
    sent = [adt(n) for n in range(240)]
    # hot window 0: a row leaves the hot table at the first batch after its mark
    settings = history.Settings(retention_seconds=86400 * 7, hot_seconds=0, batch=25)
    moved: list[int] = []
    done = asyncio.Event()

    async def mover() -> None:
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            while not done.is_set():
                moved.append(await history.move(conn, settings, never_stop))
                await asyncio.sleep(0.02)

    async def feed() -> list[int]:
        ids: list[int] = []
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            for wave in range(0, len(sent), 60):
                items = [
                    NewItem(DEST, CHANNEL, control_id(p), "ADT^A08", p)
                    for p in sent[wave : wave + 60]
                ]
                ids += await queue.enqueue(conn, items, codec)
                await asyncio.sleep(0.3)
        return ids

    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.005
        cfg = worker_config(DEST, rx.port, channel=CHANNEL, lanes=4)
        async with worker(cfg, fresh_db, payloads=codec):
            moving = asyncio.create_task(mover())
            ids = await feed()
            async with asyncio.timeout(60):
                while await states(fresh_db) != (0, len(sent)):
                    await asyncio.sleep(0.05)
            done.set()
            await moving
    assert sum(moved) > 0  # rows left the hot table while the lanes ran
    assert sorted(map(control_id, rx.received)) == sorted(map(control_id, sent))  # each once
    assert reorders(sent, rx.received) == []
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await history.move(conn, settings, never_stop)
        cur = await conn.execute("SELECT count(*) FROM inturn_delivery")
        assert await cur.fetchone() == (0,)
        # still sealed in history: no payload there holds the message in clear
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE payload IS NOT NULL), count(*) FILTER (WHERE"
            " position(convert_to('MOVE^MIA', 'UTF8') IN payload) > 0) FROM inturn_history"
        )
        assert await cur.fetchone() == (len(sent), 0)
        patient = identifiers.lookup_text("P5", None, codec)
        found, total = await reads.list_items(conn, patient_key=patient, limit=100)
        mine = [p for p in sent if identifiers.lookup_key("P5") in index_keys(p)]
        assert total == len(mine) and {i.control_id for i in found} == set(map(control_id, mine))
        for n in (0, 137, 239):
            shown = await privacy.view_payload(conn, Trusted("dpo"), ids[n], "ticket 37", codec)
            assert shown.data == sent[n]
