"""Weekly schedules in a time zone: when a destination may be sent to, when a feed should be busy.

A schedule is a time zone (an IANA name such as ``Europe/Berlin``) and a list of windows; each
window names weekdays and a start and end in local wall time (``HH:MM``, end ``24:00`` allowed).
A window whose end is not after its start runs past midnight into the next day (``22:00`` to
``06:00`` on ``Fri`` is Friday 22:00 to Saturday 06:00); start equal to end is a whole 24 hours.
Windows that overlap or touch form one opening: a schedule of every day ``00:00``-``24:00`` is
always open, and its opening never "starts" at midnight.

Wall times are turned into instants with :mod:`zoneinfo` (IANA tz database), so daylight saving
time is the zone's own: a window from 01:00 to 04:00 in Europe/Berlin lasts 2 hours on the
spring-forward night and 4 on the fall-back night. A wall time that does not exist (inside the
skipped hour) is read with the offset before the change (``fold=0``, PEP 495): 02:30 on the
spring-forward night is 03:30 local summer time; a wall time that happens twice is its first
occurrence.

Pure: no clock, no I/O. Every function takes the instant to judge at (aware, any zone).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from inturn.worker.errors import Invalid

#: Weekday names as the schema spells them, Monday first (``datetime.weekday()`` order).
DAYS: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
#: ``HH:MM`` from 00:00 to 23:59 (a start), or 24:00 (an end only).
TIME_PATTERN = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"
#: An IANA zone name: letters, digits and ``/_+-`` (existence is checked by :func:`parse`).
ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$"
#: Most windows in one schedule.
MAX_WINDOWS = 32
#: How far around an instant openings are looked for, in days: a week and a day either side
#: covers every weekly pattern, including a window that wraps past Sunday midnight.
HORIZON_DAYS = 8

_TIME = re.compile(TIME_PATTERN)


class ScheduleError(Invalid):
    """A schedule that cannot be used: unknown time zone, bad day or time. The message names
    the field (``timeZone``, ``windows[1].start``)."""


@dataclass(frozen=True)
class Window:
    """One weekly window.

    Attributes:
        days: weekdays it starts on, 0 = Monday .. 6 = Sunday.
        start: minutes after local midnight, 0..1439.
        end: minutes after local midnight, 1..1440; not after ``start``: it ends the next day.
    """

    days: frozenset[int]
    start: int
    end: int

    @property
    def length(self) -> int:
        """Minutes the window lasts on the wall clock (1..1440)."""
        return self.end - self.start if self.end > self.start else self.end + 1440 - self.start


@dataclass(frozen=True)
class Schedule:
    """A weekly schedule in a time zone (see the module docstring).

    Attributes:
        zone: the IANA time zone name.
        windows: the weekly windows (at least one).
    """

    zone: str
    windows: tuple[Window, ...]

    def tz(self) -> ZoneInfo:
        """The :class:`zoneinfo.ZoneInfo` of :attr:`zone`."""
        return ZoneInfo(self.zone)

    def openings(self, at: datetime) -> list[tuple[datetime, datetime]]:
        """Merged openings ``(start, end)`` (UTC, end exclusive) from about
        :data:`HORIZON_DAYS` days before ``at`` to as many after, in order."""
        tz = self.tz()
        local_day = at.astimezone(tz).date()
        spans: list[tuple[datetime, datetime]] = []
        for offset in range(-HORIZON_DAYS, HORIZON_DAYS + 1):
            day = local_day + timedelta(days=offset)
            for w in self.windows:
                if day.weekday() not in w.days:
                    continue
                start = _instant(day, w.start, tz)
                end_day = day if w.end > w.start else day + timedelta(days=1)
                end = _instant(end_day, w.end, tz)
                if end > start:  # a window inside a skipped hour has no instants
                    spans.append((start, end))
        spans.sort()
        merged: list[tuple[datetime, datetime]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                if end > merged[-1][1]:
                    merged[-1] = (merged[-1][0], end)
            else:
                merged.append((start, end))
        return merged

    def state(self, at: datetime) -> ScheduleState:
        """Whether the schedule is open at ``at``, and since and until when.

        An opening that reaches the edge of the :data:`HORIZON_DAYS` horizon on a side lasts a
        whole week and more, which only a schedule open at all times does: its ``since`` (or
        ``until``) is None.

        Raises:
            ValueError: ``at`` is naive.
        """
        if at.tzinfo is None:
            raise ValueError("at must be an aware datetime")
        at_utc = at.astimezone(UTC)
        spans = self.openings(at_utc)
        for i, (start, end) in enumerate(spans):
            if start <= at_utc < end:
                since = None if i == 0 and at_utc - start > timedelta(days=7) else start
                until = None if i == len(spans) - 1 and end - at_utc > timedelta(days=7) else end
                return ScheduleState(True, since, until)
            if at_utc < start:
                return ScheduleState(False, None, start)
        return ScheduleState(False, None, None)  # pragma: no cover - a window opens weekly


@dataclass(frozen=True)
class ScheduleState:
    """A schedule judged at one instant.

    Attributes:
        open: the instant is inside an opening.
        since: when the current opening began (UTC), or None when it is open at all times;
            None when closed.
        until: when open, when it closes (None: never); when closed, when it next opens.
    """

    open: bool
    since: datetime | None
    until: datetime | None


def _instant(day: date, minutes: int, tz: ZoneInfo) -> datetime:
    """The UTC instant of wall time ``minutes`` after midnight of ``day`` in ``tz`` (``fold=0``;
    1440 is the next midnight)."""
    if minutes >= 1440:
        day, minutes = day + timedelta(days=1), minutes - 1440
    wall = datetime.combine(day, time(minutes // 60, minutes % 60), tzinfo=tz)
    return wall.astimezone(UTC)


def _minutes(text: str, where: str, *, end: bool) -> int:
    if not isinstance(text, str) or not _TIME.match(text) or (text == "24:00" and not end):
        allowed = "00:00 to 24:00" if end else "00:00 to 23:59"
        raise ScheduleError(f"{where}: {text!r} is not a time HH:MM from {allowed}")
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def parse(node: Mapping[str, Any]) -> Schedule:
    """Build a :class:`Schedule` from its spec form (``spec.schedule`` of a Destination, a
    feed's ``schedule``)::

        {"timeZone": "Europe/Berlin",
         "windows": [{"days": ["Mon", "Fri"], "start": "06:00", "end": "22:00"}]}

    Raises:
        ScheduleError: an unknown time zone, no window, an unknown day or a bad time (the
            message names the field).
    """
    zone = node.get("timeZone")
    if not isinstance(zone, str) or not re.match(ZONE_PATTERN, zone):
        raise ScheduleError(f"timeZone: {zone!r} is not an IANA time zone name")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"timeZone: {zone!r} is not in the IANA time zone database") from None
    raw = node.get("windows")
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ScheduleError("windows: at least one window is required")
    if len(raw) > MAX_WINDOWS:
        raise ScheduleError(f"windows: at most {MAX_WINDOWS} windows")
    windows: list[Window] = []
    for i, w in enumerate(raw):
        where = f"windows[{i}]"
        days = w.get("days") if isinstance(w, Mapping) else None
        if not isinstance(days, Sequence) or isinstance(days, str) or not days:
            raise ScheduleError(f"{where}.days: at least one day is required")
        unknown = [d for d in days if d not in DAYS]
        if unknown:
            raise ScheduleError(f"{where}.days: {unknown[0]!r} is not one of {', '.join(DAYS)}")
        windows.append(
            Window(
                days=frozenset(DAYS.index(d) for d in days),
                start=_minutes(w.get("start"), f"{where}.start", end=False),
                end=_minutes(w.get("end"), f"{where}.end", end=True),
            )
        )
    return Schedule(zone=zone, windows=tuple(windows))


def to_spec(schedule: Schedule) -> dict[str, Any]:
    """The spec form of ``schedule`` (the inverse of :func:`parse`, days in week order)."""

    def hhmm(minutes: int) -> str:
        return f"{minutes // 60:02d}:{minutes % 60:02d}"

    return {
        "timeZone": schedule.zone,
        "windows": [
            {
                "days": [DAYS[d] for d in sorted(w.days)],
                "start": hhmm(w.start),
                "end": hhmm(w.end),
            }
            for w in schedule.windows
        ],
    }


def held_until(node: Mapping[str, Any] | None, at: datetime) -> datetime | None:
    """For a schedule in spec form (or None): when it next opens if ``at`` is outside it, else
    None. A schedule that cannot be read holds nothing (None): it was checked when applied."""
    if node is None:
        return None
    try:
        state = parse(node).state(at)
    except ScheduleError:
        return None
    return None if state.open else state.until
