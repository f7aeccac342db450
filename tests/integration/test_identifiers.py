"""The identifier index against a real Postgres: written with the message, backfilled, read by
lookups and erasure; one message built per patient field."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.hl7.pid import lookup_key
from inturn.worker.store import actions, delivery, identifiers, queue, reads
from inturn.worker.store import lease as leases
from inturn.worker.store.ingest import store_batch
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import Message, NewItem

pytestmark = pytest.mark.store

DESTS = ["hospital/lab", "hospital/ris"]


def msg(control_id: str, segments: str, trigger: str = "A01") -> bytes:
    return (f"MSH|^~\\&|A|B|C|D|2024||ADT^{trigger}|{control_id}|P|2.5\r{segments}").encode()


#: One message per field that names a patient; the identifier sought is P-<field>.
BY_FIELD = {
    "PID-2": msg("F2", "PID|1|P-PID2^^^OLD|MRN-0^^^HOSP||DOE^A\r"),
    "PID-3": msg("F3", "PID|1||MRN-0^^^HOSP~P-PID3^^^HOSP||DOE^B\r"),
    "PID-4": msg("F4", "PID|1||MRN-0^^^HOSP|P-PID4^^^CLINIC|DOE^C\r"),
    "MRG-1": msg("F5", "PID|1||MRN-0^^^HOSP||DOE^D\rMRG|P-MRG1^^^HOSP\r", trigger="A40"),
}


async def ingest(conn: AsyncConnection[Any], payloads: list[bytes]) -> list[int]:
    messages = [
        Message(
            control_id=p.split(b"|")[9].decode(),
            message_type="ADT^A01",
            payload=p,
            digest=hashlib.sha256(p).digest(),
        )
        for p in payloads
    ]
    results = await store_batch(
        conn, channel="adt", destinations=DESTS, messages=messages, window_seconds=60
    )
    logged = [i for r in results for i in r.ids]
    for destination in DESTS:  # what each destination's worker pulls when woken
        async with conn.transaction():
            await conn.execute(  # its channel (none of DESTS is registered)
                "INSERT INTO inturn_cursor (destination, channel) VALUES (%s, 'adt')"
                " ON CONFLICT DO NOTHING",
                [destination],
            )
            await conn.execute("SELECT inturn_pull_for(%s, 10000)", [destination])
    cur = await conn.execute(
        "SELECT id FROM inturn_delivery WHERE message_id = ANY(%s) ORDER BY message_id, id",
        [logged],
    )
    return [int(i) for (i,) in await cur.fetchall()]


@pytest.mark.parametrize("field", sorted(BY_FIELD))
async def test_ingest_indexes_each_patient_field(conn: AsyncConnection[Any], field: str) -> None:
    ids = await ingest(conn, list(BY_FIELD.values()))
    assert len(ids) == 2 * len(BY_FIELD)
    wanted = "P-" + field.replace("-", "")
    found = await identifiers.find_patient(conn, wanted)
    control_id = BY_FIELD[field].split(b"|")[9].decode()
    assert [(i.control_id, i.destination) for i in found] == [(control_id, d) for d in DESTS]
    assert await identifiers.find_patient(conn, wanted, "NOT-THE-AUTHORITY") == []
    items, total = await reads.list_items(conn, patient_key=lookup_key(wanted))
    assert total == 2 and {i.id for i in items} == {i.id for i in found}
    # MRN-0 is in every message's PID-3.
    assert len(await identifiers.find_patient(conn, "MRN-0", "HOSP")) == 2 * len(BY_FIELD)


async def test_queue_enqueue_and_resend_write_the_keys(conn: AsyncConnection[Any]) -> None:
    payload = BY_FIELD["MRG-1"]
    [first] = await queue.enqueue(conn, [NewItem("hospital/lab", "adt", "F5", "ADT^A40", payload)])
    await delivery.succeeded(
        conn, first, 1, lease=await leases.acquire(conn, "hospital/lab", "test", 600)
    )
    copy = await actions.resend(conn, first, who="t", include_delivered=True)
    found = await identifiers.find_patient(conn, "P-MRG1", "HOSP")
    assert [i.id for i in found] == [first, copy]
    assert await identifiers.unindexed_count(conn) == 0


async def test_list_by_control_id(conn: AsyncConnection[Any]) -> None:
    await ingest(conn, [BY_FIELD["PID-2"], BY_FIELD["PID-3"]])
    items, total = await reads.list_items(conn, control_id="F3", destination="hospital/ris")
    assert total == 1 and [(i.control_id, i.destination) for i in items] == [("F3", "hospital/ris")]
    assert await reads.list_items(conn, control_id="F") == ([], 0)


async def test_rows_not_indexed_yet_are_found_then_backfilled(fresh_db: str) -> None:
    """Rows stored before migration 0004 (or by an older ingest) have no keys: erasure reads
    their payloads until `inturn migrate` indexes them."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        # rows holding their payload, as stored before the channel log
        ids = await queue.enqueue(
            conn,
            [
                NewItem(d, "adt", p.split(b"|")[9].decode(), "ADT^A01", p)
                for p in (BY_FIELD["PID-4"], BY_FIELD["PID-2"])
                for d in DESTS
            ],
        )
        await conn.execute("UPDATE inturn_delivery SET patient_keys = NULL WHERE id = %s", [ids[0]])
        assert await identifiers.unindexed_count(conn) == 1
        assert [i.id for i in await identifiers.find_patient(conn, "P-PID4", "CLINIC")] == ids[:2]
        _, total = await reads.list_items(conn, patient_key=lookup_key("P-PID4"))
        assert total == 1  # the listing reads only the index
    migrate(fresh_db)  # every run backfills
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await identifiers.unindexed_count(conn) == 0
        _, total = await reads.list_items(conn, patient_key=lookup_key("P-PID4"))
        assert total == 2


def test_backfill_in_batches(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for n in range(7):
            p = msg(f"B{n}", f"PID|1||B-{n % 2}^^^H\r")
            conn.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " payload, size) VALUES ('h/l', 'adt', %s, 'ADT^A01', %s, %s)",
                (f"B{n}", p, len(p)),
            )
        assert identifiers.backfill(conn, batch=3) == 7
        assert identifiers.backfill(conn, batch=3) == 0
        rows = conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE patient_keys @> ARRAY[%s]",
            (lookup_key("B-1", "H"),),
        ).fetchone()
    assert rows == (3,)


@pytest.mark.parametrize(
    ("query", "params", "index"),
    [
        ("find_patient", {"key": "0" * 32}, "inturn_delivery_patient"),
        ("unindexed_batch", {"after": 0, "batch": 10}, "inturn_delivery_unindexed"),
    ],
)
def test_lookups_can_use_their_index(
    fresh_db: str, query: str, params: dict[str, Any], index: str
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(f"EXPLAIN {identifiers.Q[query]}", params).fetchall()
        by_control = conn.execute(
            "EXPLAIN SELECT id FROM inturn_delivery WHERE control_id = %s", ("X",)
        ).fetchall()
    assert index in "\n".join(r[0] for r in plan)
    assert "inturn_delivery_control_id" in "\n".join(r[0] for r in by_control)
