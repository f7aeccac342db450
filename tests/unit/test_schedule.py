"""Weekly schedules and the worker's gate (window, throttle): table tests, DST included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from inturn.worker.drain.gate import MAX_WINDOW_WAIT_SECONDS, may_send
from inturn.worker.spec.destination import (
    ManifestError,
    load_manifest,
    load_worker_config,
    render_worker_config,
)
from inturn.worker.spec.schedule import ScheduleError, parse, to_spec
from tests.support.manifests import destination, mllp

WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri"]


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


OFFICE = {
    "timeZone": "Europe/Berlin",
    "windows": [{"days": WEEKDAYS, "start": "06:00", "end": "22:00"}],
}
NIGHT = {
    "timeZone": "Europe/Berlin",
    "windows": [{"days": ["Sat"], "start": "22:00", "end": "06:00"}],
}
EARLY_SUNDAY = {
    "timeZone": "Europe/Berlin",
    "windows": [{"days": ["Sun"], "start": "01:00", "end": "04:00"}],
}
ALWAYS = {
    "timeZone": "UTC",
    "windows": [
        {
            "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
            "start": "00:00",
            "end": "24:00",
        }
    ],
}
NEW_YORK = {
    "timeZone": "America/New_York",
    "windows": [{"days": ["Sun"], "start": "00:30", "end": "03:30"}],
}

# (schedule, instant, open, since, until) -- instants and expectations in UTC or with offsets.
CASES = [
    # Berlin in winter is UTC+1: 06:00 local is 05:00Z.
    (OFFICE, "2026-12-01T04:59:59+00:00", False, None, "2026-12-01T05:00:00+00:00"),
    (
        OFFICE,
        "2026-12-01T05:00:00+00:00",
        True,
        "2026-12-01T05:00:00+00:00",
        "2026-12-01T21:00:00+00:00",
    ),
    (
        OFFICE,
        "2026-12-01T20:59:59+00:00",
        True,
        "2026-12-01T05:00:00+00:00",
        "2026-12-01T21:00:00+00:00",
    ),
    (OFFICE, "2026-12-01T21:00:00+00:00", False, None, "2026-12-02T05:00:00+00:00"),
    # Friday night: the next opening is Monday.
    (OFFICE, "2026-12-04T21:30:00+00:00", False, None, "2026-12-07T05:00:00+00:00"),
    # In summer Berlin is UTC+2.
    (
        OFFICE,
        "2026-07-01T04:30:00+00:00",
        True,
        "2026-07-01T04:00:00+00:00",
        "2026-07-01T20:00:00+00:00",
    ),
    # Across midnight: Saturday 22:00 to Sunday 06:00.
    (
        NIGHT,
        "2026-12-06T02:00:00+00:00",
        True,
        "2026-12-05T21:00:00+00:00",
        "2026-12-06T05:00:00+00:00",
    ),
    (NIGHT, "2026-12-06T05:00:00+00:00", False, None, "2026-12-12T21:00:00+00:00"),
    # Spring forward (Berlin, 29 March 2026, 02:00 -> 03:00): 01:00-04:00 lasts two hours.
    (
        EARLY_SUNDAY,
        "2026-03-29T00:30:00+00:00",
        True,
        "2026-03-29T00:00:00+00:00",
        "2026-03-29T02:00:00+00:00",
    ),
    (EARLY_SUNDAY, "2026-03-29T02:00:00+00:00", False, None, "2026-04-04T23:00:00+00:00"),
    # Fall back (Berlin, 25 October 2026, 03:00 -> 02:00): 01:00-04:00 lasts four hours.
    (
        EARLY_SUNDAY,
        "2026-10-25T02:30:00+00:00",
        True,
        "2026-10-24T23:00:00+00:00",
        "2026-10-25T03:00:00+00:00",
    ),
    (EARLY_SUNDAY, "2026-10-25T03:00:00+00:00", False, None, "2026-11-01T00:00:00+00:00"),
    # New York springs forward on 8 March 2026 at 02:00: 00:30-03:30 EST/EDT is 05:30Z-07:30Z.
    (
        NEW_YORK,
        "2026-03-08T07:00:00+00:00",
        True,
        "2026-03-08T05:30:00+00:00",
        "2026-03-08T07:30:00+00:00",
    ),
    (NEW_YORK, "2026-03-08T07:30:00+00:00", False, None, "2026-03-15T04:30:00+00:00"),
    # Open at all times: neither since nor until.
    (ALWAYS, "2026-12-01T12:00:00+00:00", True, None, None),
]


@pytest.mark.parametrize(("spec", "at", "is_open", "since", "until"), CASES)
def test_schedule_state(
    spec: dict, at: str, is_open: bool, since: str | None, until: str | None
) -> None:
    state = parse(spec).state(_utc(at))
    assert state.open is is_open
    assert state.since == (None if since is None else _utc(since))
    assert state.until == (None if until is None else _utc(until))


def test_touching_windows_are_one_opening() -> None:
    split = parse(
        {
            "timeZone": "UTC",
            "windows": [
                {"days": ["Mon"], "start": "20:00", "end": "24:00"},
                {"days": ["Tue"], "start": "00:00", "end": "04:00"},
            ],
        }
    )
    state = split.state(_utc("2026-12-01T01:00:00+00:00"))  # a Tuesday
    assert state.since == _utc("2026-11-30T20:00:00+00:00")
    assert state.until == _utc("2026-12-01T04:00:00+00:00")


def test_start_equal_to_end_is_a_whole_day() -> None:
    day = parse(
        {"timeZone": "UTC", "windows": [{"days": ["Tue"], "start": "08:00", "end": "08:00"}]}
    )
    state = day.state(_utc("2026-12-02T07:59:00+00:00"))  # Wednesday morning
    assert state.open
    assert state.until == _utc("2026-12-02T08:00:00+00:00")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {
                "timeZone": "Mars/Olympus",
                "windows": [{"days": ["Mon"], "start": "01:00", "end": "02:00"}],
            },
            "timeZone",
        ),
        ({"timeZone": "UTC", "windows": []}, "windows"),
        (
            {
                "timeZone": "UTC",
                "windows": [{"days": ["Monday"], "start": "01:00", "end": "02:00"}],
            },
            "windows[0].days",
        ),
        (
            {"timeZone": "UTC", "windows": [{"days": ["Mon"], "start": "24:00", "end": "02:00"}]},
            "windows[0].start",
        ),
        (
            {"timeZone": "UTC", "windows": [{"days": ["Mon"], "start": "01:00", "end": "25:00"}]},
            "windows[0].end",
        ),
    ],
)
def test_bad_schedules_name_the_field(spec: dict, message: str) -> None:
    with pytest.raises(ScheduleError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(spec)


def test_spec_round_trip() -> None:
    assert to_spec(parse(OFFICE)) == OFFICE


def test_gate_outside_the_window_holds_until_the_opening() -> None:
    schedule = parse(OFFICE)
    gate = may_send(now=_utc("2026-12-01T04:58:00+00:00"), monotonic=0.0, schedule=schedule)
    assert (gate.send, gate.hold, gate.until) == (
        False,
        "window",
        _utc("2026-12-01T05:00:00+00:00"),
    )
    assert gate.wait_seconds == 120.0
    far = may_send(now=_utc("2026-12-04T21:30:00+00:00"), monotonic=0.0, schedule=schedule)
    assert far.wait_seconds == MAX_WINDOW_WAIT_SECONDS


def test_gate_throttle_paces_sends() -> None:
    assert may_send(
        now=_utc("2026-12-01T12:00:00+00:00"), monotonic=10.0, messages_per_second=4
    ).send
    gate = may_send(
        now=_utc("2026-12-01T12:00:00+00:00"), monotonic=10.1, messages_per_second=4, last_send=10.0
    )
    assert (gate.send, gate.hold) == (False, "throttle")
    assert gate.wait_seconds == pytest.approx(0.15)
    later = may_send(
        now=_utc("2026-12-01T12:00:00+00:00"),
        monotonic=10.25,
        messages_per_second=4,
        last_send=10.0,
    )
    assert later.send


def test_gate_window_before_throttle() -> None:
    gate = may_send(
        now=_utc("2026-12-01T03:00:00+00:00"),
        monotonic=10.0,
        schedule=parse(OFFICE),
        messages_per_second=1,
        last_send=9.9,
    )
    assert gate.hold == "window"


def _manifest(**spec: Any) -> dict[str, Any]:
    return destination("lab", sender=mllp("lab"), max_attempts=0, **spec)


def test_a_manifest_carries_schedule_and_throttle_to_the_worker() -> None:
    cfg = load_manifest(_manifest(schedule=OFFICE, throttle={"messagesPerSecond": 5}))
    assert cfg.schedule == parse(OFFICE)
    assert cfg.messages_per_second == 5
    rendered = render_worker_config(cfg)
    assert rendered["schedule"] == OFFICE and rendered["throttle"] == {"messagesPerSecond": 5}
    assert load_worker_config(rendered) == cfg


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"schedule": {**OFFICE, "timeZone": "Europe/Atlantis"}}, "spec.schedule.timeZone"),
        ({"schedule": {**OFFICE, "windows": []}}, "spec.schedule.windows"),
        (
            {
                "schedule": {
                    "timeZone": "UTC",
                    "windows": [{"days": ["Mon"], "start": "24:00", "end": "01:00"}],
                }
            },
            "spec.schedule.windows[0].start",
        ),
        ({"throttle": {"messagesPerSecond": 0}}, "spec.throttle.messagesPerSecond"),
    ],
)
def test_bad_schedules_and_throttles_are_refused_by_field(spec: dict, problem: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest(_manifest(**spec))
    assert any(e.startswith(problem) for e in caught.value.errors), caught.value.errors
