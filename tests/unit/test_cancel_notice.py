"""The cancellation notice: an HL7 v2.5 message our own MSH parser reads back."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from inturn.worker.hl7.header import parse_header
from inturn.worker.reservations.notice import build_notice
from inturn.worker.reservations.records import Withdrawn

SEGMENTS = [
    Withdrawn(3, "LH", "401", date(2026, 12, 21), "FRA", "MUC", "HL"),
    Withdrawn(1, "LH", "400", date(2026, 12, 10), "FRA", "JFK", "HK"),
    Withdrawn(2, "UA", "960", date(2026, 12, 20), "JFK", "FRA", "HK"),
]
WHEN = datetime(2026, 12, 1, 18, 0, 1, tzinfo=UTC)


def test_one_notice_per_carrier_with_its_segments_in_order() -> None:
    payload = build_notice(
        locator="ABC123",
        owner="FRA1A0",
        carrier="LH",
        reason="ticketing-expired",
        cancelled_at=WHEN,
        segments=SEGMENTS,
    )
    assert payload.split(b"\r") == [
        b"MSH|^~\\&|INTURN|FRA1A0|LH|LH|20261201180001||ZRC^Z01^ZRC_Z01|XXABC123LH|P|2.5",
        b"ZRB|ABC123|FRA1A0|ticketing-expired|20261201180001",
        b"ZSG|1|LH|400|20261210|FRA|JFK|XX|HK",
        b"ZSG|3|LH|401|20261221|FRA|MUC|XX|HL",
        b"",
    ]
    header = parse_header(payload)
    assert header.control_id == "XXABC123LH"
    assert header.message_type.type_key == "ZRC^Z01"


def test_no_segment_of_that_carrier_is_an_error() -> None:
    with pytest.raises(ValueError, match="no segment of OS"):
        build_notice(
            locator="ABC123",
            owner="FRA1A0",
            carrier="OS",
            reason="ticketing-expired",
            cancelled_at=WHEN,
            segments=SEGMENTS,
        )
