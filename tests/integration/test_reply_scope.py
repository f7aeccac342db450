"""A correlation answers only what it belongs to (issue 27, item 1).

On a real Postgres, through real ingest: the expectations are what the worker's delivered mark
records (:func:`inturn.worker.orders.keys.expectations` over the order it delivered), and the
statement that answers is ingest's store statement. Several destinations expect replies on one
channel, with overlapping placer numbers, orders addressed to several labs, a ``from`` list, and
strangers guessing numbers; each reply answers its own orders only, and every reply that
answers nothing is counted.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.orders.keys import expectations
from inturn.worker.spec.replies import ReplyRule, key_digest, parse, to_spec
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support.db import register
from tests.support.ingest import Client, config

pytestmark = pytest.mark.store

RULE = ReplyRule(("ORM^O01",), ("ORU^R01",), "results", 3600)
FROM_LIS3 = parse({**to_spec(RULE), "from": [{"application": "LIS3"}]})
FROM_LIS4_AT_F4 = parse({**to_spec(RULE), "from": [{"application": "LIS4", "facility": "F4"}]})
#: destination -> its reply rule
DESTINATIONS = {"lab/a": RULE, "lab/b": RULE, "lab/c": FROM_LIS3, "lab/d": FROM_LIS4_AT_F4}


def order(control_id: str, placer: str, to: tuple[str, str]) -> bytes:
    return (
        f"MSH|^~\\&|EHR|HOSP|{to[0]}|{to[1]}|20261201||ORM^O01|{control_id}|P|2.5\r"
        f"PID|1||P1^^^H^MR\rORC|NW|{placer}^EHR\r"
    ).encode()


def result(control_id: str, placer: str, sender: tuple[str, str]) -> bytes:
    obr = f"OBR|1|{placer}^EHR|F1|CBC\r" if placer else "OBR|1||F1|CBC\r"
    return (
        f"MSH|^~\\&|{sender[0]}|{sender[1]}|EHR|HOSP|20261201||ORU^R01|{control_id}|P|2.5\r"
        f"PID|1||P1^^^H^MR\r{obr}"
    ).encode()


#: (destination, order control id, placer, addressed to)
ORDERS = [
    ("lab/a", "A1", "K1", ("LIS", "LAB")),
    ("lab/b", "B1", "K1", ("LIS2", "LAB2")),  # the same placer number at another lab
    ("lab/a", "A2", "K2", ("LIS", "LAB")),
    ("lab/a", "A7", "K7", ("LABX", "F1")),  # one destination, two labs, one number
    ("lab/a", "A8", "K7", ("LABY", "F2")),
    ("lab/c", "C1", "K3", ("GATEWAY", "HUB")),  # from: LIS3 answers, whoever was addressed
    ("lab/d", "D1", "K4", ("GATEWAY", "HUB")),  # from: LIS4 at F4 only
]

#: (reply control id, placer, sender) -> the orders it answers
REPLIES: list[tuple[tuple[str, str, tuple[str, str]], set[str]]] = [
    (("R1", "K1", ("LIS", "LAB")), {"A1"}),  # not lab/b's K1
    (("R2", "K2", ("ROGUE", "X")), set()),  # a stranger guessing a number
    (("R3", "K2", ("LIS2", "LAB2")), set()),  # a real lab, but not the one addressed
    (("R4", "K7", ("LABX", "F1")), {"A7"}),  # not the K7 sent to LABY
    (("R5", "K3", ("GATEWAY", "HUB")), set()),  # addressed, but lab/c declares from: LIS3
    (("R6", "K3", ("LIS3^1.2.3^ISO", "ANY")), {"C1"}),  # declared (first component), any facility
    (("R7", "K4", ("LIS4", "F5")), set()),  # declared application, other facility
    (("R8", "K4", ("LIS4", "F4")), {"D1"}),
    (("R9", "K1", ("LIS2", "LAB2")), {"B1"}),  # lab/b's own lab, at last
    (("R10", "K404", ("LIS", "LAB")), set()),  # no such order
    (("R11", "", ("LIS", "LAB")), set()),  # a result without a placer number: answers nothing
]


async def record_expectations(conn: AsyncConnection[Any]) -> None:
    """Enqueue the orders and record what each expects, as the worker's delivered mark does."""
    for destination, control_id, placer, to in ORDERS:
        payload = order(control_id, placer, to)
        [item_id] = await queue.enqueue(
            conn, [NewItem(destination, "orders", control_id, "ORM^O01", payload)]
        )
        for e in expectations(destination, [DESTINATIONS[destination]], "ORM^O01", payload):
            await conn.execute(
                "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
                " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
                " VALUES (%s, %s, %s, 'ORM^O01', %s, %s, %s, %s, now() + interval '1 hour')",
                (destination, item_id, control_id, e.key, e.digest, e.channel, ["ORU^R01"]),
            )


def unmatched() -> float:
    value = REGISTRY.get_sample_value(
        "inturn_ingest_replies_total", {"channel": "results", "outcome": "unmatched"}
    )
    return value or 0.0


async def test_each_reply_answers_its_own_orders_only(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for destination, rule in DESTINATIONS.items():
            await register(conn, destination, "orders", replies=[to_spec(rule)])
        await register(conn, "ward/ehr", "results")
        await record_expectations(conn)
        before = unmatched()
        listener = ListenerConfig("results", "127.0.0.1", 0)
        async with Ingest(config(listeners=[listener]), dsn=fresh_db) as ingest:
            c = await Client.connect(ingest.mllp_ports["results"])
            for (control_id, placer, sender), answers in REPLIES:
                assert (await c.send(result(control_id, placer, sender))).code == "AA"
                cur = await conn.execute(
                    "SELECT control_id FROM inturn_order_expectation"
                    " WHERE answered_control_id = %s",
                    (control_id,),
                )
                assert {r[0] for r in await cur.fetchall()} == answers, control_id
            await c.close()
        assert unmatched() == before + sum(1 for _, answers in REPLIES if not answers)
        cur = await conn.execute(
            "SELECT control_id FROM inturn_order_expectation WHERE answered_at IS NULL"
        )
        assert {r[0] for r in await cur.fetchall()} == {"A2", "A8"}


async def test_an_upgrade_keeps_open_orders_answerable(empty_db: str) -> None:
    """Expectations recorded before migration 0017 (a digest of destination and key only) are
    re-keyed under their owner from their order's MSH segment, so their replies still answer
    them; one whose order row is gone keeps the old digest (and is raised when due)."""
    import psycopg

    from inturn.worker.store.migrate import Q as MQ
    from inturn.worker.store.migrate import available, migrate

    with psycopg.connect(empty_db, autocommit=True) as conn:  # the release before this one
        conn.execute(MQ["ensure_table"])
        for m in available():
            if m.version < 17:
                conn.execute(m.sql.encode())
                conn.execute(MQ["record"], {"version": m.version, "name": m.name})
        orders = [
            (
                "lab/a",
                "U1",
                "K1",
                b"MSH|^~\\&|EHR|HOSP|LIS|LAB|2026||ORM^O01|U1|P|2.5\rORC|NW|K1\r",
            ),
            (
                "lab/a",
                "U2",
                "K2",
                b"MSH|^~\\&|EHR|HOSP| LIS2 ^1.2^ISO|LAB2&x|2026||ORM^O01|U2|P|2.5\rORC|NW|K2\r",
            ),
            (
                "lab/b",
                "U3",
                "K3",
                "MSH#^~\\&#EHR#HOSP#LÏS#LAB#2026##ORM^O01#U3#P#2.5\rORC#NW#K3\r".encode("latin-1"),
            ),
        ]
        for destination, control_id, key, payload in orders:
            [(item_id,)] = conn.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " payload, size) VALUES (%s, 'orders', %s, 'ORM^O01', %s, %s) RETURNING id",
                (destination, control_id, payload, len(payload)),
            ).fetchall()
            legacy = key_digest(destination, key)
            conn.execute(
                "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
                " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
                " VALUES (%s, %s, %s, 'ORM^O01', %s, %s, 'results', '{ORU^R01}',"
                " now() + interval '1 hour')",
                (destination, item_id, control_id, key, legacy),
            )
        conn.execute(  # an order whose row was purged: nothing to re-key it from
            "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
            " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
            " VALUES ('lab/a', 999999, 'GONE', 'ORM^O01', 'K9', %s, 'results', '{ORU^R01}',"
            " now() + interval '1 hour')",
            (key_digest("lab/a", "K9"),),
        )
    migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        got = dict(
            conn.execute("SELECT control_id, key_digest FROM inturn_order_expectation").fetchall()
        )
    for destination, control_id, _, payload in orders:
        [expected] = expectations(destination, [RULE], "ORM^O01", payload)
        assert got[control_id] == expected.digest, control_id
    assert got["GONE"] == key_digest("lab/a", "K9")
