"""The destination registry (``inturn_destination``) and the operator's grouped status query.

Written by the operator (and ``inturn local``) for every Destination, read by ingest to route a
channel's messages. A deleted Destination is only *marked* deleted: its queued messages stay in
``inturn_delivery`` (they resume if it is applied again; the sweeper reports them meanwhile).
All functions take an open async connection and run in its current transaction (autocommit
connections commit each call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from inturn.worker.errors import Conflict
from inturn.worker.store import audit, notify
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("registry.sql")

#: How long a destination's head may wait before it counts as stuck, when its registration
#: does not say (seconds). The Destination API's default is the same value
#: (``inturn.worker.spec.config.DEFAULT_STUCK_AFTER_SECONDS``; a test holds them equal): the
#: store takes it as data and imports nothing of the API above it.
DEFAULT_STUCK_AFTER_SECONDS = 900


@dataclass(frozen=True)
class RegisteredDestination:
    """One row of the registry.

    Attributes:
        destination: ``namespace/name`` (the queue key).
        namespace, name: the Destination's.
        channel: the ingest channel feeding it.
        message_types: MSH-9 patterns it accepts (empty: all).
        generation: ``metadata.generation`` of the Destination when registered.
        suspended: ``spec.suspend``.
        deleted: the Destination is gone (the row is kept for the record).
        carriers: IATA airline designators it serves (``spec.carriers``), sorted.
        sender_kind: the key under ``spec.sender`` (``mllp``, ``http``), or None if unknown.
        sender: the sender's one-line, credential-free summary (``mllp://host:port``).
        stuck_after_seconds: how long its head may wait before the sweeper raises it
            (``spec.alerting.stuckAfterSeconds``).
        expire_after_seconds: pending messages older than this are skipped as expired by the
            sweeper (``spec.expireAfterSeconds``); None never expires them.
        schedule: its delivery window as the spec writes it (``spec.schedule``), or None.
        replies: the replies its orders expect, as the spec writes them (``spec.replies``).
        filter_fields: its conditions on HL7 fields, as the spec writes them
            (``spec.filter.fields``), or None.
        lanes: messages it may have in flight at once (``spec.lanes.count``; 1: one stream).
        pack_spec: the rule packs' other fields of its spec, by name, as the spec writes them
            (``replies`` and ``carriers`` are above), or None; ingest hands them to the packs'
            ingest hooks.
        profile: its receiver profile as the spec writes it (``spec.profile``), or None: what
            ``inturn queue show`` and the console apply to show a message as sent.
    """

    destination: str
    namespace: str
    name: str
    channel: str
    message_types: tuple[str, ...]
    generation: int
    suspended: bool
    deleted: bool = False
    carriers: tuple[str, ...] = ()
    sender_kind: str | None = None
    sender: str = ""
    stuck_after_seconds: int = DEFAULT_STUCK_AFTER_SECONDS
    expire_after_seconds: int | None = None
    schedule: dict[str, Any] | None = None
    replies: list[dict[str, Any]] | None = None
    filter_fields: list[dict[str, Any]] | None = None
    lanes: int = 1
    pack_spec: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None


class CarrierTaken(Conflict, ValueError):
    """A carrier is already served by another live Destination (at most one may serve it).

    Attributes:
        holders: ``{carrier: destination}`` of every carrier claimed by another destination.
    """

    def __init__(self, destination: str, holders: dict[str, str]) -> None:
        self.destination = destination
        self.holders = dict(holders)
        taken = ", ".join(f"{c} is already served by {d}" for c, d in sorted(holders.items()))
        super().__init__(f"spec.carriers: {taken}")


@dataclass(frozen=True)
class DestinationDepth:
    """Queue figures of one destination, for the Destination's status.

    Attributes:
        destination: ``namespace/name``.
        pending, failed: message counts.
        oldest: enqueue time of the oldest pending message, or None.
        max_attempts: most attempts on a pending message.
        head_attempts: attempts on the head (the oldest pending message by id).
        head_error: the head's ``last_error`` (``"<class>: <detail>"``), or None.
        lanes: its lanes as registered (``spec.lanes.count``).
        lane_view: what its lanes hold, as JSON (``LaneSummary.to_json`` of
            :mod:`inturn.worker.drain.lanes`), when the reader worked it out; else None.
    """

    destination: str
    pending: int
    failed: int
    oldest: datetime | None
    max_attempts: int
    head_attempts: int
    head_error: str | None
    lanes: int = 1
    lane_view: dict[str, Any] | None = None


def _row(r: Mapping[str, Any]) -> RegisteredDestination:
    return RegisteredDestination(
        destination=r["destination"],
        namespace=r["namespace"],
        name=r["name"],
        channel=r["channel"],
        message_types=tuple(r["message_types"] or ()),
        generation=int(r["generation"]),
        suspended=bool(r["suspended"]),
        deleted=bool(r["deleted"]),
        carriers=tuple(r["carriers"] or ()),
        sender_kind=r.get("sender_kind"),
        sender=str(r.get("sender") or ""),
        stuck_after_seconds=int(r["stuck_after_seconds"]),
        expire_after_seconds=(
            None if r["expire_after_seconds"] is None else int(r["expire_after_seconds"])
        ),
        schedule=r.get("schedule"),
        replies=r.get("replies"),
        filter_fields=r.get("filter_fields"),
        lanes=int(r.get("lanes") or 1),
        pack_spec=r.get("pack_spec"),
        profile=r.get("profile"),
    )


async def register(
    conn: AsyncConnection[Any],
    *,
    destination: str,
    namespace: str,
    name: str,
    channel: str,
    message_types: Sequence[str],
    generation: int,
    suspended: bool,
    carriers: Sequence[str] = (),
    sender_kind: str | None = None,
    sender: str = "",
    stuck_after_seconds: int = DEFAULT_STUCK_AFTER_SECONDS,
    expire_after_seconds: int | None = None,
    schedule: Mapping[str, Any] | None = None,
    replies: Sequence[Mapping[str, Any]] | None = None,
    filter_fields: Sequence[Mapping[str, Any]] | None = None,
    lanes: int = 1,
    pack_spec: Mapping[str, Any] | None = None,
    profile: Mapping[str, Any] | None = None,
) -> bool:
    """Insert or update a destination (and un-delete it) and its carriers, in one transaction.

    At most one live destination serves a carrier: claiming a carrier that another live
    destination holds fails and changes nothing (the claim is enforced by the carrier table's
    primary key, so two registrations racing for one carrier cannot both win). Idempotent.
    ``sender_kind`` (``mllp``, ``http``) lets ingest refuse what that kind can never send.

    ``sender`` is the credential-free sender summary shown by the console. ``filter_fields``
    is ``spec.filter.fields`` as the spec writes it (None or empty: none); ingest routes by it.
    ``lanes`` is ``spec.lanes.count`` (1 to 32). ``pack_spec``: the rule packs' other fields
    of the spec, by name (None or empty: none). ``profile``: ``spec.profile`` as written (None
    or empty: none).

    Returns:
        True when anything was written, False when it was already exactly so.

    Raises:
        CarrierTaken: another live destination serves one of ``carriers``; nothing changed.
        psycopg.Error: the database failed.
    """
    async with conn.transaction():
        row = await fetch_one(
            conn,
            Q["register"],
            {
                "destination": destination,
                "namespace": namespace,
                "name": name,
                "channel": channel,
                "message_types": list(message_types),
                "generation": generation,
                "suspended": suspended,
                "sender_kind": sender_kind,
                "sender": sender,
                "stuck_after_seconds": stuck_after_seconds,
                "expire_after_seconds": expire_after_seconds,
                "schedule": None if schedule is None else Jsonb(dict(schedule)),
                "replies": Jsonb([dict(r) for r in replies]) if replies else None,
                "filter_fields": (
                    Jsonb([dict(f) for f in filter_fields]) if filter_fields else None
                ),
                "lanes": lanes,
                "pack_spec": Jsonb(dict(pack_spec)) if pack_spec else None,
                "profile": Jsonb(dict(profile)) if profile else None,
            },
            row=dict_row,
        )
        written = row is not None
        released = await release_carriers(conn, destination, keep=carriers)
        params = {"destination": destination, "carriers": sorted(set(carriers))}
        claimed = await fetch_all(conn, Q["claim_carriers"], params, row=dict_row)
        holders = await carrier_holders(conn, destination, carriers)
        if holders:
            raise CarrierTaken(destination, holders)
    return written or bool(released) or bool(claimed)


async def release_carriers(
    conn: AsyncConnection[Any], destination: str, *, keep: Sequence[str]
) -> list[str]:
    """Release the carriers ``destination`` serves that are not in ``keep``; return them."""
    params = {"destination": destination, "carriers": sorted(set(keep))}
    return sorted(
        r["carrier"] for r in await fetch_all(conn, Q["release_carriers"], params, row=dict_row)
    )


async def carrier_holders(
    conn: AsyncConnection[Any], destination: str, carriers: Sequence[str]
) -> dict[str, str]:
    """Return ``{carrier: destination}`` for the carriers another destination serves."""
    params = {"destination": destination, "carriers": sorted(set(carriers))}
    rows = await fetch_all(conn, Q["carrier_holders"], params, row=dict_row)
    return {r["carrier"]: r["destination"] for r in rows}


async def mark_deleted(conn: AsyncConnection[Any], destination: str) -> bool:
    """Mark a destination deleted so that ingest stops routing to it. Its messages are kept;
    the carriers it served are released.

    Returns:
        True when the row was active and is now marked, False otherwise (idempotent).
    """
    row = await fetch_one(conn, Q["mark_deleted"], {"destination": destination}, row=dict_row)
    return row is not None


async def active_for_channel(
    conn: AsyncConnection[Any], channel: str
) -> list[RegisteredDestination]:
    """Return the channel's destinations not marked deleted, ordered by key (for routing)."""
    rows = await fetch_all(conn, Q["active_for_channel"], {"channel": channel}, row=dict_row)
    return [_row(r) for r in rows]


async def list_all(conn: AsyncConnection[Any]) -> list[RegisteredDestination]:
    """Return every row, deleted ones included, ordered by key."""
    return [_row(r) for r in await fetch_all(conn, Q["list_all"], row=dict_row)]


async def status_depth(conn: AsyncConnection[Any]) -> dict[str, DestinationDepth]:
    """Return the queue figures of every destination with something pending or failed.

    One grouped query for all destinations (a destination absent from the result has nothing
    pending or failed). Its cost grows with the pending and failed rows, not with the delivered
    ones only if the planner can skip those; see the module docstring of the queue for indexes.
    """
    rows = await fetch_all(conn, Q["status_depth"], row=class_row(DestinationDepth))
    return {r.destination: r for r in rows}


@dataclass(frozen=True)
class Hold:
    """A hold on a destination's delivery: since when, by whom, why."""

    at: datetime
    by: str | None
    why: str | None


@dataclass(frozen=True)
class Listed:
    """A registered destination as the console lists it.

    Attributes:
        destination: ``namespace/name``; channel: its ingest channel.
        sender: the credential-free sender summary; suspended: ``spec.suspend``.
        hold: the console's or CLI's hold, or None; deleted: the Destination is gone.
        stuck_after_seconds: how long its oldest message may wait before it counts as stuck
            (``spec.alerting.stuckAfterSeconds``; the sweeper's ``destination-stuck`` too).
        lanes: messages it may have in flight at once (``spec.lanes.count``).
    """

    destination: str
    channel: str
    sender: str
    suspended: bool
    hold: Hold | None
    deleted: bool
    stuck_after_seconds: int = DEFAULT_STUCK_AFTER_SECONDS
    lanes: int = 1


async def listed(conn: AsyncConnection[Any]) -> list[Listed]:
    """Every registered destination (deleted ones included) with its hold, ordered by key."""
    return [
        Listed(
            destination=r["destination"],
            channel=r["channel"],
            sender=r["sender"],
            suspended=bool(r["suspended"]),
            hold=Hold(r["held_at"], r["held_by"], r["held_why"]) if r["held_at"] else None,
            deleted=bool(r["deleted"]),
            stuck_after_seconds=int(r["stuck_after_seconds"]),
            lanes=int(r["lanes"]),
        )
        for r in await fetch_all(conn, Q["overview"], row=dict_row)
    ]


async def suspend(
    conn: AsyncConnection[Any], destination: str, *, who: str, why: str | None = None
) -> bool:
    """Put a hold on ``destination``: its worker sends nothing after the attempt in flight.

    Kept apart from ``spec.suspend`` (which the operator rewrites on every reconcile); a worker
    honours both. Audited as ``suspend``. Messages keep arriving and queueing.

    Returns:
        False when the destination is not registered (nothing changed, nothing audited).
    """
    async with conn.transaction():
        params = {"destination": destination, "who": who, "why": why}
        if await fetch_one(conn, Q["hold"], params, row=dict_row) is None:
            return False
        await audit.record(conn, who=who, action="suspend", destination=destination, why=why)
    return True


async def resume(
    conn: AsyncConnection[Any], destination: str, *, who: str, why: str | None = None
) -> bool:
    """Lift the hold on ``destination`` and wake its worker; audited as ``resume``.

    Returns:
        False when the destination is not registered.
    """
    async with conn.transaction():
        params = {"destination": destination}
        if await fetch_one(conn, Q["release"], params, row=dict_row) is None:
            return False
        await audit.record(conn, who=who, action="resume", destination=destination, why=why)
        await notify.wake(conn, [destination])
    return True


@dataclass(frozen=True)
class HoldState:
    """A registered destination's holds: ``held_at``/``held_by`` the person's (or a restore's)
    hold, None when not held; ``suspended`` its manifest's ``spec.suspend``."""

    held_at: datetime | None
    held_by: str | None
    suspended: bool


async def hold_state(conn: AsyncConnection[Any], destination: str) -> HoldState | None:
    """``destination``'s holds, its row locked until the transaction ends (None when it is not
    registered). Call inside a transaction, before :func:`suspend` or :func:`resume`."""
    row = await fetch_one(conn, Q["hold_state"], {"destination": destination}, row=dict_row)
    if row is None:
        return None
    return HoldState(row["held_at"], row["held_by"], bool(row["suspended"]))


async def held(conn: AsyncConnection[Any], destination: str) -> bool:
    """Whether ``destination``'s delivery is held (False when it is not registered)."""
    row = await fetch_one(conn, Q["held"], {"destination": destination}, row=dict_row)
    return bool(row and row["held"])
