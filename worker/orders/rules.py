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
reply (:mod:`inturn.worker.orders.keys`, this pack's hooks); placing and clearing stay here.
Predicates are in the query (``store/sql/order_rules.sql``), most overdue first, at most
``limit`` per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.orders.fields import REPLIES
from inturn.worker.orders.keys import answerers, marker
from inturn.worker.store import orders as store
from inturn.worker.worklist.pack import Pack
from inturn.worker.worklist.rules import Rule, RuleOutcome, RulePack
from inturn.worker.worklist.stale import RuleWorklist

#: The pack (``inturn sweep --only orders``) and the rule's group.
GROUP = "orders"
#: The rule's worklist: unanswered orders on ``orders``, reason ``unanswered-order``.
UNANSWERED = RuleWorklist(queue="orders", record_kind="order", reason="unanswered-order")
#: The reason code.
REASON = UNANSWERED.reason


def _unanswered_item(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return str(r["id"]), {
        "destination": r["destination"],
        "controlId": r["control_id"],
        "messageType": r["message_type"],
        # empty with payload keys: the order number stays in the sealed message (the item
        # names the delivered message, whose payload a person opens with the keys)
        "orderKey": r["order_key"] or None,
        "deliveryId": r["delivery_id"],
        "replyChannel": r["reply_channel"],
        "replyTypes": list(r["reply_types"]),
        "deliveredAt": r["delivered_at"].isoformat(),
        "dueAt": r["due_at"].isoformat(),
        "overdueSeconds": round(r["overdue_seconds"]),
    }


async def unanswered_order(conn: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
    """Place orders past their reply's due time; clear those answered since (see the module
    docstring). Placing an order marks its expectation raised, in the same transaction."""
    stale = await store.unanswered_stale(conn, limit=limit)
    pending = await store.pending_count(conn)
    due = await store.unanswered_due(conn, limit=limit)

    async def raised(rows: Sequence[dict[str, Any]]) -> None:
        await store.mark_raised(conn, [r["id"] for r in rows])

    return await UNANSWERED.place_and_clear(
        conn,
        dry_run=dry_run,
        stale=stale,
        pending=pending,
        due=due,
        item=_unanswered_item,
        then=raised,
    )


PACK: RulePack[None] = RulePack(
    name=GROUP,
    about="orders (spec.replies) whose reply did not arrive in time",
    rules=lambda _: (Rule(REASON, GROUP, unanswered_order),),
    settings=None,
)

#: This pack as an installation finds it (entry point ``inturn.packs``).
PLUGIN = Pack(name="orders", sweep=PACK, spec_fields=(REPLIES,), ingest=answerers, mark=marker)
