"""A head reads its payload from its log message's own partition (issue 37, migration 0049):
with a dozen days of the channel log kept, the head, the next head after a delivered mark and
the lanes' take plan no scan of the log (they call ``inturn_log_payload_rows``, migration 0057,
once for the row they chose), the function's statement plans on the one partition holding the
id it is given, and the payloads and bindings read are those of each message, whatever its
day."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import delivery, history
from inturn.worker.store import lease as leases
from inturn.worker.store.queries import load
from tests.support.channel_log import append

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

A = "ward/heads"
CHANNEL = "adt"
DAYS = 12
Q = load("queue.sql")


def plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, init plans and subplans included."""
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def explained(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[Any]:
    """The nodes of ``query``'s plan for ``params``, planned as a prepared statement's custom
    plan is (the values known), inside a transaction rolled back (a plan of an UPDATE runs
    nothing without ANALYZE, but the lease guard's set_config is local to it)."""
    with conn.transaction(force_rollback=True):
        [(plan,)] = conn.execute(f"EXPLAIN (FORMAT JSON) {query}", params).fetchall()
    return list(plan_nodes(plan[0]["Plan"]))


async def days_kept(dsn: str) -> list[int]:
    """``DAYS`` epochs of the log, each with a message routed to A (turned as the maintenance
    job turns them, the open one backdated past the epoch's length); their log ids, oldest
    first."""
    settings = history.Settings(retention_seconds=86400 * 365, epoch_seconds=60)
    ids: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as sync:
        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            for day in range(DAYS):
                ids += append(sync, [A], 1, tag=f"D{day}-")
                if day < DAYS - 1:
                    await conn.execute(
                        "UPDATE inturn_epoch SET opened_at = now() - interval '2 minutes'"
                        " WHERE closed_at IS NULL AND opened_at IS NOT NULL"
                    )
                    await history.turn(conn, settings, history.Upkeep())
    return ids


async def test_the_head_plans_on_no_log_partition_and_reads_each_days_payload(
    fresh_db: str,
) -> None:
    ids = await days_kept(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        partitions = sync.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'inturn_message'::regclass"
        ).fetchone()
        assert partitions is not None and partitions[0] >= DAYS
        # one log message a day, each in its own partition
        [(days,)] = sync.execute(
            "SELECT count(DISTINCT tableoid) FROM inturn_message WHERE id = ANY(%s)", (ids,)
        ).fetchall()
        assert days == DAYS
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        held = await leases.acquire(conn, A, "w-heads", 60)
        while (await delivery.pull(conn, A, CHANNEL, lease=held)).more:
            pass
        # the heads in order, each with its own day's payload and its log binding
        seen = []
        head, _ = await delivery.next_head(conn, A, lease=held)
        while head is not None:
            seen.append((head.binding, head.item.control_id, head.payload.split(b"|")[9]))
            _, (head, _) = await delivery.succeeded_next(conn, head.item, 1, lease=held)
        assert seen == [
            ((log_id, "channel:adt"), f"D{day}-0", f"D{day}-0".encode())
            for day, log_id in enumerate(ids)
        ]
        lease_params = {
            "destination": A, "holder": held.holder, "epoch": held.epoch, "renew": True,
        }  # fmt: skip
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        sync.execute(
            "UPDATE inturn_delivery SET state = 'pending', finished_at = NULL"
            " WHERE destination = %s",
            (A,),
        )
        first, last = sync.execute(
            "SELECT min(id), max(id) FROM inturn_delivery WHERE destination = %s", (A,)
        ).fetchone() or (0, 0)
        none: dict[str, Any] = {
            "keys": None, "digests": None, "channels": None, "types": None, "within": None,
        }  # fmt: skip
        statements = {
            "head": (Q["head"], {**lease_params, "after": 0}),
            "succeeded_next": (
                Q["succeeded_next"], {**lease_params, "id": first, "attempts": 1},
            ),
            "take": (
                Q["take"],
                {
                    **lease_params, **none, "ids": [first, last], "done_ids": [first],
                    "done_attempts": [1], "exp_ids": None,
                },
            ),
        }  # fmt: skip
        for name, (query, params) in statements.items():
            nodes = explained(sync, query, params)
            relations = {n["Relation Name"] for n in nodes if "Relation Name" in n}
            functions = {n["Function Name"] for n in nodes if "Function Name" in n}
            assert not {r for r in relations if r.startswith("inturn_message")}, (name, relations)
            assert "inturn_log_payload_rows" in functions, (name, functions)

        # the function's own statement, as it stands in the catalog, plans on one partition:
        # the one holding the id, the first day's or the last's
        [(source,)] = sync.execute(
            "SELECT prosrc FROM pg_proc WHERE oid = 'inturn_log_payload_rows(bigint)'::regprocedure"
        ).fetchall()
        found = re.search(r"SELECT.*?;", source, re.DOTALL)
        assert found is not None
        select = re.sub(r"\s+INTO\s+payload, seal_id, seal_scope", "", found.group(0))
        select = select.rstrip(";").replace("log_id", "%(id)s")
        for log_id in (ids[0], ids[-1]):
            nodes = explained(sync, select, {"id": log_id})
            relations = {n["Relation Name"] for n in nodes if "Relation Name" in n}
            [(holder,)] = sync.execute(
                "SELECT tableoid::regclass::text FROM inturn_message WHERE id = %s", (log_id,)
            ).fetchall()
            assert relations == {holder}, json.dumps([log_id, sorted(relations)])
