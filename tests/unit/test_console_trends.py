"""The console's trends (pure): the bounded history of snapshots and its SVG pictures."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from inturn.worker.console.trends import (
    DAY_SAMPLES,
    HOUR_SAMPLES,
    HOUR_STEP,
    History,
    Mark,
    Ring,
    day_chart,
    feed_key,
    hour_sparkline,
)

SVG = "{http://www.w3.org/2000/svg}"
NOW = 1_780_000_200.0  # a multiple of 30 and of 300 seconds, so buckets start on it


def parse(markup: str) -> ET.Element:
    return ET.fromstring(str(markup))


def test_a_step_keeps_the_largest_values_it_saw() -> None:
    ring = Ring(30.0, 4)
    ring.add(NOW, 3, 10.0)
    ring.add(NOW + 10, 7, 5.0)
    ring.add(NOW + 29, 1, 40.0)
    (point,) = ring.points()
    assert (point.at, point.a, point.b) == (NOW, 7, 40.0)


def test_a_ring_holds_its_capacity_and_drops_the_oldest() -> None:
    ring = Ring(30.0, 4)
    for k in range(10):
        ring.add(NOW + 30 * k, k, 0.0)
    assert [p.a for p in ring.points()] == [6, 7, 8, 9]
    assert [p.a for p in ring.points(since=NOW + 30 * 8)] == [8, 9]


def test_a_clock_that_goes_back_adds_nothing_out_of_order() -> None:
    ring = Ring(30.0, 4)
    ring.add(NOW, 1, 0.0)
    ring.add(NOW - 300, 99, 0.0)
    assert [p.a for p in ring.points()] == [1]


def test_the_history_keeps_an_hour_and_a_day_at_their_steps() -> None:
    history = History()
    for k in range(2 * 86400 // 30):  # two days of snapshots every 30 s
        history.record(NOW - 2 * 86400 + 30 * k, [("ward/lab", k % 7, 60.0)])
    now = NOW - 30
    assert len(history.hour("ward/lab", now)) == HOUR_SAMPLES
    assert len(history.day("ward/lab", now)) == DAY_SAMPLES
    assert all(p.a == 6 for p in history.day("ward/lab", now))  # the largest of each 5 min
    assert history.hour("ward/other", now) == []


def test_the_number_of_series_is_bounded_and_the_stalest_goes() -> None:
    history = History(max_series=3)
    for name in ("a/1", "a/2", "a/3"):
        history.add(name, NOW, 1, 1.0)
    history.add("a/1", NOW + 30, 2, 2.0)  # a/1 is fresh again
    history.add("a/4", NOW + 30, 1, 1.0)
    assert len(history) == 3
    assert history.hour("a/2", NOW + 60) == []
    assert history.hour("a/1", NOW + 60)


def test_feeds_keep_their_quiet_seconds_as_the_line() -> None:
    history = History()
    history.record(NOW, [], [("adt/LAB", 120.0)])
    (point,) = history.hour(feed_key("adt/LAB"), NOW)
    assert (point.a, point.b) == (0.0, 120.0)


def test_the_sparkline_is_svg_without_script_and_draws_what_was_seen() -> None:
    points = []
    history = History()
    for k in range(120):  # stuck from the middle of the hour: pending and age climb
        stuck = k >= 60
        history.add(
            "ward/lab", NOW - 3600 + 30 * k, k - 59 if stuck else 0, 30.0 * (k - 59) if stuck else 0
        )
    points = history.hour("ward/lab", NOW)
    svg = parse(hour_sparkline(points, now=NOW, label="ward/lab <b>", threshold=900.0))
    assert svg.tag == f"{SVG}svg"
    assert svg.get("width") == "120" and svg.get("height") == "24"
    assert svg.get("aria-label") == "ward/lab <b>"  # escaped in the text, whole in the tree
    assert not list(svg.iter(f"{SVG}script"))
    title = svg.find(f"{SVG}title")
    assert title is not None
    assert title.text == "ward/lab <b>: pending max 60, now 60; oldest max 30m, now 30m"
    assert len(svg.findall(f"{SVG}polygon")) == 1
    assert len(svg.findall(f"{SVG}polyline")) == 1
    (threshold,) = [e for e in svg.iter(f"{SVG}line") if e.get("class") == "threshold"]
    # 900 s of a 1800 s scale: half way up the 22-pixel plot
    assert float(threshold.get("y1") or 0) == 12.0


def test_a_gap_in_the_snapshots_is_a_gap_in_the_picture() -> None:
    history = History()
    for k in list(range(0, 40)) + list(range(80, 120)):  # the console was down in between
        history.add("ward/lab", NOW - 3600 + HOUR_STEP * k, 5, 10.0)
    svg = parse(hour_sparkline(history.hour("ward/lab", NOW), now=NOW, label="x"))
    assert len(svg.findall(f"{SVG}polygon")) == 2
    assert len(svg.findall(f"{SVG}polyline")) == 2


def test_nothing_seen_yet_says_so() -> None:
    svg = parse(hour_sparkline([], now=NOW, label="ward/lab"))
    title = svg.find(f"{SVG}title")
    assert title is not None and title.text == "ward/lab: no snapshot yet"
    assert svg.findall(f"{SVG}polygon") == []


def test_the_day_chart_marks_attempts_and_names_the_hours() -> None:
    history = History()
    for k in range(288):
        history.add("ward/lab", NOW - 86400 + 300 * k, 3, 100.0)
    marks = [Mark(NOW - 3600, "retry"), Mark(NOW - 1800, "failed"), Mark(NOW - 2 * 86400, "retry")]
    svg = parse(day_chart(history.day("ward/lab", NOW), marks, now=NOW, label="ward/lab, day"))
    assert svg.get("width") == "720"
    classes = [e.get("class") for e in svg.iter(f"{SVG}line")]
    assert classes.count("mark mark-retry") == 1  # the one older than the day is left out
    assert classes.count("mark mark-failed") == 1
    hours = [t.text for t in svg.iter(f"{SVG}text") if t.text and ":" in t.text]
    assert len(hours) == 8 and all(len(h) == 5 for h in hours)  # every 3 h, HH:MM


def test_a_picture_is_drawn_again_only_when_its_series_or_interval_changes() -> None:
    history = History()
    history.add("ward/lab", NOW, 2, 10.0)
    first = history.hour_picture("ward/lab", NOW + 1, label="ward/lab")
    assert history.hour_picture("ward/lab", NOW + 2, label="ward/lab") is first
    history.add("ward/lab", NOW + 3, 1, 5.0)  # smaller than the interval's maxima: no change
    assert history.hour_picture("ward/lab", NOW + 4, label="ward/lab") is first
    history.add("ward/lab", NOW + 5, 3, 5.0)  # a new maximum
    second = history.hour_picture("ward/lab", NOW + 6, label="ward/lab")
    assert second is not first and "pending max 3" in second
    assert history.hour_picture("ward/lab", NOW + 31, label="ward/lab") is not second  # next 30 s
    assert "no snapshot yet" in history.hour_picture("ward/none", NOW, label="ward/none")
