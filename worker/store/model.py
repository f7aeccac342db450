"""Plain data the store returns and takes: queue items, depth rows, new items to enqueue, the
replies a delivered order expects, booking records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, date, datetime
from typing import Any, Literal, Protocol

from inturn.worker.spec.schedule import held_until

State = Literal["pending", "delivered", "failed", "skipped"]
STATES: tuple[State, ...] = ("pending", "delivered", "failed", "skipped")
FINISHED_STATES: tuple[State, ...] = ("delivered", "failed", "skipped")


@dataclass(frozen=True)
class NewItem:
    """One message for one destination, to enqueue.

    Attributes:
        destination: ``namespace/name``.
        channel: the ingest channel it arrived on.
        control_id: MSH-10.
        message_type: MSH-9 as ``CODE^TRIGGER`` (e.g. ``ADT^A01``).
        payload: the bytes exactly as received.
    """

    destination: str
    channel: str
    control_id: str
    message_type: str
    payload: bytes


@dataclass(frozen=True)
class Sendable:
    """What a send and its marks need of a queued item: the head as the drain loop reads it
    (once per message, so no column more than these; :class:`Item` is the whole row).

    Attributes:
        id: the row id (enqueue order); channel: the ingest channel it arrived on;
        destination: ``namespace/name``; control_id: MSH-10; message_type: ``CODE^TRIGGER``;
        attempts: failed attempts so far.
    """

    id: int
    channel: str
    destination: str
    control_id: str
    message_type: str
    attempts: int


@dataclass(frozen=True)
class Item(Sendable):
    """One queued delivery, without its payload (listings never carry payloads).

    Times are timezone-aware UTC datetimes; ``size`` is in bytes.
    """

    size: int
    state: State
    enqueued_at: datetime
    next_attempt: datetime
    last_attempt: datetime | None
    last_error: str | None
    reason: str | None
    decided_by: str | None
    finished_at: datetime | None
    #: The copy a resend queued for this item, or None (never resent).
    resent_as: int | None = None
    #: The item this one is a resent copy of, or None.
    resent_from: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Item:
        """Build an item from a row read by column name (extra columns, e.g. ``payload``, are
        ignored; the resend links may be absent and are then None).

        Raises:
            KeyError: a column of the item is missing from ``row``.
        """
        wanted = _row_fields(cls)
        return cls(**{name: row[name] for name, required in wanted if required or name in row})

    def age_seconds(self, now: datetime) -> float:
        """Seconds the item has been (or was, until finished) waiting, as of ``now``."""
        end = self.finished_at or now
        return max(0.0, (end - self.enqueued_at).total_seconds())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (camelCase keys, ISO 8601 times); never a payload."""

        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "id": self.id,
            "channel": self.channel,
            "destination": self.destination,
            "controlId": self.control_id,
            "messageType": self.message_type,
            "size": self.size,
            "state": self.state,
            "attempts": self.attempts,
            "enqueuedAt": iso(self.enqueued_at),
            "nextAttempt": iso(self.next_attempt),
            "lastAttempt": iso(self.last_attempt),
            "lastError": self.last_error,
            "reason": self.reason,
            "decidedBy": self.decided_by,
            "finishedAt": iso(self.finished_at),
            "resentAs": self.resent_as,
            "resentFrom": self.resent_from,
        }


@dataclass(frozen=True)
class Head:
    """The head of a destination's queue, ready to send now: the item and its payload.

    ``traceparent`` is the W3C trace context ingest stored with the message when it traced it
    (:mod:`inturn.worker.tracing`), else None.
    """

    item: Sendable
    payload: bytes
    traceparent: str | None = None
    #: The row's ``patient_keys`` (its lane keys, see :mod:`inturn.worker.drain.lanes`); empty
    #: when the row has none, or when the head was read by the single stream's head query.
    keys: tuple[str, ...] = ()
    #: The binding the payload was sealed under (migration 0033): ``(id, scope)``, the row's
    #: own id and destination for a row holding its own payload, the log id and
    #: ``channel:<name>`` for a message stored once in the channel log; None: the item's own
    #: ``(id, destination)``.
    seal: tuple[int, str] | None = None

    @property
    def binding(self) -> tuple[int, str]:
        """``(id, scope)`` to open the payload with (see ``seal``)."""
        return self.seal if self.seal is not None else (self.item.id, self.item.destination)


class ExpectedReply(Protocol):
    """One reply a delivered order waits for (``spec.replies``), as the worker's marks record it
    (:func:`inturn.worker.store.delivery.succeeded_next` and ``take``);
    :class:`inturn.worker.orders.keys.Expectation` has these attributes."""

    @property
    def key(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def reply_types(self) -> tuple[str, ...]: ...
    @property
    def within_seconds(self) -> int: ...


@dataclass(frozen=True)
class Pending:
    """One pending item as the lanes' scheduler needs it (no payload).

    Attributes:
        id: the row id (enqueue order).
        keys: its ``patient_keys`` (empty when it has none or was not indexed yet: a barrier).
        attempts: failed attempts so far.
        wait_seconds: until its next attempt, 0 when due now (database clock).
        size: its payload's size in bytes, as stored.
    """

    id: int
    keys: tuple[str, ...]
    attempts: int
    wait_seconds: float
    size: int = 0


@dataclass(frozen=True)
class DepthRow:
    """Per-destination summary: what is stuck, and since when.

    Attributes:
        pending: items waiting; failed: items given up, not resent and not yet removed (what
            still needs a person: a failed item whose copy was queued is not counted).
        oldest: enqueue time of the oldest pending item (None when nothing is pending).
        oldest_seconds: its age in seconds, the number to alert on.
        max_attempts: the most attempts made so far on any one pending item ("retried, not
            progressing"; normally the head's), shown as ``MOST-ATTEMPTS`` and ``mostAttempts``
            (never the limit, ``retry.maxAttempts``).
        schedule: the destination's delivery window as registered (``spec.schedule``), or None.
        lanes: messages it may have in flight at once, as registered (``spec.lanes.count``).
        held_at, held_by: when and by whom its delivery was suspended (``inturn queue
            suspend``, the console, or a restore found: nothing is sent until ``resume``), or
            None. A destination on hold is listed even when its queue is empty.
        registered: False for an orphaned queue: rows remain for a destination no longer
            registered (its Destination or manifest is gone); nothing delivers them.
    """

    destination: str
    channel: str
    pending: int
    failed: int
    oldest: datetime | None
    oldest_seconds: float
    max_attempts: int
    schedule: dict[str, Any] | None = None
    lanes: int = 1
    held_at: datetime | None = None
    held_by: str | None = None
    registered: bool = True

    def held_until(self, at: datetime) -> datetime | None:
        """When its delivery window next opens, if ``at`` is outside it; else None."""
        return held_until(self.schedule, at)

    def to_json(self, at: datetime | None = None) -> dict[str, Any]:
        """A JSON-ready dict with camelCase keys; with ``at``, ``heldUntil`` too (when its
        delivery window next opens, if ``at`` is outside it; else null)."""
        out: dict[str, Any] = {
            "destination": self.destination,
            "channel": self.channel,
            "pending": self.pending,
            "failed": self.failed,
            "oldest": self.oldest.isoformat() if self.oldest else None,
            "oldestSeconds": round(self.oldest_seconds, 3),
            "mostAttempts": self.max_attempts,
            "lanes": self.lanes,
            "suspendedAt": self.held_at.isoformat() if self.held_at else None,
            "suspendedBy": self.held_by,
            "orphaned": not self.registered,
        }
        if at is not None:
            until = self.held_until(at)
            out["heldUntil"] = until.isoformat() if until is not None else None
        return out


@dataclass(frozen=True)
class ScannedPayload:
    """A held item's identity and payload, for a data-subject search (never listed or logged)."""

    id: int
    destination: str
    channel: str
    state: State
    message_type: str
    payload: bytes
    #: The binding its envelope was sealed under: its own id and destination, or (a slim row
    #: of the channel log) its log row's id and ``channel:<name>``.
    seal_id: int
    seal_scope: str


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of an item: its number, when, ``retry`` or ``failed``, the error."""

    attempt: int
    at: datetime
    outcome: str
    error: str | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (ISO 8601 time)."""
        return {
            "attempt": self.attempt,
            "at": self.at.isoformat(),
            "outcome": self.outcome,
            "error": self.error,
        }


@dataclass(frozen=True)
class HeadInfo:
    """The head of a destination's queue, without its payload.

    Attributes:
        item_id: its id; attempts: failed attempts so far.
        wait_seconds: until its next attempt (0 when due now).
        last_error: ``"<class>: <detail>"`` of its last failure, or None.
    """

    item_id: int
    attempts: int
    wait_seconds: float
    last_error: str | None


# --- reservation records (bookings and their flight segments) ---------------------------------


@dataclass(frozen=True)
class Segment:
    """One flight segment.

    Attributes:
        number: 1-99, unique in its booking.
        carrier: IATA airline designator (``LH``); flight: its flight number (``400``).
        date: departure date; origin, destination: IATA airport codes.
        status: AIRIMP status code as held (``HK``, ``HN``, ``UC``...).
        requested_at: when space was requested from the carrier (aware UTC), or None.
        status_changed_at: when the status last changed (set by the store), or None.
    """

    number: int
    carrier: str
    flight: str
    date: date
    origin: str
    destination: str
    status: str
    requested_at: datetime | None = None
    status_changed_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict in the import file's shape (plus ``statusChangedAt``)."""
        out: dict[str, Any] = {
            "number": self.number,
            "carrier": self.carrier,
            "flight": self.flight,
            "date": self.date.isoformat(),
            "origin": self.origin,
            "destination": self.destination,
            "status": self.status,
        }
        if self.requested_at is not None:
            out["requestedAt"] = iso_utc(self.requested_at)
        if self.status_changed_at is not None:
            out["statusChangedAt"] = iso_utc(self.status_changed_at)
        return out


@dataclass(frozen=True)
class Withdrawn:
    """A segment withdrawn by a cancellation (now XX), with the status it held before."""

    number: int
    carrier: str
    flight: str
    date: date
    origin: str
    destination: str
    previous: str


@dataclass(frozen=True)
class Booking:
    """One booking (a PNR) and its segments, ordered by number.

    Attributes:
        locator: the record locator; owner: the office that made it (the originator).
        created_at: when it was made (aware UTC).
        ticketing_deadline: the instant it must be ticketed by (aware UTC), or None.
        ticketing_deadline_text: the deadline as it was given (with its airport, if local).
        ticketed, ticket_numbers: whether tickets are issued, and their numbers.
        cancelled_at, cancel_reason: set once the booking is cancelled (never unset).
    """

    locator: str
    owner: str
    created_at: datetime
    segments: tuple[Segment, ...]
    ticketing_deadline: datetime | None = None
    ticketing_deadline_text: str | None = None
    ticketed: bool = False
    ticket_numbers: tuple[str, ...] = ()
    cancelled_at: datetime | None = None
    cancel_reason: str | None = None
    carriers: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "carriers", tuple(sorted({s.carrier for s in self.segments})))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict in the import file's shape (plus the cancellation, if any)."""
        out: dict[str, Any] = {
            "locator": self.locator,
            "owner": self.owner,
            "createdAt": iso_utc(self.created_at),
            "ticketed": self.ticketed,
        }
        if self.ticketing_deadline is not None:
            out["ticketingDeadline"] = iso_utc(self.ticketing_deadline)
            out["ticketingDeadlineText"] = self.ticketing_deadline_text
        if self.ticket_numbers:
            out["ticketNumbers"] = list(self.ticket_numbers)
        if self.cancelled_at is not None:
            out["cancelledAt"] = iso_utc(self.cancelled_at)
            out["cancelReason"] = self.cancel_reason
        out["segments"] = [s.to_json() for s in self.segments]
        return out


def iso_utc(value: datetime) -> str:
    """``value`` in UTC as RFC 3339 text ending in ``Z``."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Message:
    """One received message, ready to store.

    Attributes:
        control_id: MSH-10.
        message_type: MSH-9 as ``CODE^TRIGGER``.
        payload: the bytes exactly as received.
        digest: SHA-256 of ``payload`` (32 bytes), the duplicate-window key with MSH-10.
        patient_keys: its identifier index keys, comma-separated (see
            :func:`inturn.worker.store.identifiers.keys_text`), computed by the caller off the
            event loop; None computes them here (capped at the default).
        traceparent: the W3C trace context of its receive span when traced, else None.
        reply_keys: when it is a reply (``spec.replies``), the digests of its keys,
            comma-separated (:func:`inturn.worker.orders.keys.reply_digests`); else empty.
        keying: with payload keys, which patients' keys it is sealed under
            (:class:`inturn.worker.crypto.codec.Keying`), found when its index keys were (the
            message read once); None: not known yet, or it names nobody.
    """

    control_id: str
    message_type: str
    payload: bytes
    digest: bytes
    patient_keys: str | None = None
    traceparent: str | None = None
    reply_keys: str = ""
    keying: Any = None


@dataclass(frozen=True)
class Earlier:
    """A destination's latest copy of a message received again (the same channel, MSH-10 and
    bytes inside the duplicate window), and what was decided for the new copy there.

    Attributes:
        destination: ``namespace/name``.
        id: the ``inturn_delivery`` id of the latest earlier copy there (the original, or the
            last re-send of it); None when there is none any more (erased, purged) or none this
            transaction can see yet.
        state: that copy's state (``pending``, ``delivered``, ``failed``, ``skipped``); None
            when there is none; ``arriving`` when an identical copy was being stored by another
            transaction at the same moment (this one is then never queued).
        queued: True when the new copy was queued there as a re-send (linked to ``id``), False
            when it was acknowledged without being queued (the earlier copy is pending, was
            delivered within the lost-ACK window, or is arriving in a concurrent transaction).
    """

    destination: str
    id: int | None
    state: str | None
    queued: bool


@dataclass(frozen=True)
class StoreResult:
    """What storing one message did.

    Attributes:
        ids: the ``inturn_delivery`` ids stored for it in sorted destination order: one per
            destination for a new message; for a message received again, one per destination
            it was queued again for (a re-send); empty when nothing was stored.
        duplicate: nothing was stored for it: an identical copy (the same channel, MSH-10 and
            bytes) is pending, was delivered within the lost-ACK window, is arriving at the same
            moment, or came earlier in the same batch.
        control_id_reused: another message with this MSH-10 and different bytes was received
            on the channel inside the window.
        answered: it is a reply (``reply_keys``) and answered at least one open expectation.
        earlier: for a message received again, per destination, its latest earlier copy and
            what was decided (:class:`Earlier`); empty for a new message.
    """

    ids: tuple[int, ...]
    duplicate: bool = False
    control_id_reused: bool = False
    answered: bool = False
    earlier: tuple[Earlier, ...] = ()


_ROW_FIELDS: dict[type[Item], tuple[tuple[str, bool], ...]] = {}


def _row_fields(cls: type[Item]) -> tuple[tuple[str, bool], ...]:
    """``cls``'s fields as (name, required), read once: ``from_row`` runs for every head."""
    known = _ROW_FIELDS.get(cls)
    if known is None:
        known = _ROW_FIELDS[cls] = tuple((f.name, f.default is MISSING) for f in fields(cls))
    return known
