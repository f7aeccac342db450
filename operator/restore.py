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
from datetime import datetime
from typing import Any

from inturn.operator.status import rfc3339
from inturn.worker.store.restore import Seen

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

    @classmethod
    def of(cls, tick: int, seen: Seen | None) -> Witness:
        """The witness of ``seen`` at ``tick`` (a destination with no rows: the tick alone)."""
        if seen is None:
            return cls(tick)
        return cls(
            tick,
            seen.delivered_through,
            rfc3339(seen.delivered_at) if seen.delivered_at else None,
            seen.accepted_through,
            rfc3339(seen.accepted_at) if seen.accepted_at else None,
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
        )

    def to_status(self) -> dict[str, Any]:
        """The ``status.witness`` node (absent figures left out)."""
        out: dict[str, Any] = {"tick": self.tick}
        for key, value in (
            ("deliveredThrough", self.delivered_through),
            ("deliveredTime", self.delivered_time),
            ("acceptedThrough", self.accepted_through),
            ("acceptedTime", self.accepted_time),
        ):
            if value is not None:
                out[key] = value
        return out


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
    """

    destination: str
    policy: str
    again: int
    recorded: Witness
    now: Seen | None

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
        lost_from = self.now.accepted_at if self.now is not None else None
        if self.recorded.accepted_time is not None and (
            self.now is None
            or self.now.accepted_through is None
            or (self.recorded.accepted_through or 0) > self.now.accepted_through
        ):
            start = rfc3339(lost_from) if lost_from is not None else "its first message"
            parts.append(
                f"messages accepted for it after {start} up to {self.recorded.accepted_time}"
                " are not in the database: ask the senders to send them again"
            )
        if self.policy == "hold":
            parts.append(
                "delivery is held until a person decides: inturn queue mark-delivered"
                f" {self.destination} --through {self.recorded.delivered_through or 0}"
                " (what the receiver has), then inturn queue resume"
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
            "message": self.line()[:1024],
        }
