"""The cancellation notice sent to a carrier through the delivery queue: an HL7 v2 message.

Pure. A partner's Destination already speaks HL7 v2 over MLLP (or HTTP), with MSH-10 control
IDs and ACKs, so the notice is an HL7 v2.5 message built from site-defined segments: HL7 v2
reserves message types and segment IDs that start with Z for local use (HL7 v2.5 chapter 2,
"Z segments" and "local extensions"). The receiver acknowledges it like any other message
(original acknowledgment mode: MSH-15/16 empty).

Layout (``|`` field separator, ``^`` component separator, segments end with a carriage return)::

    MSH|^~\\&|INTURN|<owner>|<carrier>|<carrier>|<time>||ZRC^Z01^ZRC_Z01|<control id>|P|2.5
    ZRB|<locator>|<owner>|<reason>|<time>
    ZSG|<number>|<carrier>|<flight>|<date YYYYMMDD>|<origin>|<destination>|XX|<previous status>

* ``<time>``: when the booking was cancelled, ``YYYYMMDDHHMMSS`` in UTC (also MSH-7).
* MSH-9 ``ZRC^Z01^ZRC_Z01``: reservation cancellation.
* MSH-10 ``XX<locator><carrier>``: one notice per booking and carrier (a booking is cancelled
  once), so a receiver can tell a repeat from a new notice.
* ZRB: the booking; reason is why it was cancelled (``ticketing-expired``).
* ZSG: one per segment of this carrier withdrawn, with the AIRIMP action code XX (cancel)
  and the status the segment held before.

Every value is ASCII letters, digits and ``-`` (validated on import), so nothing needs HL7
escaping. No passenger data is carried.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from inturn.worker.reservations.records import Withdrawn

#: MSH-9 of a cancellation notice.
MESSAGE_TYPE = "ZRC^Z01^ZRC_Z01"
#: The form the delivery queue records (MSH-9.1^MSH-9.2).
TYPE_KEY = "ZRC^Z01"
#: MSH-12.
VERSION = "2.5"


def control_id(locator: str, carrier: str) -> str:
    """MSH-10 of the notice to ``carrier`` for ``locator`` (at most 13 characters)."""
    return f"XX{locator}{carrier}"


def _ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y%m%d%H%M%S")


def build_notice(
    *,
    locator: str,
    owner: str,
    carrier: str,
    reason: str,
    cancelled_at: datetime,
    segments: Sequence[Withdrawn],
) -> bytes:
    """Return the notice to ``carrier`` that the booking's segments on it are cancelled.

    Args:
        segments: the withdrawn segments; only those of ``carrier`` are listed.
        cancelled_at: when the booking was cancelled (also MSH-7).

    Raises:
        ValueError: no segment of ``carrier`` among ``segments``.
    """
    mine = [s for s in segments if s.carrier == carrier]
    if not mine:
        raise ValueError(f"no segment of {carrier} to cancel")
    when = _ts(cancelled_at)
    lines = [
        "|".join(
            [
                "MSH",
                "^~\\&",
                "INTURN",
                owner,
                carrier,
                carrier,
                when,
                "",
                MESSAGE_TYPE,
                control_id(locator, carrier),
                "P",
                VERSION,
            ]
        ),
        f"ZRB|{locator}|{owner}|{reason}|{when}",
    ]
    for s in sorted(mine, key=lambda s: s.number):
        lines.append(
            f"ZSG|{s.number}|{s.carrier}|{s.flight}|{s.date.strftime('%Y%m%d')}|{s.origin}"
            f"|{s.destination}|XX|{s.previous}"
        )
    return ("\r".join(lines) + "\r").encode("ascii")
