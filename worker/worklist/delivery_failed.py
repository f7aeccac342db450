"""Giving up on a message and placing it on ``delivery-failed``, as one transaction.

Nothing can be failed without its work item, and no work item exists for a message that was
not failed: the failed mark and the placement commit together or not at all.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import delivery
from inturn.worker.store.lease import Lease
from inturn.worker.store.model import Sendable
from inturn.worker.store.worklist import place
from inturn.worker.store.worklist_model import Placement

#: The queue given-up messages are placed on.
QUEUE = "delivery-failed"
#: The record kind of a delivery item (the key is its id).
RECORD_KIND = "delivery"
#: Outcomes of inturn's own refusal of a message (no receiver's text in them, the value a
#: profile met withheld under payload keys): their work item names the refusal (``cause``),
#: since the message can go only once the profile, the sender or the message is changed.
NAMED_REFUSALS = frozenset({"profile", "unsendable"})


def failure_reason(outcome: str, exhausted: bool) -> str:
    """The reason code of a give-up: ``attempts-exhausted`` when the attempt budget ran out,
    else the outcome that the destination's policy fails on at once, as a lowercase code
    (``AR`` -> ``ack-ar``, ``invalidAck`` -> ``invalid-ack``)."""
    if exhausted:
        return "attempts-exhausted"
    if outcome in ("AE", "AR", "CE", "CR"):
        return "ack-" + outcome.lower()
    return re.sub(r"(?<!^)(?=[A-Z])", "-", outcome).lower()


async def give_up(
    conn: AsyncConnection[Any],
    item: Sendable,
    *,
    attempts: int,
    cause: str,
    outcome: str,
    exhausted: bool,
    lease: Lease,
    placed_by: str = "worker",
) -> Placement | None:
    """Mark ``item`` failed and place it on ``delivery-failed``, in one transaction.

    Args:
        attempts: attempts made, this one included.
        cause: the failure's description, stored as ``last_error`` (never a payload); for
            the outcomes of :data:`NAMED_REFUSALS` it is in the work item's details too
            (``cause``: e.g. ``profile: PID-5 'Ł': (U+0141) has no place in ISO-8859-1``).
        outcome: the sender's outcome class (``AR``, ``timeout``, ``profile``...).
        exhausted: whether the attempt budget ran out (else the policy failed it at once).
        lease: the worker's lease of the item's destination: the failed mark is guarded by it.

    Returns:
        The placement (announce it after this returns), or None when the item was no longer
        pending (skipped or erased during the attempt): then nothing changed.

    Raises:
        inturn.worker.store.lease.LeaseLost: another holder took the destination over; the
            transaction is rolled back and nothing changed.
    """
    async with conn.transaction():
        if not await delivery.gave_up(conn, item.id, attempts, cause, lease=lease):
            return None
        return await place(
            conn,
            queue=QUEUE,
            record_kind=RECORD_KIND,
            record_key=str(item.id),
            reason=failure_reason(outcome, exhausted),
            details={
                "destination": item.destination,
                "channel": item.channel,
                "controlId": item.control_id,
                "messageType": item.message_type,
                "attempts": attempts,
                "outcome": outcome,
                **({"cause": cause} if outcome in NAMED_REFUSALS else {}),
            },
            placed_by=placed_by,
        )
