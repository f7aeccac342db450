"""Trends: a bounded history of the console's snapshots, drawn as small SVG pictures (pure).

The console takes a snapshot of every destination and feed every few seconds
(:mod:`.feed`); :class:`History` keeps what they said over time, so that "draining", "stuck
since 14:02" and "flapping" can be seen rather than read. Each series (one destination, or
one feed) holds two rings of fixed size:

* the last hour, one sample per :data:`HOUR_STEP` seconds (120 samples);
* the last day, one sample per :data:`DAY_STEP` seconds (288 samples).

A sample keeps the largest values the snapshots of its interval saw (a message that waited a
minute inside a 30 s interval is not smoothed away). At most :data:`MAX_SERIES` series are
kept; the one updated longest ago goes first. A series costs about 10 KiB, so a thousand
destinations cost about 10 MiB. The history lives in the console's memory: it starts empty
when the console starts, and shows only what this console saw.

The pictures are SVG written here, with no script: pending messages as a filled area (its own
scale), the oldest pending message's age as a line (its own scale, with the stuck threshold
dashed when it fits), time from left (the start of the span) to right (now). An interval in
which the console took no snapshot leaves a gap. Every number is formatted here and every text
is escaped; nothing of a payload is ever in a snapshot.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape

from inturn.worker.text.durations import format_age

#: Seconds per sample of the hour view, and samples kept.
HOUR_STEP = 30.0
HOUR_SAMPLES = 120
#: Seconds per sample of the day view, and samples kept.
DAY_STEP = 300.0
DAY_SAMPLES = 288
#: Most series kept (destinations plus feeds).
MAX_SERIES = 10_000

#: Colours: pending (area), age (line), threshold (dashed), attempt marks by outcome.
PENDING_FILL = "#9cc3ee"
PENDING_STROKE = "#3d7cc9"
AGE_STROKE = "#c0392b"
THRESHOLD_STROKE = "#c0392b"
MARK_COLOURS = {"retry": "#e08e0b", "failed": "#c0392b"}


@dataclass(frozen=True)
class Point:
    """One sample: the start of its interval (seconds since the epoch) and the largest
    values seen in it (``a``: pending or quiet seconds; ``b``: oldest age in seconds)."""

    at: float
    a: float
    b: float


class Ring:
    """A fixed-capacity ring of samples, one per ``step`` seconds, max-merged within a step."""

    __slots__ = ("_a", "_at", "_b", "_next", "_size", "capacity", "step", "version")

    def __init__(self, step: float, capacity: int) -> None:
        self.step = step
        self.capacity = capacity
        self._at = array("d", bytes(8 * capacity))
        self._a = array("d", bytes(8 * capacity))
        self._b = array("d", bytes(8 * capacity))
        self._next = 0
        self._size = 0
        #: Counts the changes, so that a picture of the ring can be reused until it changes.
        self.version = 0

    def add(self, now: float, a: float, b: float) -> None:
        """Record values seen at ``now`` (seconds since the epoch)."""
        bucket = math.floor(now / self.step) * self.step
        last = (self._next - 1) % self.capacity
        if self._size and self._at[last] == bucket:
            if a > self._a[last] or b > self._b[last]:
                self._a[last] = max(self._a[last], a)
                self._b[last] = max(self._b[last], b)
                self.version += 1
            return
        if self._size and bucket < self._at[last]:
            return  # the clock went back: keep the order
        i = self._next
        self._at[i], self._a[i], self._b[i] = bucket, a, b
        self._next = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)
        self.version += 1

    def points(self, since: float = -math.inf) -> list[Point]:
        """The samples whose interval starts at or after ``since``, oldest first."""
        start = (self._next - self._size) % self.capacity
        out = []
        for k in range(self._size):
            i = (start + k) % self.capacity
            if self._at[i] >= since:
                out.append(Point(self._at[i], self._a[i], self._b[i]))
        return out


class Series:
    """One destination's or feed's hour and day rings, and its last hour's picture."""

    __slots__ = ("day", "hour", "picture")

    def __init__(self) -> None:
        self.hour = Ring(HOUR_STEP, HOUR_SAMPLES)
        self.day = Ring(DAY_STEP, DAY_SAMPLES)
        self.picture: tuple[Any, Markup] | None = None

    def add(self, now: float, a: float, b: float) -> None:
        self.hour.add(now, a, b)
        self.day.add(now, a, b)


class History:
    """Bounded history of snapshots, keyed by series name (see the module's description).

    Keys: ``destination`` names as they are (``namespace/name``) and ``feed:<channel>`` or
    ``feed:<channel>/<sender>`` for feeds.
    """

    def __init__(self, max_series: int = MAX_SERIES) -> None:
        self.max_series = max_series
        self._series: OrderedDict[str, Series] = OrderedDict()

    def __len__(self) -> int:
        return len(self._series)

    def add(self, key: str, now: float, a: float, b: float = 0.0) -> None:
        """Record one series' values at ``now`` (seconds since the epoch)."""
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Series()
            while len(self._series) > self.max_series:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(key)
        series.add(now, a, b)

    def record(
        self,
        now: float,
        destinations: Iterable[tuple[str, int, float]],
        feeds: Iterable[tuple[str, float]] = (),
    ) -> None:
        """Record one snapshot: ``(destination, pending, oldest_seconds)`` per destination and
        ``(feed, quiet_seconds)`` per feed (``feed`` is ``channel`` or ``channel/sender``; its
        quiet seconds are kept as ``b``, the line)."""
        for name, pending, oldest in destinations:
            self.add(name, now, float(pending), float(oldest))
        for name, quiet in feeds:
            self.add(feed_key(name), now, 0.0, float(quiet))

    def hour(self, key: str, now: float) -> list[Point]:
        """The last hour of ``key`` (empty when never seen)."""
        series = self._series.get(key)
        return series.hour.points(now - 3600.0) if series else []

    def day(self, key: str, now: float) -> list[Point]:
        """The last day of ``key`` (empty when never seen)."""
        series = self._series.get(key)
        return series.day.points(now - 86400.0) if series else []

    def hour_picture(
        self,
        key: str,
        now: float,
        *,
        label: str,
        threshold: float | None = None,
        area_name: str = "pending",
        line_name: str = "oldest",
    ) -> Markup:
        """:func:`hour_sparkline` of ``key``'s last hour, ending with the interval that holds
        ``now``. Drawn again only when the series or the interval changes: a thousand idle
        destinations cost a thousand lookups per snapshot, not a thousand drawings."""
        end = (math.floor(now / HOUR_STEP) + 1) * HOUR_STEP
        series = self._series.get(key)
        style = (label, threshold, area_name, line_name)
        if series is None:
            return hour_sparkline([], now=end, label=label, line_name=line_name)
        signature = (series.hour.version, end, style)
        if series.picture is not None and series.picture[0] == signature:
            return series.picture[1]
        picture = hour_sparkline(
            series.hour.points(end - 3600.0),
            now=end,
            label=label,
            threshold=threshold,
            area_name=area_name,
            line_name=line_name,
        )
        series.picture = (signature, picture)
        return picture


def feed_key(feed: str) -> str:
    """The history key of a feed (``channel`` or ``channel/sender``)."""
    return f"feed:{feed}"


def feed_name(channel: str, sender: str) -> str:
    """A feed's name: ``channel``, or ``channel/sender`` for one sender of a channel."""
    return f"{channel}/{sender}" if sender else channel


# --- drawing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """An event drawn as a tick at the bottom of a chart: when (seconds since the epoch) and
    its outcome (a key of :data:`MARK_COLOURS`)."""

    at: float
    outcome: str


def _num(value: float) -> str:
    """A number as the pictures write it: to a tenth, without trailing zeros."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _px(value: float) -> str:
    """A coordinate, to the whole pixel (the pictures are drawn at their size)."""
    return str(round(value))


def _runs(points: Sequence[Point], step: float) -> list[list[Point]]:
    """``points`` split where one or more intervals are missing."""
    runs: list[list[Point]] = []
    for p in points:
        if runs and p.at - runs[-1][-1].at <= step * 1.5:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def chart(
    points: Sequence[Point],
    *,
    now: float,
    span: float,
    step: float,
    width: int,
    height: int,
    label: str,
    threshold: float | None = None,
    area_name: str = "pending",
    line_name: str = "oldest",
    marks: Sequence[Mark] = (),
    axis: bool = False,
) -> Markup:
    """An SVG picture of ``points`` over the ``span`` seconds before ``now``.

    Args:
        points: samples oldest first (see :class:`History`), ``step`` seconds apart.
        width, height: the picture's size in CSS pixels.
        label: what it shows, for its ``<title>`` and ``aria-label`` (escaped here).
        threshold: drawn dashed on the line's scale (seconds), when given.
        area_name, line_name: what ``a`` (drawn as an area) and ``b`` (a line) are, for the
            title; an empty name draws no area (no line).
        marks: ticks under the plot (attempts); only with ``axis``, which leaves room for them.
        axis: draw hour ticks with UTC times, and each scale's maximum (for large charts).

    Returns:
        The ``<svg>`` element as safe markup.
    """
    bottom = height - (22 if axis else 1)
    top = 10 if axis else 1
    left, right = (30, width - 34) if axis else (1, width - 1)
    start = now - span
    a_max = max((p.a for p in points), default=0.0)
    b_max = max((p.b for p in points), default=0.0)
    a_scale = max(a_max, 1.0)
    b_scale = max(b_max, threshold or 0.0, 1.0) if line_name else 1.0

    def x(at: float) -> float:
        return left + (right - left) * min(max((at - start) / span, 0.0), 1.0)

    def y(value: float, scale: float) -> float:
        return bottom - (bottom - top) * min(value / scale, 1.0)

    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="trend" width="{width}"'
        f' height="{height}" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="{escape(label)}">'
    ]
    said = []
    if area_name:
        said.append(
            f"{area_name} max {_num(a_max)}" + (f", now {_num(points[-1].a)}" if points else "")
        )
    if line_name:
        said.append(
            f"{line_name} max {format_age(b_max)}"
            + (f", now {format_age(points[-1].b)}" if points else "")
        )
    summary = f"{label}: {'; '.join(said)}"
    if not points:
        summary = f"{label}: no snapshot yet"
    parts.append(f"<title>{escape(summary)}</title>")
    parts.append(
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}"'
        ' fill="#f7f9fb" stroke="#dde3ea" stroke-width="0.5"/>'
    )
    if axis:
        first = math.ceil(start / 10800) * 10800
        tick = first
        while tick <= now:
            tx = _num(x(tick))
            parts.append(
                f'<line x1="{tx}" y1="{top}" x2="{tx}" y2="{bottom}" stroke="#dde3ea"'
                ' stroke-width="0.5"/>'
            )
            hhmm = datetime.fromtimestamp(tick, UTC).strftime("%H:%M")
            parts.append(
                f'<text x="{tx}" y="{height - 3}" font-size="9" text-anchor="middle"'
                f' fill="#5b6670">{hhmm}</text>'
            )
            tick += 10800
        if area_name:
            parts.append(
                f'<text x="{left - 3}" y="{top + 7}" font-size="9" text-anchor="end"'
                f' fill="{PENDING_STROKE}">{_num(a_max)}</text>'
            )
        if line_name:
            parts.append(
                f'<text x="{right + 3}" y="{top + 7}" font-size="9" fill="{AGE_STROKE}">'
                f"{escape(format_age(b_scale))}</text>"
            )
    for run in _runs(points, step):
        xs = [_px(x(p.at + step / 2)) for p in run]
        if len(run) == 1:  # a lone sample: a short bar
            mid = x(run[0].at + step / 2)
            xs = [_px(mid - 1.0), _px(mid + 1.0)]
            run = [run[0], run[0]]
        if area_name:
            top_edge = " ".join(
                f"{px},{_px(y(p.a, a_scale))}" for px, p in zip(xs, run, strict=True)
            )
            parts.append(
                f'<polygon points="{xs[0]},{_px(bottom)} {top_edge} {xs[-1]},{_px(bottom)}"'
                f' fill="{PENDING_FILL}" stroke="{PENDING_STROKE}" stroke-width="0.75"'
                ' class="pending"/>'
            )
        if line_name:
            line = " ".join(f"{px},{_px(y(p.b, b_scale))}" for px, p in zip(xs, run, strict=True))
            parts.append(
                f'<polyline points="{line}" fill="none" stroke="{AGE_STROKE}"'
                ' stroke-width="1.25" class="age"/>'
            )
    if line_name and threshold is not None and threshold <= b_scale:
        ty = _num(y(threshold, b_scale))
        parts.append(
            f'<line x1="{left}" y1="{ty}" x2="{right}" y2="{ty}" stroke="{THRESHOLD_STROKE}"'
            ' stroke-width="0.75" stroke-dasharray="3,2" opacity="0.6" class="threshold"/>'
        )
    for mark in marks:
        if start <= mark.at <= now:
            mx = _num(x(mark.at))
            colour = MARK_COLOURS.get(mark.outcome, "#5b6670")
            # below the plot, where no area or line can hide it
            parts.append(
                f'<line x1="{mx}" y1="{_num(bottom + 1)}" x2="{mx}" y2="{_num(bottom + 7)}"'
                f' stroke="{colour}" stroke-width="1" class="mark mark-{escape(mark.outcome)}"/>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def hour_sparkline(
    points: Sequence[Point],
    *,
    now: float,
    label: str,
    threshold: float | None = None,
    area_name: str = "pending",
    line_name: str = "oldest",
) -> Markup:
    """The overview's picture of the last hour: 120 x 24 pixels."""
    return chart(
        points,
        now=now,
        span=3600.0,
        step=HOUR_STEP,
        width=120,
        height=24,
        label=label,
        threshold=threshold,
        area_name=area_name,
        line_name=line_name,
    )


def day_chart(
    points: Sequence[Point],
    marks: Sequence[Mark],
    *,
    now: float,
    label: str,
    threshold: float | None = None,
) -> Markup:
    """The destination page's picture of the last day, attempts marked: 720 x 140 pixels."""
    return chart(
        points,
        now=now,
        span=86400.0,
        step=DAY_STEP,
        width=720,
        height=140,
        label=label,
        threshold=threshold,
        marks=marks,
        axis=True,
    )
