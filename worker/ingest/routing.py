"""Routing: which destinations of a channel take a message, from a cached copy of the registry.

The registry is the ``inturn_destination`` table (written by the operator, or by ``inturn
local``). :class:`Router` keeps an immutable :class:`RouteTable` snapshot in memory and
replaces it every few seconds, so a message never waits on a registry query and a change in the
registry (a destination added, deleted, re-filtered or moved to another channel) is picked up
within one refresh interval without a restart.

Filters (``spec.filter.messageTypes``) are patterns on ``MSH-9.1^MSH-9.2`` such as ``ADT^A0*``:

* ``*`` matches any run of characters (including none), ``?`` exactly one character; every
  other character, ``[`` and ``]`` included, stands for itself; matching is case-sensitive and
  covers the whole key;
* the key is ``CODE^TRIGGER`` (``^`` whatever the message's component separator is), or just
  ``CODE`` when MSH-9.2 is empty; for such a message a pattern also matches if it matches
  ``CODE^`` so that ``ACK^*`` takes every ACK, with or without a trigger;
* an empty list of patterns takes every message type.

Field conditions (``spec.filter.fields``, :mod:`inturn.worker.hl7.filter`) test HL7 fields
such as ``MSH-4`` or ``PV1-3``: a destination takes a message when its type passes and every
condition holds. The message is split into fields only when a destination of its channel whose
type filter passed has conditions, and once for all of them. Routing a message on a channel
whose destinations read fields runs in a worker thread (:func:`route_message`), never on the
event loop that every channel shares: reading a 16 MiB message's fields and matching its values
cost a fraction of a second of CPU, which inline would hold every other channel's ACK that long.

A suspended destination still receives: suspension only stops its worker from sending.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from psycopg_pool import AsyncConnectionPool

from inturn.worker.hl7.filter import (
    FieldCondition,
    FieldRef,
    MessageFields,
    conditions_of,
    holds,
)
from inturn.worker.hl7.types import type_matches
from inturn.worker.operations import packs
from inturn.worker.spec.replies import ReplyRule, rules_of
from inturn.worker.spec.replies import to_spec as reply_spec
from inturn.worker.store import ingest as ingest_store
from inturn.worker.store.periodic import Periodic
from inturn.worker.worklist.hooks import Answerer, Registered

log = logging.getLogger("inturn.ingest.routing")

#: Seconds between two reads of the registry, by default.
DEFAULT_REFRESH_SECONDS = 2.0

#: Namespace of the destinations that hold unrouted messages (``_unrouted/<channel>``). The
#: underscore makes it an invalid Kubernetes namespace, so no real Destination can collide.
HOLD_NAMESPACE = "_unrouted"


def hold_destination(channel: str) -> str:
    """The destination that holds ``channel``'s unrouted messages: ``_unrouted/<channel>``.

    No worker drains it. Its items stay pending (visible in listings, depth and the sweeper's
    orphaned-queue check) until someone resends, moves or erases them.
    """
    return f"{HOLD_NAMESPACE}/{channel}"


#: Routing decisions a table keeps (by channel and message type, where no filter reads fields).
MAX_DECISIONS = 4096

#: Longest channel name, in characters (it is part of the duplicate window's unique index).
MAX_CHANNEL_CHARS = 128


def check_channel(channel: str) -> str:
    """Return ``channel`` if it is usable as a channel name (also in a URL path).

    Raises:
        ValueError: empty, longer than :data:`MAX_CHANNEL_CHARS`, or contains ``/``,
            whitespace or control characters.
    """
    if len(channel) > MAX_CHANNEL_CHARS:
        raise ValueError(f"channel name longer than {MAX_CHANNEL_CHARS} characters")
    if not channel or any(ch == "/" or ch.isspace() or ord(ch) < 0x20 for ch in channel):
        raise ValueError(f"invalid channel name {channel!r}")
    return channel


@dataclass(frozen=True)
class Route:
    """One destination as the registry lists it.

    Attributes:
        destination: ``namespace/name``.
        channel: the ingest channel it takes messages from.
        message_types: its filter patterns; empty takes every type.
        field_conditions: its conditions on HL7 fields (``spec.filter.fields``), all of which
            must hold; empty: none.
        suspended: its worker does not send; it still receives.
        sender_kind: ``mllp``, ``http``, ... (None when the registry does not say).
        replies: the replies its orders expect (``spec.replies``).
        pack_spec: the rule packs' other fields of its spec, by name (the registry's
            ``pack_spec``), for their ingest hooks.
    """

    destination: str
    channel: str
    message_types: tuple[str, ...] = ()
    suspended: bool = False
    sender_kind: str | None = None
    replies: tuple[ReplyRule, ...] = ()
    field_conditions: tuple[FieldCondition, ...] = ()
    pack_spec: Mapping[str, Any] = field(default_factory=dict, hash=False)


RouteReason = Literal["routed", "no_destinations", "filtered"]


@dataclass(frozen=True)
class RouteDecision:
    """Where one message goes.

    Attributes:
        destinations: sorted ``namespace/name`` values; empty when nothing takes it.
        reason: ``routed``; ``no_destinations`` (the channel has none at all); ``filtered``
            (it has some, but no filter takes this message: its type, or a field condition).
        kinds: ``{destination: sender kind}`` of the chosen destinations whose kind is known.
    """

    destinations: tuple[str, ...]
    reason: RouteReason
    kinds: Mapping[str, str] = field(default_factory=dict)


class RouteTable:
    """An immutable snapshot of the registry, indexed by channel."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        by_channel: dict[str, list[Route]] = {}
        routes_list = list(routes)
        for route in routes_list:
            by_channel.setdefault(route.channel, []).append(route)
        # the packs' ingest hooks, once per table: most channels have none
        self._answerers = packs.answerers([_registered(r) for r in routes_list])
        self._by_channel = {
            channel: tuple(sorted(found, key=lambda r: r.destination))
            for channel, found in by_channel.items()
        }
        self._reads_fields = frozenset(
            channel
            for channel, found in by_channel.items()
            if any(r.field_conditions for r in found)
        )
        # decisions by (channel, code, trigger) where no destination reads fields: the table is
        # a snapshot, so one stays right; a channel of 200 destinations decides once a type
        self._decided: dict[tuple[str, str, str], RouteDecision] = {}

    def __len__(self) -> int:
        return sum(len(routes) for routes in self._by_channel.values())

    def channels(self) -> list[str]:
        """The channels that have at least one destination, sorted."""
        return sorted(self._by_channel)

    def answerers(self, channel: str) -> tuple[Answerer, ...]:
        """What the rule packs compute for a message of ``channel`` before it is stored
        (:func:`inturn.worker.operations.packs.answerers`: the orders pack's reply keys); empty
        for most channels: then nothing is computed."""
        return self._answerers.get(channel, ())

    def reads_fields(self, channel: str) -> bool:
        """Whether routing a message of ``channel`` may read its fields (a destination of it has
        ``spec.filter.fields``): work linear in the message, done off the event loop."""
        return channel in self._reads_fields

    def routes(self, channel: str) -> tuple[Route, ...]:
        """The destinations of ``channel`` (sorted by name; empty for an unknown channel)."""
        return self._by_channel.get(channel, ())

    def route(
        self, channel: str, code: str, trigger: str, payload: bytes | None = None
    ) -> RouteDecision:
        """Decide the destinations of a message of type ``code^trigger`` on ``channel``.

        Args:
            payload: the message, read only when a destination has field conditions; None
                reads as a message without fields (only ``NotIn``, ``NotMatches`` and
                ``DoesNotExist`` hold then).
        """
        routes = self._by_channel.get(channel)
        if not routes:
            return RouteDecision((), "no_destinations")
        key = (channel, code, trigger)
        known = self._decided.get(key)
        if known is not None:
            return known
        fields: MessageFields | None = None
        matching = []
        for r in routes:
            if not type_matches(r.message_types, code, trigger):
                continue
            if r.field_conditions:
                if fields is None:
                    fields = MessageFields(payload or b"")
                if not holds(r.field_conditions, fields):
                    continue
            matching.append(r)
        chosen = tuple(r.destination for r in matching)
        kinds = {r.destination: r.sender_kind for r in matching if r.sender_kind}
        decision = RouteDecision(chosen, "routed" if chosen else "filtered", kinds)
        if channel not in self._reads_fields:
            if len(self._decided) >= MAX_DECISIONS:
                self._decided.clear()
            self._decided[key] = decision
        return decision


async def route_message(
    table: RouteTable, channel: str, code: str, trigger: str, payload: bytes
) -> RouteDecision:
    """:meth:`RouteTable.route`, in a worker thread when the channel's destinations read fields
    (:meth:`RouteTable.reads_fields`), else inline (a type filter is a few pattern tests).

    Reading fields costs time linear in the message (up to ingest's frame bound) and matching
    costs up to :data:`inturn.worker.hl7.filter.MAX_MATCH_BUDGET`; in a thread that time is not
    the event loop's, so the other channels' messages are read, stored and answered meanwhile
    (the interpreter hands its lock to the loop at least every switch interval, 5 ms by
    default). ``bench/filters.py`` measures the loop's lag both ways.
    """
    if table.reads_fields(channel):
        return await asyncio.to_thread(table.route, channel, code, trigger, payload)
    return table.route(channel, code, trigger, payload)


def _registered(route: Route) -> Registered:
    """``route`` as the packs' ingest hooks see it: the pack fields the registry keeps."""
    spec = dict(route.pack_spec)
    if route.replies:
        spec["replies"] = [reply_spec(r) for r in route.replies]
    return Registered(route.destination, route.channel, spec)


def _row_route(row: Mapping[str, Any]) -> Route:
    return Route(
        destination=str(row["destination"]),
        channel=str(row["channel"]),
        message_types=tuple(str(p) for p in (row["message_types"] or ())),
        suspended=bool(row["suspended"]),
        sender_kind=row.get("sender_kind"),
        replies=_replies(row),
        field_conditions=_conditions(row),
        pack_spec=row.get("pack_spec") or {},
    )


def _conditions(row: Mapping[str, Any]) -> tuple[FieldCondition, ...]:
    """The registered ``spec.filter.fields`` (checked when registered). An unreadable one is
    logged and the destination takes nothing (a filter that cannot be read must not widen
    into "everything"), so that one bad row never stops routing for the others."""
    try:
        return conditions_of(row.get("filter_fields"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("destination %s: spec.filter.fields unreadable (%s)", row["destination"], exc)
        return (_NOTHING,)


def _replies(row: Mapping[str, Any]) -> tuple[ReplyRule, ...]:
    """The registered ``spec.replies`` (checked when registered); unreadable ones are logged
    and ignored, so that one bad row never stops routing."""
    try:
        return rules_of(row.get("replies"))
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("destination %s: spec.replies unreadable (%s)", row["destination"], exc)
        return ()


#: The condition of a destination whose registered field filter cannot be read: it holds for
#: no message (``In`` with no values: no value equals one of none).
_NOTHING = FieldCondition("MSH-3", FieldRef("MSH", 3), "In", ())


class Router:
    """The routing table of a running ingest, refreshed from the registry in the background.

    Args:
        pool: a connection pool (autocommit connections) to read the registry from.
        refresh_seconds: seconds between reads (> 0).

    :meth:`refresh` must succeed once before :attr:`table` is meaningful (``Ingest.start``
    does this). A failed refresh keeps the previous table and is retried at the next interval.
    """

    def __init__(
        self, pool: AsyncConnectionPool, refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    ) -> None:
        if refresh_seconds <= 0:
            raise ValueError("refresh_seconds must be positive")
        self._pool = pool
        self.refresh_seconds = refresh_seconds
        self.table = RouteTable()
        #: ``time.monotonic()`` of the last successful refresh, or None before the first.
        self.refreshed_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        #: The refresh as a periodic statement: a refusal keeps the last table, is said once
        #: when it begins and once when it ends (:mod:`inturn.worker.store.periodic`).
        self.periodic = Periodic(
            log,
            "routing: reading the destination registry (the last table is kept)",
            refresh_seconds,
            partial(self.refresh, timeout=max(refresh_seconds, 5.0)),
        )

    async def refresh(self, timeout: float = 10.0) -> RouteTable:
        """Read the registry now and replace the table.

        Raises:
            psycopg.Error, psycopg_pool.PoolTimeout: the registry could not be read; the
                previous table stays in place.
        """
        async with self._pool.connection(timeout=timeout) as conn:
            rows = await ingest_store.routes(conn)
        table = RouteTable(_row_route(row) for row in rows)
        self.table = table
        self.refreshed_at = time.monotonic()
        return table

    def age(self) -> float | None:
        """Seconds since the last successful refresh (None before the first)."""
        return None if self.refreshed_at is None else time.monotonic() - self.refreshed_at

    def start(self) -> None:
        """Start refreshing every :attr:`refresh_seconds` in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="inturn-ingest-routes")

    async def stop(self) -> None:
        """Stop the background refresh (and forget its refusal, if one held)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.periodic.condition.forget()

    async def _loop(self) -> None:
        await self.periodic.forever()
