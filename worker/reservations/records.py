"""The booking import file read into booking records.

The records themselves (:class:`Booking`, :class:`Segment`, :class:`Withdrawn`) are the
store's (:mod:`inturn.worker.store.model`), named here too for callers. Pure: no database,
no network. The import file is a JSON list of bookings (camelCase keys)::

    [{"locator": "ABC123", "owner": "FRA1A0", "createdAt": "2026-11-30T08:00:00Z",
      "ticketingDeadline": "2026-12-01T18:00:00+01:00", "ticketed": false,
      "segments": [{"number": 1, "carrier": "LH", "flight": "400", "date": "2026-12-10",
                    "origin": "FRA", "destination": "JFK", "status": "HN",
                    "requestedAt": "2026-11-30T08:00:00Z"}]}]

Times are RFC 3339 with an offset (``Z`` or ``+01:00``). A ticketing deadline may instead be
given as local time at an airport: ``"ticketingDeadline": "2026-10-25T18:00"`` with
``"ticketingDeadlineAirport": "FRA"``; it is converted with the IANA time zone of that airport
(``airportsdata``) and the rules in force on that date, so a deadline across a daylight-saving
change lands on the right UTC instant. A local time that occurs twice (clocks go back) is
read as the later instant, so an automatic cancellation never acts early; one that does not
exist (clocks go forward) is refused. The text as given is kept beside the instant.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from inturn.worker.errors import Invalid
from inturn.worker.reservations.fields import CARRIER_PATTERN
from inturn.worker.spec.validation import validate
from inturn.worker.store.model import Booking, Segment, Withdrawn

__all__ = [
    "MAX_IMPORT",
    "Booking",
    "BookingFileError",
    "Segment",
    "Withdrawn",
    "airport_zone",
    "local_deadline",
    "parse_bookings",
    "parse_instant",
]

#: Largest number of bookings one import file may hold.
MAX_IMPORT = 100_000

_CODE = r"^[A-Z0-9]{2}$"
_AIRPORT = r"^[A-Z]{3}$"


def _s(pattern: str, description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": pattern, "description": description}


_TIME = {"type": "string", "minLength": 1, "maxLength": 64}

#: JSON schema of one segment of the import file.
SEGMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "number": {"type": "integer", "minimum": 1, "maximum": 99},
        "carrier": _s(CARRIER_PATTERN, "IATA airline designator"),
        "flight": _s(r"^[0-9]{1,4}[A-Z]?$", "flight number"),
        "date": _s(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "departure date"),
        "origin": _s(_AIRPORT, "IATA airport code"),
        "destination": _s(_AIRPORT, "IATA airport code"),
        "status": _s(_CODE, "AIRIMP status code"),
        "requestedAt": _TIME,
    },
    "required": ["number", "carrier", "flight", "date", "origin", "destination", "status"],
}

#: JSON schema of one booking of the import file.
BOOKING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "locator": _s(r"^[A-Z0-9]{5,8}$", "record locator"),
        "owner": _s(r"^[A-Z0-9]{2,16}$", "office that owns the booking"),
        "createdAt": _TIME,
        "ticketingDeadline": _TIME,
        "ticketingDeadlineAirport": _s(_AIRPORT, "airport whose local time the deadline is"),
        "ticketed": {"type": "boolean"},
        "ticketNumbers": {
            "type": "array",
            "maxItems": 99,
            "items": _s(r"^[0-9]{13}$", "13-digit ticket number"),
        },
        "segments": {"type": "array", "minItems": 1, "maxItems": 99, "items": SEGMENT_SCHEMA},
    },
    "required": ["locator", "owner", "createdAt", "segments"],
}


class BookingFileError(Invalid):
    """An import file is not a valid list of bookings; nothing of it may be imported.

    Attributes:
        errors: one line per problem, ``[<index>].<field>: <what is wrong>``, in file order.
    """

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(self.errors))


def parse_instant(text: str) -> datetime:
    """Read an RFC 3339 date-time with an offset and return it in UTC.

    Raises:
        ValueError: not a date-time, or no offset (a time without a zone is not an instant).
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{_clip(text)} is not an RFC 3339 date-time") from None
    if value.tzinfo is None:
        raise ValueError(f"{_clip(text)} has no UTC offset (add Z or +hh:mm)")
    return value.astimezone(UTC)


@functools.cache
def _airports() -> dict[str, Any]:
    import airportsdata

    table: dict[str, Any] = airportsdata.load("IATA")
    return table


def airport_zone(code: str) -> ZoneInfo:
    """Return the IANA time zone of an airport by IATA code (``FRA`` -> ``Europe/Berlin``).

    Raises:
        ValueError: the airport is unknown, or its zone is not in the time zone database.
    """
    entry = _airports().get(code)
    if entry is None or not entry.get("tz"):
        raise ValueError(f"unknown airport {code!r}")
    try:
        return ZoneInfo(entry["tz"])
    except ZoneInfoNotFoundError:
        raise ValueError(f"airport {code}: time zone {entry['tz']!r} is not known") from None


def local_deadline(text: str, airport: str) -> datetime:
    """Read a local date-time at an airport (no offset) and return the UTC instant.

    A time that occurs twice (clocks go back) is the later instant; a time that does not exist
    (clocks go forward) is an error.

    Raises:
        ValueError: not a local date-time, unknown airport, or a time that does not exist.
    """
    try:
        naive = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{_clip(text)} is not a date-time") from None
    if naive.tzinfo is not None:
        raise ValueError(f"{_clip(text)} has an offset; drop it or drop ticketingDeadlineAirport")
    zone = airport_zone(airport)
    early = naive.replace(tzinfo=zone, fold=0)
    late = naive.replace(tzinfo=zone, fold=1)
    for candidate in (early, late):
        # A real wall time survives a round trip through UTC; a skipped one does not.
        back = candidate.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
        if back != naive:
            raise ValueError(f"{text} does not exist at {airport} (clocks go forward)")
    return max(early.astimezone(UTC), late.astimezone(UTC))


def _clip(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _booking(doc: Mapping[str, Any], where: str, problems: list[str]) -> Booking | None:
    """Build one validated booking, adding ``where.field: problem`` lines for bad values."""
    before = len(problems)

    def instant(key: str, value: Any, at: str) -> datetime | None:
        try:
            return parse_instant(value)
        except ValueError as exc:
            problems.append(f"{at}.{key}: {exc}")
            return None

    created = instant("createdAt", doc["createdAt"], where)
    deadline: datetime | None = None
    deadline_text: str | None = None
    if "ticketingDeadline" in doc:
        raw = doc["ticketingDeadline"]
        airport = doc.get("ticketingDeadlineAirport")
        if airport is None:
            deadline = instant("ticketingDeadline", raw, where)
            deadline_text = raw
        else:
            try:
                deadline = local_deadline(raw, airport)
                deadline_text = f"{raw} {airport} local"
            except ValueError as exc:
                problems.append(f"{where}.ticketingDeadline: {exc}")
    elif "ticketingDeadlineAirport" in doc:
        problems.append(f"{where}.ticketingDeadlineAirport: needs ticketingDeadline")
    segments: list[Segment] = []
    seen: set[int] = set()
    for j, seg in enumerate(doc["segments"]):
        at = f"{where}.segments[{j}]"
        if seg["number"] in seen:
            problems.append(f"{at}.number: {seg['number']} appears twice")
        seen.add(seg["number"])
        try:
            day = date.fromisoformat(seg["date"])
        except ValueError:
            problems.append(f"{at}.date: {_clip(seg['date'])} is not a calendar date")
            continue
        requested = instant("requestedAt", seg["requestedAt"], at) if "requestedAt" in seg else None
        if seg["origin"] == seg["destination"]:
            problems.append(f"{at}.destination: same as origin")
        segments.append(
            Segment(
                number=seg["number"],
                carrier=seg["carrier"],
                flight=seg["flight"],
                date=day,
                origin=seg["origin"],
                destination=seg["destination"],
                status=seg["status"],
                requested_at=requested,
            )
        )
    tickets = tuple(doc.get("ticketNumbers", ()))
    ticketed = bool(doc.get("ticketed", False))
    if tickets and not ticketed:
        problems.append(f"{where}.ticketNumbers: given, but ticketed is false")
    if len(problems) > before or created is None:
        return None
    return Booking(
        locator=doc["locator"],
        owner=doc["owner"],
        created_at=created,
        segments=tuple(sorted(segments, key=lambda s: s.number)),
        ticketing_deadline=deadline,
        ticketing_deadline_text=deadline_text,
        ticketed=ticketed,
        ticket_numbers=tickets,
    )


def parse_bookings(doc: Any) -> list[Booking]:
    """Check a parsed import file and return its bookings, in file order.

    Every entry is checked before anything is returned, so a caller imports all or nothing.

    Raises:
        BookingFileError: the document is not a list, or an entry is malformed; every problem
            is reported as ``[<index>].<field>: <what is wrong>`` (index from 0), e.g.
            ``[2].segments[0].carrier: required``. A locator given twice is an error too.
    """
    if not isinstance(doc, list):
        raise BookingFileError(["<root>: must be a JSON list of bookings"])
    if len(doc) > MAX_IMPORT:
        raise BookingFileError([f"<root>: at most {MAX_IMPORT} bookings per file"])
    problems: list[str] = []
    out: list[Booking] = []
    first_seen: dict[str, int] = {}
    for i, entry in enumerate(doc):
        where = f"[{i}]"
        structural = validate(BOOKING_SCHEMA, entry, prefix=where)
        if structural:
            problems.extend(structural)
            continue
        booking = _booking(entry, where, problems)
        if booking is None:
            continue
        if booking.locator in first_seen:
            earlier = first_seen[booking.locator]
            problems.append(f"{where}.locator: {booking.locator} already given at [{earlier}]")
            continue
        first_seen[booking.locator] = i
        out.append(booking)
    if problems:
        raise BookingFileError(problems)
    return out
