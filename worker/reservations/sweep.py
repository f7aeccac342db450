"""The sweeper's reservation rules: work that appears because time passed.

A partner that answers puts work on a worklist by answering (:func:`~.bookings.apply_status`);
a partner that never answers, or a ticketing deadline that passes, puts work on no worklist
unless something notices. These rules do, run by ``inturn sweep`` (group ``reservations``):

* ``unanswered``: a segment still in a request state (HN, NN, PN) longer than
  ``pending_after`` (default 6 h) since it was requested; record ``segment`` ``ABC123/1``.
* ``ticketing-due``: an open, unticketed booking whose ticketing deadline is within
  ``ticketing_lead`` (default 24 h) and not yet passed; record ``booking`` ``ABC123``.
* ``ticketing-expired``: the same past its deadline; with ``auto_cancel`` the booking is also
  cancelled (:mod:`.cancel`).

Each is level-triggered and idempotent: its due-date predicate is in its SQL (database time),
most overdue first, at most ``limit`` records per run; a record that already has an item for
the same trigger (pending, or cleared since that request or deadline) is not selected, so it
neither uses up the limit nor comes back to whoever cleared it. Items whose condition no longer
holds (answered, ticketed, cancelled, deadline moved) are cleared by ``system`` with a note.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.reservations.cancel import cancel_expired
from inturn.worker.reservations.codes import (
    BOOKING_KIND,
    REQUEST_STATES,
    SEGMENT_KIND,
    office_queue,
    segment_key,
)
from inturn.worker.reservations.fields import CARRIER_PATTERN, CARRIERS
from inturn.worker.store import bookings as store
from inturn.worker.store import reservation_rules as rules_store
from inturn.worker.worklist import (
    PackOption,
    Placement,
    Rule,
    RuleOutcome,
    RulePack,
    clear_where,
    place,
)
from inturn.worker.worklist.pack import Pack

log = logging.getLogger("inturn.reservations.sweep")

#: How long a requested segment may go unanswered before it is work (seconds): 6 h.
DEFAULT_PENDING_AFTER = 6 * 3600
#: How far ahead of a ticketing deadline it is raised (seconds): 24 h.
DEFAULT_TICKETING_LEAD = 24 * 3600
#: Who places the sweeper's items.
PLACED_BY = "sweeper"
#: The group of these rules (``inturn sweep --only reservations``).
GROUP = "reservations"


@dataclass(frozen=True)
class ReservationSettings:
    """The reservation rules' settings (flags of ``inturn sweep``, values of the chart).

    Attributes:
        pending_after: seconds a request may go unanswered (``--pending-after``).
        ticketing_lead: seconds before a deadline it is raised (``--ticketing-lead``).
        auto_cancel: cancel bookings past their deadline (``--auto-cancel``); off by default.
        host_carriers: carriers whose inventory is this system's own: withdrawn without a
            notice (``--host-carrier``, repeatable).
    """

    pending_after: int = DEFAULT_PENDING_AFTER
    ticketing_lead: int = DEFAULT_TICKETING_LEAD
    auto_cancel: bool = False
    host_carriers: tuple[str, ...] = ()


async def _already(conn: AsyncConnection[Any], record_kind: str, reason: str) -> int:
    return await rules_store.pending_count(conn, record_kind=record_kind, reason=reason)


async def unanswered(
    conn: AsyncConnection[Any],
    *,
    limit: int,
    dry_run: bool = False,
    pending_after: int = DEFAULT_PENDING_AFTER,
    at: datetime | None = None,
) -> RuleOutcome:
    """Place segments whose request has gone unanswered longer than ``pending_after`` seconds.

    Each candidate is re-checked under the booking and segment locks that a reply takes too,
    so a reply that commits first means no item, and a reply that commits after clears it.

    Args:
        at: the instant judged at; None (production) is database now.
    """
    out = RuleOutcome()
    stale = await rules_store.unanswered_stale(conn)
    if dry_run:
        out.cleared = len(stale)
    elif stale:
        cleared = await clear_where(
            conn,
            record_kind=SEGMENT_KIND,
            record_keys=stale,
            reason="unanswered",
            note="no longer waiting for a reply",
        )
        out.cleared = len(cleared)
    out.already = await _already(conn, SEGMENT_KIND, "unanswered")
    due = await rules_store.unanswered_due(conn, pending_after=pending_after, limit=limit, at=at)
    if dry_run:
        out.placed = len(due)
        return out
    for row in due:
        async with conn.transaction():
            locked = await store.lock_segment(conn, row["locator"], row["number"])
            if (
                locked is None
                or locked.cancelled_at is not None
                or locked.status not in REQUEST_STATES
            ):
                continue  # answered or cancelled since the query
            placement = await place(
                conn,
                queue=office_queue(locked.owner),
                record_kind=SEGMENT_KIND,
                record_key=segment_key(row["locator"], row["number"]),
                reason="unanswered",
                details={
                    "carrier": row["carrier"],
                    "flight": row["flight"],
                    "status": locked.status,
                    "requestedAt": row["requested"].isoformat(),
                },
                placed_by=PLACED_BY,
            )
        out.add(placement)
    return out


async def _clear_ticketing(
    conn: AsyncConnection[Any],
    reason: str,
    *,
    lead: int,
    dry_run: bool,
    at: datetime | None,
) -> int:
    rows = [
        r
        for r in await rules_store.ticketing_stale(conn, lead=lead, at=at)
        if r["reason"] == reason
    ]
    if dry_run:
        return len(rows)
    cleared = 0
    for row in rows:
        cleared += len(
            await clear_where(
                conn,
                record_kind=BOOKING_KIND,
                record_keys=[row["record_key"]],
                reason=reason,
                note=row["why"],
            )
        )
    return cleared


async def _ticketing_turn(
    conn: AsyncConnection[Any],
    reason: str,
    due: list[dict[str, Any]],
    *,
    lead: int,
    dry_run: bool,
    at: datetime | None,
) -> tuple[RuleOutcome, list[dict[str, Any]]]:
    """What both ticketing rules do first: clear their items that no longer hold, count those
    still pending; then the due bookings to place (none in a dry run, which only counts)."""
    out = RuleOutcome()
    out.cleared = await _clear_ticketing(conn, reason, lead=lead, dry_run=dry_run, at=at)
    out.already = await _already(conn, BOOKING_KIND, reason)
    if dry_run:
        out.placed = len(due)
        return out, []
    return out, due


async def _place_booking(
    conn: AsyncConnection[Any], row: dict[str, Any], reason: str, **details: Any
) -> Placement:
    """Place the booking of ``row`` on its office's worklist for ``reason``."""
    return await place(
        conn,
        queue=office_queue(row["owner"]),
        record_kind=BOOKING_KIND,
        record_key=row["locator"],
        reason=reason,
        details={"deadline": row["ticketing_deadline"].isoformat(), **details},
        placed_by=PLACED_BY,
    )


async def ticketing_due(
    conn: AsyncConnection[Any],
    *,
    limit: int,
    dry_run: bool = False,
    ticketing_lead: int = DEFAULT_TICKETING_LEAD,
    at: datetime | None = None,
) -> RuleOutcome:
    """Place open bookings whose ticketing deadline is within ``ticketing_lead`` seconds."""
    due = await rules_store.ticketing_due(conn, lead=ticketing_lead, limit=limit, at=at)
    out, due = await _ticketing_turn(
        conn, "ticketing-due", due, lead=ticketing_lead, dry_run=dry_run, at=at
    )
    for row in due:
        out.add(await _place_booking(conn, row, "ticketing-due"))
    return out


async def ticketing_expired(
    conn: AsyncConnection[Any],
    *,
    limit: int,
    dry_run: bool = False,
    ticketing_lead: int = DEFAULT_TICKETING_LEAD,
    auto_cancel: bool = False,
    host_carriers: Collection[str] = (),
    at: datetime | None = None,
) -> RuleOutcome:
    """Place open bookings past their ticketing deadline; with ``auto_cancel``, cancel them.

    A cancellation re-checks the booking under its row lock (a ticket issued meanwhile wins)
    and reports the carriers it could not tell on ``cancel-not-delivered``.
    """
    due = await rules_store.ticketing_expired(conn, limit=limit, at=at)
    out, due = await _ticketing_turn(
        conn, "ticketing-expired", due, lead=ticketing_lead, dry_run=dry_run, at=at
    )
    for row in due:
        if not auto_cancel:
            out.add(await _place_booking(conn, row, "ticketing-expired", cancelled=False))
            continue
        done = await cancel_expired(conn, row["locator"], host_carriers=host_carriers, at=at)
        if done.cancelled:
            log.info(
                "booking %s cancelled (ticketing deadline passed): segments %s withdrawn,"
                " carriers told %s, not told %s",
                row["locator"],
                done.withdrawn,
                sorted(done.told) or "-",
                sorted(done.not_told) or "-",
            )
        for placement in done.placements:
            out.add(placement)
    return out


# --- the pack as ``inturn sweep --only reservations`` runs it ----------------------------------

_CARRIER = re.compile(CARRIER_PATTERN)


def _carriers(values: tuple[str, ...]) -> tuple[str, ...]:
    """Upper-cased, sorted, without repeats.

    Raises:
        ValueError: a value that is not an IATA airline designator.
    """
    out = tuple(sorted({v.upper() for v in values}))
    bad = [c for c in out if not _CARRIER.match(c)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not an IATA airline designator")
    return out


def _rules(settings: ReservationSettings) -> tuple[Rule, ...]:
    return (
        Rule("unanswered", GROUP, partial(unanswered, pending_after=settings.pending_after)),
        Rule(
            "ticketing-due", GROUP, partial(ticketing_due, ticketing_lead=settings.ticketing_lead)
        ),
        Rule(
            "ticketing-expired",
            GROUP,
            partial(
                ticketing_expired,
                ticketing_lead=settings.ticketing_lead,
                auto_cancel=settings.auto_cancel,
                host_carriers=settings.host_carriers,
            ),
        ),
    )


#: The reservation rules, run when ``inturn sweep --only reservations`` names them (the chart:
#: ``sweeper.only``); their options are shown by ``inturn sweep --only reservations --help``
#: and read from ``INTURN_SWEEP_*`` (the chart sets those from ``sweeper.reservations``).
PACK = RulePack(
    name=GROUP,
    about="unanswered reservation requests and ticketing deadlines",
    rules=_rules,
    settings=ReservationSettings(),
    options=(
        PackOption(
            field="pending_after",
            flag="--pending-after",
            kind="duration",
            default="6h",
            envvar="INTURN_SWEEP_PENDING_AFTER",
            help="Raise a segment requested this long ago and still unanswered.",
        ),
        PackOption(
            field="ticketing_lead",
            flag="--ticketing-lead",
            kind="duration",
            default="24h",
            envvar="INTURN_SWEEP_TICKETING_LEAD",
            help="Raise an unticketed booking this long before its ticketing deadline.",
        ),
        PackOption(
            field="auto_cancel",
            flag="--auto-cancel",
            kind="switch",
            default=False,
            envvar="INTURN_SWEEP_AUTO_CANCEL",
            help="Cancel bookings past their ticketing deadline and tell the carriers.",
        ),
        PackOption(
            field="host_carriers",
            flag="--host-carrier",
            kind="many",
            default=(),
            envvar="INTURN_SWEEP_HOST_CARRIERS",
            check=_carriers,
            help="A carrier whose inventory is our own: no cancellation notice (repeatable).",
        ),
    ),
    default=False,
)

#: This pack as an installation finds it (entry point ``inturn.packs``).
PLUGIN = Pack(
    name=GROUP,
    sweep=PACK,
    commands={"bookings": "inturn.worker.cli.reservations:bookings_group"},
    requires=("airportsdata",),
    extra="reservations",
    spec_fields=(CARRIERS,),
)
