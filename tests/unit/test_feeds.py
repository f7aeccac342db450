"""Feed declarations and ingest's in-memory recorder (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from inturn.worker.feeds.declare import FeedsError, parse_feeds, sender_key
from inturn.worker.ingest.feeds import FeedRecorder
from inturn.worker.spec.schedule import parse

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
        ({"feeds": [{"channel": "adt"}]}, "feeds.0: 'silentAfterSeconds' is a required property"),
        ({"feeds": [{"channel": "adt", "silentAfterSeconds": 10}]}, "feeds.0.silentAfterSeconds"),
        ({"feeds": [{"channel": "A D T", "silentAfterSeconds": 600}]}, "feeds.0.channel"),
        ({"feeds": [{"channel": "adt", "silentAfterSeconds": 600, "quiet": 1}]}, "feeds.0"),
        (
            {"feeds": [{"channel": "adt", "silentAfterSeconds": 600}] * 2},
            "feeds.1.channel: adt is declared twice",
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
            "feeds.0.schedule.timeZone",
        ),
    ],
)
def test_bad_declarations_name_the_field(doc: Any, problem: str) -> None:
    with pytest.raises(FeedsError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_feeds(doc)


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
