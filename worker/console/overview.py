"""The overview: one row per destination, worst first (pure; no I/O).

Built from three things the store already answers: the registry (:func:`registry.listed`), the
queue depth (:func:`reads.depth`, the very function behind ``inturn queue depth``, so the counts
match it) and each destination's head (:func:`reads.heads`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inturn.worker.spec.schedule import ScheduleError
from inturn.worker.spec.schedule import parse as parse_schedule
from inturn.worker.store.feeds import FeedRow
from inturn.worker.store.model import DepthRow, HeadInfo
from inturn.worker.store.registry import Listed

#: Seconds after which a destination's oldest pending message makes it stand out, by default
#: (the same default as the sweeper's ``destination-stuck`` rule).
DEFAULT_STUCK_AFTER = 900.0

#: Overview states, in the order they are decided: what stops delivery (no worker, a hold,
#: ``spec.suspend``, a closed window) before the symptoms it causes (stuck, failing), so that the
#: state names what a person must act on. A destination whose Destination is gone has no worker
#: trying its head: it is ``orphaned``, never ``failing``, whatever the head's attempts say.
STATES = (
    "orphaned",
    "no-worker",
    "held",
    "suspended",
    "outside-window",
    "stuck",
    "failing",
    "delivering",
    "idle",
)


@dataclass(frozen=True)
class OverviewRow:
    """One destination as the overview shows it.

    Attributes:
        destination, channel, sender: identity and the credential-free sender summary.
        state: one of :data:`STATES`: ``stuck`` (oldest pending older than the threshold),
            ``failing`` (the head has failed attempts, or its receiver is unreachable),
            ``held`` (a console/CLI hold),
            ``suspended`` (``spec.suspend``), ``orphaned`` (pending but not registered, or
            deleted), ``outside-window`` (pending, and outside its delivery window,
            ``spec.schedule``: held on purpose until ``window_until``), ``no-worker`` (the
            process that runs its worker says it has none: ``inturn local`` over its
            connection budget, or refused a session by a full database), ``delivering``
            (pending and nothing wrong), ``idle`` (nothing pending).
        ready: pending messages that may go now: all of them when the head is due and nothing
            holds the destination, else 0 (nothing overtakes the head).
        pending, failed, oldest_seconds, max_attempts: as ``inturn queue depth``
            (``max_attempts`` is its ``MOST-ATTEMPTS``: the most attempts made on any pending
            message, not ``retry.maxAttempts``).
        head_wait_seconds: until the head's next attempt (0 when due or nothing pending).
        last_error_class: the class part of the head's last error (``"connection"``), or None.
        over_threshold: ``oldest_seconds`` exceeds ``stuck_after``.
        stuck_after: the threshold in seconds.
        hold_by: who put the hold on, if any.
        window_until: outside its delivery window: when it opens (UTC); else None. Time outside
            the window is not counted as stuck, as the sweeper does not count it.
    """

    destination: str
    channel: str
    sender: str
    state: str
    ready: int
    pending: int
    failed: int
    oldest_seconds: float
    max_attempts: int
    head_wait_seconds: float
    last_error_class: str | None
    over_threshold: bool
    stuck_after: float
    hold_by: str | None
    window_until: datetime | None = None

    @property
    def severity(self) -> int:
        """2: over its threshold; 1: failing, failed items, held, suspended or orphaned with
        something pending or failed; 0: fine."""
        if self.over_threshold:
            return 2
        troubled = self.state in ("failing", "held", "suspended", "orphaned", "no-worker")
        return 1 if self.failed or (troubled and self.pending) else 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with camelCase keys."""
        return {
            "destination": self.destination,
            "channel": self.channel,
            "sender": self.sender,
            "state": self.state,
            "ready": self.ready,
            "pending": self.pending,
            "failed": self.failed,
            "oldestSeconds": round(self.oldest_seconds, 3),
            "mostAttempts": self.max_attempts,
            "headWaitSeconds": round(self.head_wait_seconds, 3),
            "lastErrorClass": self.last_error_class,
            "overThreshold": self.over_threshold,
            "stuckAfterSeconds": self.stuck_after,
            "heldBy": self.hold_by,
            "windowUntil": self.window_until.isoformat() if self.window_until else None,
            "severity": self.severity,
        }


def error_class(last_error: str | None) -> str | None:
    """The class part of a stored error ``"<class>: <detail>"`` (the whole text, clipped to 40
    characters, when it has no class)."""
    if not last_error:
        return None
    head, sep, _ = last_error.partition(":")
    return (head if sep else last_error).strip()[:40] or None


def build(
    listed: Sequence[Listed],
    depth: Sequence[DepthRow],
    heads: Mapping[str, HeadInfo],
    *,
    stuck_after: Mapping[str, float] | None = None,
    default_stuck_after: float = DEFAULT_STUCK_AFTER,
    now: datetime | None = None,
    no_worker: Mapping[str, str] | None = None,
) -> list[OverviewRow]:
    """Merge registry rows, depth rows and heads into overview rows, worst first.

    ``now`` (default: the current time) judges the delivery windows. ``no_worker``: the
    destinations the process running their workers has none for (name -> why), shown as
    ``no-worker`` (never ``delivering``).

    Every registered, not deleted destination has a row; a destination with messages but no
    live registry row appears as ``orphaned``. Order: severity, then the oldest pending age,
    then failed count, then the name.
    """
    at = now or datetime.now(UTC)
    by_depth = {d.destination: d for d in depth}
    by_name = {entry.destination: entry for entry in listed}
    names = {e.destination for e in listed if not e.deleted} | set(by_depth)
    rows = []
    for name in names:
        entry = by_name.get(name)
        d = by_depth.get(name)
        head = heads.get(name)
        # the Destination's own threshold (spec.alerting.stuckAfterSeconds), as the sweeper's
        # destination-stuck rule reads it; the console's default for unregistered queues
        own = float(entry.stuck_after_seconds) if entry is not None else default_stuck_after
        threshold = (stuck_after or {}).get(name, own)
        pending = d.pending if d else 0
        oldest = d.oldest_seconds if d and pending else 0.0
        window_until = d.held_until(at) if d and pending else None
        over = pending > 0 and oldest > threshold and window_until is None
        held = entry is not None and entry.hold is not None
        suspended = entry is not None and entry.suspended
        orphaned = entry is None or entry.deleted
        wait = head.wait_seconds if head else 0.0
        if orphaned:
            state = "orphaned"
        elif name in (no_worker or {}):
            state = "no-worker"
        elif held:
            state = "held"
        elif suspended:
            state = "suspended"
        elif window_until is not None:
            state = "outside-window"
        elif over:
            state = "stuck"
        elif head is not None and (
            head.attempts > 0 or error_class(head.last_error) == "unreachable"
        ):
            state = "failing"  # an unreachable receiver holds the head without counting attempts
        else:
            state = "delivering" if pending else "idle"
        unrun = name in (no_worker or {})
        blocked = held or suspended or orphaned or unrun or wait > 0 or window_until is not None
        rows.append(
            OverviewRow(
                destination=name,
                channel=entry.channel if entry else (d.channel if d else ""),
                sender=entry.sender if entry else "",
                state=state,
                ready=0 if blocked else pending,
                pending=pending,
                failed=d.failed if d else 0,
                oldest_seconds=oldest,
                max_attempts=d.max_attempts if d else 0,
                head_wait_seconds=wait,
                last_error_class=error_class(head.last_error) if head else None,
                over_threshold=over,
                stuck_after=threshold,
                hold_by=entry.hold.by if entry and entry.hold else None,
                window_until=window_until,
            )
        )
    rows.sort(key=lambda r: (-r.severity, -r.oldest_seconds, -r.failed, r.destination))
    return rows


#: Feed states, worst first: ``silent`` (quiet for its ``silentAfterSeconds`` or longer, inside
#: its schedule: the sweeper's feed-silent), ``outside-window`` (outside its schedule: quiet on
#: purpose), ``receiving`` (fine).
FEED_STATES = ("silent", "outside-window", "receiving")


@dataclass(frozen=True)
class FeedOverviewRow:
    """One feed (a channel, or one sender of a per-sender channel) as the overview shows it.

    Attributes:
        channel, sender: the feed (``sender`` empty: the channel as a whole).
        state: one of :data:`FEED_STATES`, judged as the sweeper's ``feed-silent`` judges it.
        quiet_seconds: seconds since its last message (since it was declared or first seen,
            when it has had none); last-message times are as ingest last wrote them.
        silent_after: its ``silentAfterSeconds``.
        over_threshold: its silence inside the schedule reached ``silent_after``.
        window_until: outside its schedule, when the schedule opens (UTC); else None.
        heard: whether it has received a message since it was declared.
    """

    channel: str
    sender: str
    state: str
    quiet_seconds: float
    silent_after: float
    over_threshold: bool
    window_until: datetime | None
    heard: bool

    @property
    def severity(self) -> int:
        """2: silent; 0: fine or quiet on purpose."""
        return 2 if self.over_threshold else 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with camelCase keys."""
        return {
            "channel": self.channel,
            "sender": self.sender or None,
            "state": self.state,
            "quietSeconds": round(self.quiet_seconds, 3),
            "silentAfterSeconds": self.silent_after,
            "overThreshold": self.over_threshold,
            "windowUntil": self.window_until.isoformat() if self.window_until else None,
            "heard": self.heard,
            "severity": self.severity,
        }


def build_feeds(rows: Sequence[FeedRow], *, now: datetime | None = None) -> list[FeedOverviewRow]:
    """Judge each declared feed at ``now`` (default: the current time), worst first: severity,
    then the longest quiet, then channel and sender."""
    at = now or datetime.now(UTC)
    out = []
    for r in rows:
        heard_at = r.last_message_at or r.declared_at
        since: datetime | None = None
        window_until: datetime | None = None
        if r.schedule is not None:
            try:
                state = parse_schedule(r.schedule).state(at)
            except ScheduleError:  # checked when declared; judged as always open here
                state = None
            if state is not None and not state.open:
                window_until = state.until
            elif state is not None:
                since = state.since
        quiet_since = max(heard_at, since) if since is not None else heard_at
        over = window_until is None and (at - quiet_since).total_seconds() >= r.silent_after_seconds
        out.append(
            FeedOverviewRow(
                channel=r.channel,
                sender=r.sender,
                state="silent" if over else ("outside-window" if window_until else "receiving"),
                quiet_seconds=max((at - heard_at).total_seconds(), 0.0),
                silent_after=float(r.silent_after_seconds),
                over_threshold=over,
                window_until=window_until,
                heard=r.last_message_at is not None,
            )
        )
    out.sort(key=lambda f: (-f.severity, -f.quiet_seconds, f.channel, f.sender))
    return out
