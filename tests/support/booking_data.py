"""Bookings for the reservation tests, in the import file's shape
(``from tests.support.booking_data import booking``)."""

from __future__ import annotations

import copy
from typing import Any

#: Segments to build bookings from: LH 400 FRA-JFK requested, UA 960 back, LH 401 refused.
LH400: dict[str, Any] = {
    "number": 1,
    "carrier": "LH",
    "flight": "400",
    "date": "2026-12-10",
    "origin": "FRA",
    "destination": "JFK",
    "status": "HN",
    "requestedAt": "2026-11-30T08:00:00Z",
}
UA960: dict[str, Any] = {
    "number": 2,
    "carrier": "UA",
    "flight": "960",
    "date": "2026-12-20",
    "origin": "JFK",
    "destination": "FRA",
    "status": "HK",
}
LH401: dict[str, Any] = {
    "number": 3,
    "carrier": "LH",
    "flight": "401",
    "date": "2026-12-21",
    "origin": "FRA",
    "destination": "MUC",
    "status": "UC",
}


def booking(locator: str = "ABC123", *segments: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A booking of the issue's example (deadline 2026-12-01T17:00Z) with ``segments``
    (default: LH400 and UA960) and ``fields`` changed; the arguments are copied."""
    doc: dict[str, Any] = {
        "locator": locator,
        "owner": "FRA1A0",
        "createdAt": "2026-11-30T08:00:00Z",
        "ticketingDeadline": "2026-12-01T18:00:00+01:00",
        "ticketed": False,
        "segments": copy.deepcopy(list(segments or (LH400, UA960))),
    }
    doc.update(copy.deepcopy(fields))
    return doc


def segment(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of ``base`` with ``changes``."""
    return {**copy.deepcopy(base), **changes}
