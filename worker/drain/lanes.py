"""Lanes: which pending messages may be sent now when several may be in flight at once.

A destination with ``spec.lanes.count`` above 1 sends up to that many messages at a time, and
keeps each patient's messages in enqueue order. This module is the decision alone, with no I/O
and no clock of its own: given the oldest pending messages of a destination in enqueue order
(the *window*), what is in flight, how many lanes are free and what time it is, it says which
messages may start now. The worker (:mod:`inturn.worker.drain.lane_runner`) reads the window,
starts what this module chose and records the outcomes.

The rules (the same as SQS FIFO's message groups, with bindings added for HL7 merges):

* A message's *keys* are its row's ``patient_keys`` (:func:`inturn.worker.hl7.pid.index_keys`),
  compared for equality only. Two messages *conflict* when they share a key, or when either is
  a barrier.
* A message with no keys, whose keys are unknown (the row was not indexed yet), or whose
  identifiers were capped at ingest (:data:`inturn.worker.hl7.pid.CAPPED_KEY` among its keys)
  is a *barrier*: it conflicts with everything.
* A message may start only when no earlier pending message conflicts with it and no message in
  flight conflicts with it. So a message with one key waits for its key's earlier messages
  only; a message with several keys (A40 merge, A24 link, A17 swap) waits for every earlier
  message of each of them, and every later message of any of them waits for it; a barrier waits
  for everything before it, and everything after it waits for it. Bindings last as long as the
  message that makes them is pending, no longer.
* A message that waits takes no lane: a patient whose message is failing (backing off) holds
  its own later messages, and the barriers and merges that name it, not the other patients.
* The window is bounded (``spec.lanes.window``). When it is full and fewer messages may start
  than there are free lanes, the plan says so: messages past the window cannot be looked at.

Everything here is pure and deterministic; the property test
(``tests/unit/test_lanes_model.py``) drives it against a model of a receiver.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from inturn.worker.hl7.pid import CAPPED_KEY

#: Why the oldest waiting message waits (see :class:`Hold`).
HoldReason = Literal["backoff", "key", "binding", "barrier", "lanes"]


@dataclass(frozen=True)
class Entry:
    """One pending message as the scheduler sees it.

    Attributes:
        id: the row id (enqueue order: a larger id was enqueued later).
        keys: the lane keys (the row's ``patient_keys``); empty means a barrier.
        due: when it may be attempted, in the caller's clock (seconds, e.g. ``time.monotonic()``).
    """

    id: int
    keys: tuple[str, ...]
    due: float


@dataclass(frozen=True)
class Plan:
    """What may happen now.

    Attributes:
        start: ids to send now, in enqueue order, at most the free lanes.
        wake_in: seconds until a message that waits only for its own backoff becomes due (the
            caller looks again then), or None when no such message was seen.
        window_full: the window holds as many messages as it may and fewer could start than
            there were free lanes: messages past it may be waiting for no reason but the bound.
    """

    start: tuple[int, ...]
    wake_in: float | None
    window_full: bool


@dataclass(frozen=True)
class Hold:
    """Why the oldest waiting message of a window waits.

    Attributes:
        item_id: the oldest message that is neither in flight nor startable now.
        reason: ``backoff`` (its own last attempt failed; it is not due yet), ``key`` (an earlier
            message of its patient is pending or in flight), ``binding`` (the message it waits
            for, or itself, names several patients: a merge, a link, a swap), ``barrier`` (it,
            or the message it waits for, has no key) or ``lanes`` (it could go, but every lane
            is busy).
        behind: the id of the earliest message it waits for (``key``, ``binding``, ``barrier``),
            else None.
    """

    item_id: int
    reason: HoldReason
    behind: int | None = None


def is_barrier(keys: Collection[str]) -> bool:
    """Whether a message with these lane keys is a barrier: no keys, or capped identifiers."""
    return not keys or CAPPED_KEY in keys


def conflict(a: Collection[str], b: Collection[str]) -> bool:
    """Whether two messages must keep their enqueue order: a shared key, or either a barrier."""
    if is_barrier(a) or is_barrier(b):
        return True
    return not set(a).isdisjoint(b)


def plan(
    window: Sequence[Entry],
    in_flight: Mapping[int, Collection[str]],
    free: int,
    now: float,
    limit: int,
) -> Plan:
    """Choose the messages that may start now.

    Linear in the part of the window looked at (until every free lane has a message, or a
    pending barrier) times the keys per message: a turn with one free lane usually looks at a
    few messages, not the window.

    Args:
        window: the oldest pending messages of the destination, in enqueue (id) order, at most
            ``limit`` of them (messages in flight may be among them). Every pending message older
            than the last one must be in it.
        in_flight: id -> keys of the messages being sent now (also those no longer pending: a
            message skipped or erased during its attempt still holds its keys until the attempt
            returns).
        free: lanes not sending now (a negative value counts as 0).
        now: the current time, in the clock of :attr:`Entry.due`.
        limit: the window bound (``spec.lanes.window``).

    Returns:
        The :class:`Plan`: the first startable messages in enqueue order, up to ``free``.

    Raises:
        ValueError: the part of the window looked at is not in strictly increasing id order,
            or ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError("the window bound must be at least 1")
    free = max(0, free)
    start: list[int] = []
    wake_in: float | None = None
    held: set[str] = set()
    for keys in in_flight.values():
        if is_barrier(keys):
            return Plan((), None, len(window) >= limit and free > 0)
        held.update(keys)
    if free == 0:  # nothing can start: an answer, not time, changes that
        return Plan((), None, False)
    earlier = bool(in_flight)  # something before (or beside) the message being looked at
    last = -1
    for entry in window:
        if entry.id <= last:
            raise ValueError("the window must be in increasing id order")
        last = entry.id
        if entry.id in in_flight:
            continue
        if len(start) == free:  # every free lane has a message: the rest wait for one
            return Plan(tuple(start), wake_in, False)
        if is_barrier(entry.keys):
            if not earlier and entry.due <= now:
                start.append(entry.id)
            elif not earlier:
                wake_in = entry.due - now
            break  # nothing after a pending barrier may go
        if held.isdisjoint(entry.keys):
            if entry.due <= now:
                start.append(entry.id)
            else:
                wake_in = _sooner(wake_in, entry.due - now)
        held.update(entry.keys)
        earlier = True
    return Plan(tuple(start), wake_in, len(window) >= limit and len(start) < free)


def hold(
    window: Sequence[Entry],
    in_flight: Mapping[int, Collection[str]],
    now: float,
    started: Collection[int] = (),
) -> Hold | None:
    """Why the oldest waiting message of ``window`` waits, or None when none waits.

    ``started`` are ids the caller is starting now (they do not wait). Linear in the position of
    that message in the window times its keys.
    """
    going = set(in_flight) | set(started)
    for position, entry in enumerate(window):
        if entry.id in going:
            continue
        blocker = _first_conflict(window[:position], entry, in_flight)
        if blocker is None:
            return Hold(entry.id, "backoff" if entry.due > now else "lanes")
        other_keys = blocker[1]
        if is_barrier(entry.keys) or is_barrier(other_keys):
            reason: HoldReason = "barrier"
        elif set(entry.keys) != set(other_keys) and (len(entry.keys) > 1 or len(other_keys) > 1):
            # several keys name several patients only when the two differ: one identifier with
            # an assigning authority has two keys of its own (with and without it)
            reason = "binding"
        else:
            reason = "key"
        return Hold(entry.id, reason, blocker[0])
    return None


def _first_conflict(
    earlier: Sequence[Entry],
    entry: Entry,
    in_flight: Mapping[int, Collection[str]],
) -> tuple[int, Collection[str]] | None:
    """The earliest message ``entry`` waits for: in flight, or pending before it."""
    candidates: list[tuple[int, Collection[str]]] = [
        (i, keys) for i, keys in in_flight.items() if conflict(keys, entry.keys)
    ]
    for other in earlier:
        if conflict(other.keys, entry.keys):
            candidates.append((other.id, other.keys))
            break
    return min(candidates, key=lambda c: c[0]) if candidates else None


def _sooner(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


@dataclass(frozen=True)
class LaneView:
    """What the lanes are doing, for ``/readyz``, the metrics and the logs.

    Attributes:
        count: the lanes; busy: lane -> (item id, seconds in flight) of the lanes sending.
        hold: why the oldest waiting message waits (None when none waits).
        waiting: messages of the window neither in flight nor starting.
        window_full: the window is full of waiting messages (messages past it cannot be seen).
        unreachable_for: while the receiver is unreachable and every lane waits out its
            backoff, the seconds until the next try; None otherwise.
    """

    count: int
    busy: dict[int, tuple[int, float]]
    hold: Hold | None
    waiting: int
    window_full: bool
    unreachable_for: float | None = None

    def describe(self) -> str:
        """One line: the lanes' heads and what holds the oldest waiting message."""
        heads = ", ".join(f"lane {lane}: id={i}" for lane, (i, _) in sorted(self.busy.items()))
        text = f"{len(self.busy)} of {self.count} lanes sending" + (f" ({heads})" if heads else "")
        if self.unreachable_for is not None:
            text += (
                "; the receiver is unreachable: every lane waits,"
                f" next try in {self.unreachable_for:.0f}s"
            )
        if self.hold is not None:
            text += f"; oldest waiting id={self.hold.item_id} ({describe_hold(self.hold, self)})"
        if self.window_full:
            text += "; the window is full of waiting messages"
        return text


def describe_hold(why: Hold, view: LaneView | None = None) -> str:
    """Why a message waits, in words (the lane of the message it waits for when known)."""
    lanes = {} if view is None else {i: lane for lane, (i, _) in view.busy.items()}
    behind = ""
    if why.behind is not None:
        where = f", in flight on lane {lanes[why.behind]}" if why.behind in lanes else ""
        behind = f"id={why.behind}{where}"
    return {
        "backoff": "its last attempt failed; it waits for its next one",
        "key": f"behind {behind}, an earlier message of its patient",
        "binding": f"behind {behind}: a message naming several patients binds them",
        "barrier": f"behind {behind}: a message without patient keys is a barrier",
        "lanes": "every lane is busy",
    }[why.reason]


class Waiting(Protocol):
    """A pending message as a reader has it (:class:`inturn.worker.store.model.Pending`)."""

    @property
    def id(self) -> int: ...
    @property
    def keys(self) -> tuple[str, ...]: ...
    @property
    def wait_seconds(self) -> float: ...


@dataclass(frozen=True)
class LaneSummary:
    """What a destination's lanes hold, as seen from its pending rows (no worker asked).

    Attributes:
        count: its lanes (``spec.lanes.count``).
        heads: the messages its lanes send now or next, oldest first (at most ``count``): the
            first messages no earlier one holds. A message being sent is still pending, so it
            is among them.
        hold: why the oldest message that is not a head waits (None when none waits).
        looked: pending messages looked at; window_full: that many were looked at and fewer
            heads than lanes found (the rest of the backlog was not seen).
    """

    count: int
    heads: tuple[int, ...]
    hold: Hold | None
    looked: int
    window_full: bool

    def describe(self) -> str:
        """One line, e.g. ``8 lanes: heads 12, 14, 15; oldest waiting id=13 (behind id=12...)``."""
        text = f"{self.count} lanes: " + (
            "heads " + ", ".join(map(str, self.heads)) if self.heads else "no head"
        )
        if self.hold is not None:
            text += f"; oldest waiting id={self.hold.item_id} ({describe_hold(self.hold)})"
        if self.window_full:
            text += f"; the {self.looked} oldest messages all wait"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, camelCase (the Destination's ``status.lanes``): ``count``, ``heads``,
        ``windowFull`` and, when a message waits, ``oldestWaiting`` (``id``, ``reason``,
        ``text`` and, when it waits for one, ``behind``); no nulls."""
        out: dict[str, Any] = {
            "count": self.count,
            "heads": list(self.heads),
            "windowFull": self.window_full,
        }
        if self.hold is not None:
            waiting: dict[str, Any] = {"id": self.hold.item_id, "reason": self.hold.reason}
            if self.hold.behind is not None:
                waiting["behind"] = self.hold.behind
            waiting["text"] = describe_hold(self.hold)
            out["oldestWaiting"] = waiting
        return out


def summarize(pending: Sequence[Waiting], count: int, limit: int) -> LaneSummary:
    """What the lanes of a destination hold, from its oldest pending messages (at most
    ``limit``, in id order): the heads are what :func:`plan` would start with every lane free,
    and the hold is :func:`hold` of the oldest message that is not one of them."""
    window = [Entry(p.id, p.keys, p.wait_seconds) for p in pending]
    chosen = plan(window, {}, count, 0.0, limit)
    return LaneSummary(
        count=count,
        heads=chosen.start,
        hold=hold(window, {}, 0.0, chosen.start),
        looked=len(window),
        window_full=chosen.window_full,
    )
