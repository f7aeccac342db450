"""How a Destination delivers, as the API declares it: its delivery window (``schedule``, shared
with the feeds declarations) and its lanes. Pure data, part of
:mod:`inturn.worker.spec.schema`.
"""

from __future__ import annotations

from inturn.worker.spec.config import DEFAULT_LANES_WINDOW
from inturn.worker.spec.openapi import Rule, Schema
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import string as _str
from inturn.worker.spec.schedule import DAYS, MAX_WINDOWS, ZONE_PATTERN

#: Most messages a destination may have in flight at once (``spec.lanes.count``).
MAX_LANES = 32

#: Most messages the lanes may look over (``spec.lanes.window``).
MAX_LANES_WINDOW = 100_000

RULE_SFTP_ONE_LANE = Rule(
    cel="!has(self.sender.sftp) || !has(self.lanes) || !has(self.lanes.count)"
    " || self.lanes.count == 1",
    message=(
        "sftp takes one lane only (lanes.count 1): a receiver reads an SFTP folder in the order"
        " of its file names, so files written at once could be read out of order"
    ),
    check=lambda node: (
        "sftp" not in node.get("sender", {}) or int(node.get("lanes", {}).get("count", 1)) == 1
    ),
    field_path=".lanes.count",
)


def lanes_schema() -> Schema:
    return _obj(
        {
            "count": _int(
                "Messages in flight to the receiver at once (MLLP connections, concurrent HTTP"
                " requests); each key's messages still go one at a time, in enqueue order."
                " 1 is the single stream. Ask the receiver's vendor first: it must process"
                " its connections independently.",
                minimum=1,
                maximum=MAX_LANES,
                default=1,
            ),
            "key": _str(
                "What must keep its order: patient (every patient identifier a message names,"
                " PID-2/3/4 and MRG-1 of every PID segment). A message naming several patients"
                " (a merge, a link, a swap) binds them; one naming none is a barrier.",
                max_length=16,
                enum=("patient",),
                default="patient",
            ),
            "window": _int(
                "How many of the oldest pending messages the worker looks over to find ones"
                " that may go while earlier ones wait; it says so when the window is full of"
                " waiting messages.",
                minimum=1,
                maximum=MAX_LANES_WINDOW,
                default=DEFAULT_LANES_WINDOW,
            ),
        },
        description=(
            "Several messages in flight at once, keeping each patient's order. Unset: one"
            " message at a time."
        ),
        default={},
    )


#: A start time: ``HH:MM`` from 00:00 to 23:59.
_START_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"

#: An end time: ``HH:MM`` from 00:00 to 24:00.
_END_PATTERN = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"


def schedule_schema(description: str) -> Schema:
    """A weekly schedule in a time zone (:mod:`inturn.worker.spec.schedule`): the node of
    ``spec.schedule``, reused by feed declarations."""
    return _obj(
        {
            "timeZone": _str(
                "IANA time zone the windows are in, e.g. Europe/Berlin; daylight saving time"
                " is the zone's own.",
                max_length=64,
                min_length=1,
                pattern=ZONE_PATTERN,
            ),
            "windows": {
                "type": "array",
                "description": ("Weekly windows; windows that overlap or touch form one opening."),
                "minItems": 1,
                "maxItems": MAX_WINDOWS,
                "items": _obj(
                    {
                        "days": {
                            "type": "array",
                            "description": "Weekdays the window starts on.",
                            "minItems": 1,
                            "maxItems": 7,
                            "items": _str("A weekday.", max_length=3, enum=DAYS),
                        },
                        "start": _str(
                            "Local start time, HH:MM (00:00 to 23:59).",
                            max_length=5,
                            pattern=_START_PATTERN,
                        ),
                        "end": _str(
                            "Local end time, HH:MM (00:00 to 24:00); an end not after the"
                            " start ends the next day (equal: 24 hours).",
                            max_length=5,
                            pattern=_END_PATTERN,
                        ),
                    },
                    required=("days", "start", "end"),
                    description="One weekly window.",
                ),
            },
        },
        required=("timeZone", "windows"),
        description=description,
    )
