"""Noticing a queue database that went back in time (issue 39, part 1): pure decisions.

The operator moves the database's clock on (``inturn_clock``) and records the tick, with what
each destination had delivered and accepted, in the Destination's status (``status.witness``):
outside the database, so that a restore cannot take it back. A database holding an older tick
than a Destination's witness was restored (from a dump, a base backup, point-in-time recovery,
or a replica that had not received the last ticks). Then, per destination: the messages
delivered before that the database holds as waiting again would be sent twice; those accepted
after the restored state are lost (senders must send them again); ``spec.afterRestore`` says
whether delivery is held until a person decides (``hold``) or goes on (``resend``: receivers
deduplicate by MSH-10). See docs/howto/backups.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inturn.operator.status import rfc3339
from inturn.worker.store.restore import RestoreFinding, Seen

#: Who the operator's hold after a restore names (registry and audit): a person lifts it.
HOLDER = "inturn-operator"


@dataclass(frozen=True)
class Witness:
    """What the queue database held for one destination at a tick (``status.witness``)."""

    tick: int
    delivered_through: int | None = None
    delivered_time: str | None = None
    accepted_through: int | None = None
    accepted_time: str | None = None
    delivered_message: int | None = None
    channel_through: int | None = None
    channel_time: str | None = None

    @classmethod
    def of(cls, tick: int, seen: Seen | None, before: Witness | None = None) -> Witness:
        """The witness of ``seen`` at ``tick`` (a destination with no rows: the tick alone).

        ``before``: the witness recorded at the previous tick. Its channel-log bound is kept
        when the hot table no longer shows one (its slim rows moved to history, where a row's
        log id cannot be told from a drawn one): delivery only moves on between restores.
        """
        message = before.delivered_message if before is not None else None
        if seen is None:
            return cls(tick, delivered_message=message)
        return cls(
            tick,
            seen.delivered_through,
            precise(seen.delivered_at) if seen.delivered_at else None,
            seen.accepted_through,
            rfc3339(seen.accepted_at) if seen.accepted_at else None,
            seen.delivered_message if seen.delivered_message is not None else message,
            seen.channel_through,
            precise(seen.channel_at) if seen.channel_at else None,
        )

    @classmethod
    def from_status(cls, node: Mapping[str, Any] | None) -> Witness | None:
        """The witness a status holds, or None (none recorded, or not one of ours)."""
        if not isinstance(node, Mapping) or not isinstance(node.get("tick"), int):
            return None

        def number(key: str) -> int | None:
            value = node.get(key)
            return value if isinstance(value, int) else None

        def text(key: str) -> str | None:
            value = node.get(key)
            return value if isinstance(value, str) else None

        return cls(
            int(node["tick"]),
            number("deliveredThrough"),
            text("deliveredTime"),
            number("acceptedThrough"),
            text("acceptedTime"),
            number("deliveredMessage"),
            number("channelThrough"),
            text("channelTime"),
        )

    def to_status(self) -> dict[str, Any]:
        """The ``status.witness`` node (absent figures left out)."""
        out: dict[str, Any] = {"tick": self.tick}
        for key, value in (
            ("deliveredThrough", self.delivered_through),
            ("deliveredTime", self.delivered_time),
            ("acceptedThrough", self.accepted_through),
            ("acceptedTime", self.accepted_time),
            ("deliveredMessage", self.delivered_message),
            ("channelThrough", self.channel_through),
            ("channelTime", self.channel_time),
        ):
            if value is not None:
                out[key] = value
        return out

    def channel_moment(self) -> datetime | None:
        """``channel_time`` as a timestamp (None: absent or not one)."""
        return parse_time(self.channel_time)

    def finding(self) -> RestoreFinding:
        """What the restored database keeps of this witness until a person decides (the bounds
        of ``inturn queue mark-delivered``)."""
        return RestoreFinding(
            self.tick,
            self.delivered_through,
            self.delivered_message,
            parse_time(self.delivered_time),
            self.accepted_through,
            self.channel_through,
        )


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time of a status as a timestamp (None: absent or not one)."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def precise(moment: datetime) -> str:
    """RFC 3339 in UTC to the microsecond (``2026-01-02T03:04:05.123456Z``): the witness's last
    delivery time bounds what ``mark-delivered`` may mark, to the database's precision."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def went_back(recorded: Witness | None, tick_before: int) -> bool:
    """Whether the database was restored: it held ``tick_before`` when the clock was moved on,
    older than the tick the Destination's status recorded."""
    return recorded is not None and recorded.tick > tick_before


@dataclass(frozen=True)
class Finding:
    """A restore, as one destination sees it.

    Attributes:
        destination: ``namespace/name``.
        policy: ``spec.afterRestore`` (``hold`` or ``resend``).
        again: messages delivered before that the restored database holds as waiting.
        recorded: what was recorded before the restore; now: what the database holds now.
        channel: its channel (``spec.channel``).
        kept_through, kept_at: the restored channel log's last message accepted no later than
            the witness's last one (:func:`inturn.worker.store.restore.kept`); None: none.
    """

    destination: str
    policy: str
    again: int
    recorded: Witness
    now: Seen | None
    channel: str | None = None
    kept_through: int | None = None
    kept_at: datetime | None = None

    def lost(self) -> tuple[str | None, str] | None:
        """The window of accepted messages the restored database lacks, ``(after, through)``
        as RFC 3339 times (``after`` None: from its first message); None when none is lost.
        From the channel log when the witness saw it (ids compared up to the witness's time:
        a message accepted after the restore may reuse a lost one's id), else from the
        destination's rows that carry their own payload."""
        rec = self.recorded
        if (
            rec.channel_through is not None
            and rec.channel_time is not None
            and (self.kept_through is None or self.kept_through < rec.channel_through)
        ):
            after = rfc3339(self.kept_at) if self.kept_at is not None else None
            return after, rfc3339(rec.channel_moment() or datetime.now(UTC))
        now = self.now
        if rec.accepted_time is not None and (
            now is None
            or now.accepted_through is None
            or (rec.accepted_through or 0) > now.accepted_through
        ):
            after = rfc3339(now.accepted_at) if now is not None and now.accepted_at else None
            return after, rec.accepted_time
        return None

    def line(self) -> str:
        """One line for the log, the event and the status (no identifiers, no content)."""
        parts = [f"destination {self.destination}: the queue database went back in time"]
        since = self.now.delivered_at if self.now is not None else None
        parts.append(
            f"{self.again} message(s) delivered before may be sent again"
            + (
                f" (the restored database's last delivery: {rfc3339(since)})"
                if since is not None
                else ""
            )
        )
        lost = self.lost()
        if lost is not None:
            start = lost[0] or "its first message"
            which = f"on channel {self.channel}" if self.channel else "for it"
            parts.append(
                f"messages accepted {which} after {start} up to {lost[1]}"
                " are not in the database: ask the senders to send them again"
            )
        if self.policy == "hold":
            parts.append(
                "delivery is held until a person decides: inturn queue mark-delivered"
                f" {self.destination} (what the receiver has: those delivered before), then"
                " inturn queue resume"
            )
        else:
            parts.append("delivery goes on (spec.afterRestore: resend): receivers see repeats")
        return "; ".join(parts)

    def to_status(self, detected: datetime) -> dict[str, Any]:
        """The ``status.restore`` node."""
        return {
            "detectedTime": rfc3339(detected),
            "policy": self.policy,
            "mayBeSentAgain": self.again,
            "deliveredThrough": self.recorded.delivered_through or 0,
            **(
                {"deliveredMessage": self.recorded.delivered_message}
                if self.recorded.delivered_message is not None
                else {}
            ),
            **(
                {
                    k: v
                    for k, v in (("lostAfter", lost[0]), ("lostThrough", lost[1]))
                    if v is not None
                }
                if (lost := self.lost()) is not None
                else {}
            ),
            "message": self.line()[:1024],
        }
