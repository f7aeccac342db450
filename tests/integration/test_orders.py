"""spec.replies end to end on a real Postgres: the worker records what a delivered order
expects, ingest answers it with the stored reply, the sweeper's orders pack raises what was not
answered in time and clears it when the reply comes late; erasure reaches the expectations."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.ingest.service import Ingest
from inturn.worker.operations import packs
from inturn.worker.orders.rules import unanswered_order
from inturn.worker.spec.replies import ReplyRule, key_digest, owner_scope, to_spec
from inturn.worker.store import actions, queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.db import register
from tests.support.ingest import Client, config
from tests.support.lab import DEST, running
from tests.support.lab import config as worker_config
from tests.support.pipeline import until

pytestmark = pytest.mark.store

RULE = ReplyRule(("ORM^O01", "OML^O21"), ("ORU^R01", "ORR^O02"), "results", 3600)
#: The owner of DEST's orders: they are addressed to LIS at LAB (MSH-5/MSH-6).
OWNER = owner_scope(DEST, "LIS^LAB")


def order(n: int, placer: str | None) -> bytes:
    orc = f"ORC|NW|{placer}^EHR\r" if placer else "ORC|NW\r"
    return (
        f"MSH|^~\\&|EHR|HOSP|LIS|LAB|20261201||ORM^O01|ORD{n}|P|2.5\rPID|1||P{n}^^^H^MR\r{orc}"
    ).encode()


def result(n: int, placer: str) -> bytes:
    return (
        f"MSH|^~\\&|LIS|LAB|EHR|HOSP|20261201||ORU^R01|RES{n}|P|2.5\r"
        f"PID|1||P{n}^^^H^MR\rOBR|1|{placer}^EHR|F{n}|CBC\r"
    ).encode()


async def expectations(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT control_id, order_key, key_digest, reply_channel, answered_control_id,"
        " due_at - delivered_at FROM inturn_order_expectation ORDER BY id"
    )
    return list(await cur.fetchall())


async def test_the_worker_records_what_a_delivered_order_expects(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(
            conn,
            [
                NewItem(DEST, "orders", "ORD1", "ORM^O01", order(1, "PL-1")),
                NewItem(DEST, "orders", "ORD2", "ORM^O01", order(2, None)),  # no key: none
                NewItem(DEST, "orders", "ADT3", "ADT^A01", order(3, "PL-3")),  # not an order
            ],
        )
        async with MllpReceiver() as rx, running(worker_config(rx.port, replies=(RULE,)), fresh_db):

            async def delivered() -> bool:
                cur = await conn.execute(
                    "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'"
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 3

            await until(delivered)
        rows = await expectations(conn)
    assert [r[:5] for r in rows] == [("ORD1", "PL-1", key_digest(OWNER, "PL-1"), "results", None)]
    assert rows[0][5].total_seconds() == pytest.approx(3600, abs=5)


async def test_an_order_shaped_for_its_receiver_waits_for_a_reply_naming_what_was_sent(
    fresh_db: str,
) -> None:
    """Issue 42: with a receiver profile the expectation is read from the order as sent: the
    receiver's own placer number (mapped) under the receiver's name (MSH-5 set), which its
    result will carry; the stored order keeps its own."""
    from inturn.worker.hl7.profile import compile_profile

    profile = compile_profile(
        {
            "set": {"MSH-5": "LIS_NORTH"},
            "maps": [{"field": "ORC-2.1", "table": {"PL-1": "NORTH-1"}}],
        }
    )
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(conn, [NewItem(DEST, "orders", "ORD1", "ORM^O01", order(1, "PL-1"))])
        async with MllpReceiver() as rx:
            cfg = worker_config(rx.port, replies=(RULE,), profile=profile)
            async with running(cfg, fresh_db):
                await rx.wait_for(1)

                async def recorded() -> bool:
                    return bool(await expectations(conn))

                await until(recorded)
        rows = await expectations(conn)
    owner = owner_scope(DEST, "LIS_NORTH^LAB")
    assert [r[:4] for r in rows] == [("ORD1", "NORTH-1", key_digest(owner, "NORTH-1"), "results")]
    assert b"ORC|NW|NORTH-1^EHR" in rx.received[0]


async def test_ingest_answers_with_the_reply_and_the_sweeper_raises_the_rest(
    fresh_db: str,
) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, "orders", replies=[to_spec(RULE)])
        await register(conn, "ward/ehr", "results")
        delivered = await queue.enqueue(
            conn,
            [NewItem(DEST, "orders", f"ORD{n}", "ORM^O01", order(n, f"PL-{n}")) for n in (1, 2)],
        )
        # as the worker's delivered mark records them (see the test above), both already due
        await conn.execute(
            "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
            " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
            " SELECT %s, d.id, d.control_id, d.message_type, 'PL-' || substr(d.control_id, 4),"
            "        '', 'results', '{ORU^R01}', now() - interval '1 minute'"
            "   FROM inturn_delivery d WHERE d.id = ANY(%s)",
            (DEST, delivered),
        )
        await conn.execute(
            "UPDATE inturn_order_expectation SET key_digest = %s WHERE order_key = 'PL-1'",
            (key_digest(OWNER, "PL-1"),),
        )
        await conn.execute(
            "UPDATE inturn_order_expectation SET key_digest = %s WHERE order_key = 'PL-2'",
            (key_digest(OWNER, "PL-2"),),
        )
        unmatched_before = (
            REGISTRY.get_sample_value(
                "inturn_ingest_replies_total", {"channel": "results", "outcome": "unmatched"}
            )
            or 0.0
        )
        async with Ingest(config(listeners=[_listener("results")]), dsn=fresh_db) as ingest:
            c = await Client.connect(ingest.mllp_ports["results"])
            assert (await c.send(result(1, "PL-1"))).code == "AA"  # answers order 1
            assert (await c.send(result(9, "PL-9"))).code == "AA"  # answers nothing
            await c.close()
        assert (
            REGISTRY.get_sample_value(
                "inturn_ingest_replies_total", {"channel": "results", "outcome": "unmatched"}
            )
            == unmatched_before + 1
        )
        rows = await expectations(conn)
        assert [(r[0], r[4]) for r in rows] == [("ORD1", "RES1"), ("ORD2", None)], rows
        # the sweeper: order 2 is overdue, order 1 was answered
        outcome = await unanswered_order(conn, limit=10, dry_run=False)
        assert outcome.placed == 1
        item = outcome.placements[0].item
        assert (item.queue, item.reason, item.record_kind) == (
            "orders",
            "unanswered-order",
            "order",
        )
        assert item.details["destination"] == DEST and item.details["controlId"] == "ORD2"
        assert item.details["orderKey"] == "PL-2" and "payload" not in item.details
        again = await unanswered_order(conn, limit=10, dry_run=False)
        assert (again.placed, again.already) == (0, 1)  # idempotent
        # the reply comes late: the next sweep clears it by system
        async with Ingest(config(listeners=[_listener("results")]), dsn=fresh_db) as ingest:
            c = await Client.connect(ingest.mllp_ports["results"])
            assert (await c.send(result(2, "PL-2"))).code == "AA"
            await c.close()
        late = await unanswered_order(conn, limit=10, dry_run=False)
        assert (late.placed, late.cleared) == (0, 1)
        cur = await conn.execute(
            "SELECT cleared_by, note FROM inturn_worklist_item WHERE reason = 'unanswered-order'"
        )
        assert await cur.fetchall() == [("system", "its reply arrived")]


async def test_erasure_reaches_the_expectations(fresh_db: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        [item_id] = await queue.enqueue(
            conn, [NewItem(DEST, "orders", "ORD1", "ORM^O01", order(1, "PL-1"))]
        )
        await conn.execute(
            "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
            " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
            " VALUES (%s, %s, 'ORD1', 'ORM^O01', 'PL-1', %s, 'results', '{ORU^R01}',"
            " now() - interval '1 minute')",
            (DEST, item_id, key_digest(OWNER, "PL-1")),
        )
        assert (await unanswered_order(conn, limit=10, dry_run=False)).placed == 1
        await actions.erase(conn, [item_id], who="dpo", why="erasure request 42")
        assert await expectations(conn) == []
        outcome = await unanswered_order(conn, limit=10, dry_run=False)
        assert outcome.cleared == 1


def test_the_orders_pack_is_registered() -> None:
    assert [r.name for r in packs.get("orders").configured()] == ["unanswered-order"]


def _listener(channel: str) -> Any:
    from inturn.worker.ingest.listener import ListenerConfig

    return ListenerConfig(channel, "127.0.0.1", 0)
