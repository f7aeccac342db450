"""The booking import file: shape, errors by index and field, times and time zones."""

from __future__ import annotations

import copy
from datetime import UTC, date, datetime
from typing import Any

import pytest

from inturn.worker.reservations.records import (
    BookingFileError,
    local_deadline,
    parse_bookings,
)
from tests.support.booking_data import LH400, booking

ENTRY = booking("ABC123", LH400)


def entry(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(ENTRY)
    doc.update(changes)
    return doc


def errors(doc: Any) -> list[str]:
    with pytest.raises(BookingFileError) as info:
        parse_bookings(doc)
    return list(info.value.errors)


def test_the_issue_example_reads() -> None:
    [b] = parse_bookings([ENTRY])
    assert b.locator == "ABC123" and b.owner == "FRA1A0"
    assert b.created_at == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert b.ticketing_deadline == datetime(2026, 12, 1, 17, tzinfo=UTC)
    assert b.ticketing_deadline_text == "2026-12-01T18:00:00+01:00"
    [s] = b.segments
    assert (s.number, s.carrier, s.flight, s.date, s.status) == (
        1,
        "LH",
        "400",
        date(2026, 12, 10),
        "HN",
    )
    assert s.requested_at == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert b.carriers == ("LH",)


def test_a_malformed_entry_is_named_by_index_and_field() -> None:
    bad_segment = entry(locator="XYZ789")
    del bad_segment["segments"][0]["carrier"]
    got = errors([ENTRY, entry(locator="DEF456", createdAt="yesterday"), bad_segment])
    assert got == [
        "[1].createdAt: 'yesterday' is not an RFC 3339 date-time",
        "[2].segments[0].carrier: required",
    ]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"locator": "abc"}, "[0].locator: 'abc' does not match"),
        ({"owner": 7}, "[0].owner: must be a string"),
        ({"createdAt": "2026-11-30T08:00:00"}, "[0].createdAt: '2026-11-30T08:00:00' has no UTC"),
        ({"segments": []}, "[0].segments: "),
        ({"ticketed": "no"}, "[0].ticketed: must be a boolean"),
        ({"extra": 1}, "[0].extra: unknown field"),
        ({"ticketNumbers": ["2201234567890"]}, "[0].ticketNumbers: given, but ticketed is false"),
        (
            {"ticketingDeadlineAirport": "FRA", "ticketingDeadline": "2026-12-01T18:00:00Z"},
            "has an offset",
        ),
    ],
)
def test_field_errors(changes: dict[str, Any], expected: str) -> None:
    [line] = errors([entry(**changes)])
    assert line.startswith(expected) or expected in line, line


def test_segment_errors() -> None:
    doc = entry()
    doc["segments"].append(dict(doc["segments"][0], number=2, date="2026-02-30", origin="JFK"))
    doc["segments"].append(dict(doc["segments"][0], number=3, origin="JFK"))
    assert errors([doc]) == [
        "[0].segments[1].date: '2026-02-30' is not a calendar date",
        "[0].segments[2].destination: same as origin",
    ]
    doc["segments"].append(dict(doc["segments"][0], status="hk", number=4))
    assert errors([doc]) == ["[0].segments[3].status: 'hk' does not match ^[A-Z0-9]{2}$"]


def test_numbers_and_locators_must_not_repeat() -> None:
    doc = entry()
    doc["segments"].append(dict(doc["segments"][0], destination="EWR"))
    assert errors([doc]) == ["[0].segments[1].number: 1 appears twice"]
    assert errors([ENTRY, ENTRY]) == ["[1].locator: ABC123 already given at [0]"]


@pytest.mark.parametrize("doc", [{}, "x", None, 3, [1], [[]]])
def test_garbage_is_an_error_not_a_traceback(doc: Any) -> None:
    assert errors(doc)


def test_local_deadline_across_the_dst_change_at_frankfurt() -> None:
    # Summer time (UTC+2) ends in Germany on 25 October 2026 at 03:00 local.
    assert local_deadline("2026-10-24T18:00", "FRA") == datetime(2026, 10, 24, 16, tzinfo=UTC)
    assert local_deadline("2026-10-25T18:00", "FRA") == datetime(2026, 10, 25, 17, tzinfo=UTC)
    # 02:30 happens twice that night: the later instant, so nothing is cancelled early.
    assert local_deadline("2026-10-25T02:30", "FRA") == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)
    # 02:30 on 29 March 2026 never happens in Frankfurt.
    with pytest.raises(ValueError, match="does not exist at FRA"):
        local_deadline("2026-03-29T02:30", "FRA")
    # New York: daylight time ends 1 November 2026.
    assert local_deadline("2026-11-01T12:00", "JFK") == datetime(2026, 11, 1, 17, tzinfo=UTC)


def test_a_local_deadline_in_the_file() -> None:
    [b] = parse_bookings(
        [entry(ticketingDeadline="2026-10-25T18:00", ticketingDeadlineAirport="FRA")]
    )
    assert b.ticketing_deadline == datetime(2026, 10, 25, 17, tzinfo=UTC)
    assert b.ticketing_deadline_text == "2026-10-25T18:00 FRA local"
    assert errors(
        [entry(ticketingDeadline="2026-10-25T18:00", ticketingDeadlineAirport="QQQ")]
    ) == ["[0].ticketingDeadline: unknown airport 'QQQ'"]
