"""May the worker send its head now? Its delivery window and its throttle decide.

Pure: no clock, no I/O; the worker passes the instants in. Two rules, in this order:

* **window** (``spec.schedule``): outside every opening of the destination's weekly schedule
  nothing is sent and no attempt is spent; the answer says when the next opening starts, so
  that the worker can say until when it holds the queue and sleep until then (woken early only
  to stop). See :mod:`inturn.worker.spec.schedule` for how wall times and DST are read.
* **throttle** (``spec.throttle.messagesPerSecond``): two sends are at least ``1 / rate``
  seconds apart (start to start); the head waits for the rest of that interval. Only the head
  is ever sent, so pacing delays messages and never reorders them.

A retry that is backing off is not decided here: the head query already says how long it
waits, and the longer of the two waits wins in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from inturn.worker.spec.schedule import Schedule

Hold = Literal["window", "throttle"]


@dataclass(frozen=True)
class Gate:
    """The answer.

    Attributes:
        send: the head may be sent now.
        wait_seconds: when not, how long to wait before asking again (> 0).
        hold: why not: ``window`` (outside the schedule) or ``throttle``; None when ``send``.
        until: for ``window``, when the next opening starts (UTC), or None if none is known.
    """

    send: bool
    wait_seconds: float = 0.0
    hold: Hold | None = None
    until: datetime | None = None


#: The answer when the head may go now (a destination without a window or a throttle).
OPEN = Gate(True)

#: Longest single wait for a window, in seconds: the worker looks again at least this often
#: (a clock step or a schedule with a far opening never sleeps it for days at once).
MAX_WINDOW_WAIT_SECONDS = 300.0


def may_send(
    *,
    now: datetime,
    monotonic: float,
    schedule: Schedule | None = None,
    messages_per_second: int | None = None,
    last_send: float | None = None,
) -> Gate:
    """Decide whether the head may be sent at ``now``.

    Args:
        now: the wall-clock instant (aware), judged against ``schedule``.
        monotonic: ``time.monotonic()`` at the same moment, judged against ``last_send``.
        schedule: the delivery window; None sends at any time.
        messages_per_second: the throttle (1 or more); None does not pace.
        last_send: ``time.monotonic()`` when the previous attempt started, or None.

    Returns:
        A :class:`Gate`. ``wait_seconds`` is at most :data:`MAX_WINDOW_WAIT_SECONDS` for a
        window and at most ``1 / messages_per_second`` for the throttle.

    Raises:
        ValueError: ``now`` is naive, or ``messages_per_second`` is below 1.
    """
    if schedule is not None:
        state = schedule.state(now)
        if not state.open:
            wait = MAX_WINDOW_WAIT_SECONDS
            if state.until is not None:
                wait = min(wait, max((state.until - now).total_seconds(), 0.001))
            return Gate(False, wait, "window", state.until)
    if messages_per_second is not None:
        if messages_per_second < 1:
            raise ValueError("messages_per_second must be at least 1")
        if last_send is not None:
            due = last_send + 1.0 / messages_per_second
            if monotonic < due:
                return Gate(False, due - monotonic, "throttle")
    return OPEN
