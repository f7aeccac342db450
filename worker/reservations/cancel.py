"""Automatic cancellation of a booking whose ticketing deadline has passed.

Only when configured (``inturn sweep --auto-cancel``, chart value ``sweeper.reservations.
autoCancel``): a cancellation gives the seats back and tells the carriers, so a deployment has
to ask for it. One booking is cancelled in one transaction:

1. lock the booking row (``SELECT ... FOR UPDATE``) and check again that it is still open,
   still unticketed and still past its deadline, by database time: a ticket issued, a deadline
   extended or a cancellation made between the sweeper's query and this lock wins, and nothing
   is done;
2. withdraw every live segment (status XX, recorded in each segment's history) and mark the
   booking cancelled;
3. for each carrier of a withdrawn segment other than the host carriers, enqueue a
   cancellation notice (:mod:`.notice`) on the delivery queue of the Destination that serves
   that carrier (``spec.carriers``), each enqueue in a savepoint of its own. The database
   builds the notice from the booking record (:func:`inturn.worker.store.bookings.
   enqueue_cancel_notice`): the sweeper passes the locator and the carrier, never a payload,
   and its role may insert no delivery of its own, so a stolen sweeper DSN cannot put any
   other message into a queue;
4. place the booking on its owner's worklist: ``ticketing-expired`` (details say it was
   cancelled) and, if any carrier could not be told (no live Destination serves it, or the
   enqueue failed), ``cancel-not-delivered`` naming those carriers.

The local cancellation is never rolled back because a carrier could not be told: the
``cancel-not-delivered`` item is how a person finds out and tells it another way. Running it
again cancels nothing twice (the booking is already cancelled at step 1).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection

from inturn.worker.reservations.codes import (
    BOOKING_KIND,
    DEAD_STATES,
    SEGMENT_KIND,
    WITHDRAWN,
    office_queue,
    segment_key,
)
from inturn.worker.store import bookings as store
from inturn.worker.store.notify import wake
from inturn.worker.worklist import Placement, clear_where, place

#: Why an auto-cancelled booking was cancelled (``cancel_reason``, notice ZRB-3).
CANCEL_REASON = "ticketing-expired"
#: Who places the items of a cancellation.
PLACED_BY = "sweeper"


@dataclass
class Cancellation:
    """What one auto-cancel did.

    Attributes:
        locator: the booking.
        cancelled: False when the re-check under the lock found nothing to do (ticketed,
            already cancelled, deadline extended or booking gone); nothing else is set then.
        withdrawn: segment numbers withdrawn.
        told: ``{carrier: delivery item id}`` of the notices enqueued.
        not_told: ``{carrier: why}`` of the carriers that could not be told.
        placements: worklist items placed (announce the created ones after COMMIT).
    """

    locator: str
    cancelled: bool = False
    withdrawn: list[int] = field(default_factory=list)
    told: dict[str, int] = field(default_factory=dict)
    not_told: dict[str, str] = field(default_factory=dict)
    placements: list[Placement] = field(default_factory=list)


async def cancel_expired(
    conn: AsyncConnection[Any],
    locator: str,
    *,
    host_carriers: Collection[str] = (),
    at: datetime | None = None,
) -> Cancellation:
    """Cancel one booking past its ticketing deadline, if it still is (see the module doc).

    Args:
        host_carriers: carriers whose inventory is this system's own: their segments are
            withdrawn here and no notice is sent to them.
        at: the instant "past the deadline" is judged at; None (production) is database now.

    Returns:
        What was done; ``cancelled`` False when the re-check found nothing to do.

    Raises:
        psycopg.Error: the database failed; nothing of this booking changed.
    """
    out = Cancellation(locator)
    async with conn.transaction():
        locked = await store.lock_booking(conn, locator, at=at)
        if (
            locked is None
            or locked.ticketed
            or locked.cancelled_at is not None
            or not locked.expired
        ):
            return out
        withdrawn = await store.withdraw(conn, locator, withdrawn=WITHDRAWN, dead=DEAD_STATES)
        await store.mark_cancelled(conn, locator, CANCEL_REASON)
        cancelled = await store.get(conn, locator)
        assert cancelled is not None and cancelled.cancelled_at is not None
        out.cancelled = True
        out.withdrawn = [w.number for w in withdrawn]
        carriers = sorted({w.carrier for w in withdrawn} - set(host_carriers))
        served = await store.carrier_destinations(conn, carriers)
        woken: set[str] = set()
        for carrier in carriers:
            target = served.get(carrier)
            if target is None:
                out.not_told[carrier] = "no Destination serves it"
                continue
            try:
                async with conn.transaction():  # a savepoint: a failed enqueue undoes only itself
                    item_id, destination = await store.enqueue_cancel_notice(conn, locator, carrier)
            except psycopg.Error as exc:
                out.not_told[carrier] = (
                    f"enqueue on {target.destination} failed: {type(exc).__name__}"
                )
                continue
            out.told[carrier] = item_id
            woken.add(destination)
        await wake(conn, woken)  # delivered at COMMIT
        # Whatever was pending about its segments is moot now.
        await clear_where(
            conn,
            record_kind=SEGMENT_KIND,
            record_keys=[segment_key(locator, s.number) for s in cancelled.segments],
            note="booking cancelled",
        )
        await clear_where(
            conn,
            record_kind=BOOKING_KIND,
            record_keys=[locator],
            reason="ticketing-due",
            note="booking cancelled",
        )
        raised: dict[str, dict[str, Any]] = {
            "ticketing-expired": {
                "deadline": locked.ticketing_deadline.isoformat()
                if locked.ticketing_deadline
                else None,
                "cancelled": True,
                "withdrawn": out.withdrawn,
                "told": sorted(out.told),
            }
        }
        if out.not_told:
            raised["cancel-not-delivered"] = {
                "carriers": sorted(out.not_told),
                "why": out.not_told,
            }
        for reason, details in raised.items():
            placement = await place(
                conn,
                queue=office_queue(locked.owner),
                record_kind=BOOKING_KIND,
                record_key=locator,
                reason=reason,
                details=details,
                placed_by=PLACED_BY,
            )
            out.placements.append(placement)
    return out
