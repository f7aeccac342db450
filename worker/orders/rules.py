"""The sweeper's ``orders`` pack: ``unanswered-order``.

``unanswered-order``
    An order delivered to a Destination with ``spec.replies`` whose reply has not arrived by
    its due time (delivered + ``withinSeconds``) is placed on the ``orders`` worklist: record
    kind ``order``, key the expectation's id; details: the destination, the order's MSH-10 and
    MSH-9, the matching key, the reply channel and types, when it was delivered and due (never
    the payload). A reply that arrives later lets the next sweep clear it by ``system``; so
    does erasing the order. Each expectation is raised at most once (a person who clears it is
    not handed it again).

The worker records expectations with the delivered mark and ingest answers them with the stored
reply (:mod:`inturn.worker.orders.keys`); placing and clearing stay here. Predicates are in the
query (``store/sql/order_rules.sql``), most overdue first, at most ``limit`` per run.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import orders as store
from inturn.worker.store.worklist import NewPlacement, place_many
from inturn.worker.worklist.pack import Pack
from inturn.worker.worklist.rules import Rule, RuleOutcome, RulePack
from inturn.worker.worklist.stale import clear_stale

#: The pack (``inturn sweep --only orders``) and the rule's group.
GROUP = "orders"
#: The worklist of unanswered orders.
QUEUE = "orders"
#: The reason code.
REASON = "unanswered-order"
#: Who places the items.
SWEEPER = "sweeper"


async def unanswered_order(conn: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
    """Place orders past their reply's due time; clear those answered since (see the module
    docstring)."""
    outcome = RuleOutcome()
    stale = await store.unanswered_stale(conn, limit=limit)
    outcome.already = await store.pending_count(conn)
    due = await store.unanswered_due(conn, limit=limit)
    if dry_run:
        outcome.placed, outcome.cleared = len(due), len(stale)
        return outcome
    cleared = await clear_stale(conn, stale, record_kind="order", queue=QUEUE, reason=REASON)
    outcome.cleared += cleared
    outcome.already -= cleared
    if not due:
        return outcome
    async with conn.transaction():
        placements = await place_many(
            conn,
            [
                NewPlacement(
                    queue=QUEUE,
                    record_kind="order",
                    record_key=str(r["id"]),
                    reason=REASON,
                    details={
                        "destination": r["destination"],
                        "controlId": r["control_id"],
                        "messageType": r["message_type"],
                        "orderKey": r["order_key"],
                        "replyChannel": r["reply_channel"],
                        "replyTypes": list(r["reply_types"]),
                        "deliveredAt": r["delivered_at"].isoformat(),
                        "dueAt": r["due_at"].isoformat(),
                        "overdueSeconds": round(r["overdue_seconds"]),
                    },
                    placed_by=SWEEPER,
                )
                for r in due
            ],
        )
        await store.mark_raised(conn, [r["id"] for r in due])
    for placement in placements:
        outcome.add(placement)
    return outcome


PACK: RulePack[None] = RulePack(
    name=GROUP,
    about="orders (spec.replies) whose reply did not arrive in time",
    rules=lambda _: (Rule(REASON, GROUP, unanswered_order),),
    settings=None,
)

#: This pack as an installation finds it (entry point ``inturn.packs``).
PLUGIN = Pack(name="orders", sweep=PACK, spec_fields=("replies",))
