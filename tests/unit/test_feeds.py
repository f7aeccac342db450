"""Feed declarations and ingest's in-memory recorder (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from inturn.worker.console.overview import build_feeds
from inturn.worker.feeds.declare import FeedsError, feed_problems, parse_feeds, sender_key
from inturn.worker.feeds.recorder import FeedRecorder
from inturn.worker.spec.schedule import parse
from inturn.worker.store.feeds import FeedRow

LAB_HOURS = {
    "timeZone": "Europe/Berlin",
    "windows": [{"days": ["Mon", "Tue", "Wed", "Thu", "Fri"], "start": "06:00", "end": "20:00"}],
}


def test_a_declaration_file() -> None:
    feeds = parse_feeds(
        {
            "feeds": [
                {"channel": "adt", "silentAfterSeconds": 1800},
                {
                    "channel": "lab",
                    "silentAfterSeconds": 600,
                    "perSender": True,
                    "schedule": LAB_HOURS,
                },
            ]
        }
    )
    assert [(f.channel, f.silent_after_seconds, f.per_sender) for f in feeds] == [
        ("adt", 1800, False),
        ("lab", 600, True),
    ]
    assert feeds[0].schedule is None and feeds[1].schedule == parse(LAB_HOURS)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({}, "<root>: 'feeds' is a required property"),
        ({"feeds": [{"channel": "adt"}]}, "feeds[0]: 'silentAfterSeconds' is a required property"),
        ({"feeds": [{"channel": "adt", "silentAfterSeconds": 10}]}, "feeds[0].silentAfterSeconds"),
        ({"feeds": [{"channel": "A D T", "silentAfterSeconds": 600}]}, "feeds[0].channel"),
        ({"feeds": [{"channel": "adt", "silentAfterSeconds": 600, "quiet": 1}]}, "feeds[0]"),
        (
            {"feeds": [{"channel": "adt", "silentAfterSeconds": 600}] * 2},
            "feeds[1].channel: adt is declared twice",
        ),
        (
            {
                "feeds": [
                    {
                        "channel": "adt",
                        "silentAfterSeconds": 600,
                        "schedule": {**LAB_HOURS, "timeZone": "Europe/Atlantis"},
                    }
                ]
            },
            "feeds[0].schedule.timeZone",
        ),
    ],
)
def test_bad_declarations_name_the_field(doc: Any, problem: str) -> None:
    with pytest.raises(FeedsError) as caught:
        parse_feeds(doc)
    assert problem in str(caught.value)
    assert any(line.startswith(problem) for line in feed_problems(doc))


def test_sender_key_is_the_first_components_and_bounded() -> None:
    assert sender_key("LAB^1.2.3^ISO", "HOSP") == "LAB^HOSP"
    assert len(sender_key("X" * 500, "Y")) == 180


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_the_recorder_keeps_the_latest_time_per_channel_and_sender_in_memory() -> None:
    feeds = parse_feeds(
        {
            "feeds": [
                {"channel": "adt", "silentAfterSeconds": 600},
                {"channel": "lab", "silentAfterSeconds": 600, "perSender": True},
            ]
        }
    )
    clock = Clock()
    recorder = FeedRecorder(feeds, max_senders=2, clock=clock)
    for _ in range(1000):  # a thousand messages: still one row per channel and sender
        clock.now += 1
        recorder.seen("adt", "ADT", "HOSP")
        recorder.seen("lab", "LIS", "HOSP")
        recorder.seen("other", "X", "Y")  # not a declared feed
    recorder.seen("lab", "POCT", "WARD1")
    recorder.seen("lab", "NEW", "ONE")  # beyond max_senders: the channel only
    at = datetime.fromtimestamp(clock.now, UTC)
    assert recorder.take() == [
        ("adt", "", at),
        ("lab", "", at),
        ("lab", "LIS^HOSP", at),
        ("lab", "POCT^WARD1", at),
    ]
    assert recorder.take() == []  # taken once


def _row(**kw: Any) -> FeedRow:
    base: dict[str, Any] = {
        "channel": "adt",
        "sender": "",
        "last_message_at": None,
        "declared_at": datetime(2026, 12, 1, 0, 0, tzinfo=UTC),
        "silent_after_seconds": 600,
        "schedule": None,
        "per_sender": False,
    }
    base.update(kw)
    return FeedRow(**base)


def test_console_feed_states() -> None:
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)  # a Tuesday, 09:00 in Berlin
    rows = build_feeds(
        [
            _row(channel="ok", last_message_at=datetime(2026, 12, 1, 7, 55, tzinfo=UTC)),
            _row(channel="quiet", last_message_at=datetime(2026, 12, 1, 7, 0, tzinfo=UTC)),
            # quiet since last night, but its hours began at 06:00 Berlin (05:00Z): silent
            _row(
                channel="lab",
                last_message_at=datetime(2026, 11, 30, 18, 0, tzinfo=UTC),
                schedule=LAB_HOURS,
            ),
            # a Sunday-only feed is outside its hours on a Tuesday
            _row(
                channel="weekend",
                schedule={
                    "timeZone": "UTC",
                    "windows": [{"days": ["Sun"], "start": "00:00", "end": "24:00"}],
                },
            ),
        ],
        now=now,
    )
    assert [(r.channel, r.state) for r in rows] == [
        ("lab", "silent"),
        ("quiet", "silent"),
        ("weekend", "outside-window"),
        ("ok", "receiving"),
    ]
    assert rows[2].window_until == datetime(2026, 12, 6, 0, 0, tzinfo=UTC)
    assert not rows[2].heard and rows[2].quiet_seconds == 8 * 3600
