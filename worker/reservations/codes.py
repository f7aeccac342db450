"""AIRIMP segment status codes: what a partner's code folds into, and what work it causes.

Pure functions, no I/O. Three classes of two-letter codes travel between airlines (IATA
Airline Interline Message Procedures, AIRIMP; the code meanings below follow the GDS vendors'
public code tables):

* **action** codes, sent by whoever asks for space (NN need, SS sold, LL list, XX cancel...);
* **advice** (reply) codes, sent by the carrier that controls the inventory (KK confirming,
  US unable/have waitlisted, UC unable, HX cancelled...) and schedule-change codes (TK, TL, TN,
  and the superseded WK, WL, WN);
* **status** (holding) codes, kept in the record once a request or reply has been applied
  (HK holds confirmed, HL have listed, HN have requested...).

A reply is applied and then *folded* into the holding code it implies (:data:`FOLD`): KK
becomes HK, US becomes HL. Refusals keep their reply code (UC, UN, NO, HX), because nothing is
held and the code is what tells an agent to rebook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Reason = Literal["confirmed", "refused", "waitlisted", "schedule-change", "review"]

#: Reply codes and the holding code each becomes once applied. Codes not listed keep their
#: value: holding codes are already holding codes, refusals keep the refusal.
FOLD: Final[dict[str, str]] = {
    "KK": "HK",  # confirming
    "KL": "HK",  # confirming from the waiting list
    "US": "HL",  # unable to sell, have waitlisted
    "UU": "HL",  # unable, have waitlisted
    "TL": "HL",  # schedule change, waitlisted
    "TK": "HK",  # schedule change, confirmed
    "TN": "HN",  # schedule change, on request
}

#: ForStatus: the reason a code puts the booking on its owner's worklist. A code that maps
#: to None needs no attention; a code absent from the table is unknown (reason ``review``).
_REASONS: Final[dict[str, Reason | None]] = {
    # confirmations to pass on to the originator
    "KK": "confirmed",
    "KL": "confirmed",
    # refusals: nothing is held, someone has to rebook
    "UC": "refused",
    "UN": "refused",
    "NO": "refused",
    "HX": "refused",
    "DL": "refused",
    # unable, but waitlisted: the passenger expected a seat
    "US": "waitlisted",
    "UU": "waitlisted",
    # schedule changes: the new segment (TK/TL/TN, SC) and the superseded one (WK/WL/WN)
    "TK": "schedule-change",
    "TL": "schedule-change",
    "TN": "schedule-change",
    "SC": "schedule-change",
    "WK": "schedule-change",
    "WL": "schedule-change",
    "WN": "schedule-change",
    # requests we originated and holding codes: silent (the sweeper watches the silence)
    "NN": None,
    "SS": None,
    "LL": None,
    "HN": None,
    "PN": None,
    "DK": None,
    "DW": None,
    "HQ": None,
    "HK": None,
    "HL": None,
    "RR": None,
    "GK": None,
    "XX": None,
    "XK": None,
    "XL": None,
}

#: Every code ForStatus knows (the unknown ones get ``review``).
KNOWN_CODES: Final[frozenset[str]] = frozenset(_REASONS)

#: Request states: a segment in one of these is waiting for the carrier's reply.
REQUEST_STATES: Final[frozenset[str]] = frozenset({"HN", "NN", "PN"})

#: Cancelled: the segment was withdrawn (by us) and holds nothing any more.
CANCELLED_STATES: Final[frozenset[str]] = frozenset({"XX", "XK", "XL"})

#: Holds nothing: cancelled, refused, or the superseded leg of a schedule change. A segment
#: in any other state (unknown codes included) is *live* and is withdrawn by a cancellation.
DEAD_STATES: Final[frozenset[str]] = CANCELLED_STATES | frozenset(
    {"UC", "UN", "NO", "HX", "DL", "WK", "WL", "WN"}
)

#: The status a withdrawn segment takes: cancel, message sent (AIRIMP action code XX).
WITHDRAWN: Final = "XX"


@dataclass(frozen=True)
class Attention:
    """Where a status puts a booking: a worklist queue and a stable reason code.

    The reason is part of the worklist's idempotency key (queue, record, reason), so its
    spelling never changes.
    """

    queue: str
    reason: Reason


def office_queue(owner: str) -> str:
    """Return the worklist queue of an office (the booking's owner), e.g. ``office-fra1a0``.

    Every reservation item goes to the queue of the office that owns the booking: it is the
    originator a confirmation is passed on to, and the one who rebooks after a refusal.
    Worklist queue names are lower case, hence the office code in lower case.
    """
    return f"office-{owner.lower()}"


#: Record kind of worklist items about one segment; the key is ``<locator>/<number>``.
SEGMENT_KIND: Final = "segment"
#: Record kind of worklist items about a whole booking; the key is the locator.
BOOKING_KIND: Final = "booking"


def segment_key(locator: str, number: int) -> str:
    """The worklist record key of a segment: ``ABC123/1``."""
    return f"{locator}/{number}"


def is_status_code(code: str) -> bool:
    """Whether ``code`` has the shape of a status code: two upper-case letters or digits."""
    return len(code) == 2 and code.isascii() and code.isalnum() and code.upper() == code


def fold(code: str) -> str:
    """Return the holding code a segment takes once ``code`` has been applied.

    KK and KL become HK; US, UU and TL become HL; TK becomes HK; TN becomes HN. Every other
    code is kept (refusals UC/UN/NO/HX keep the reply code because nothing is held).
    """
    return FOLD.get(code, code)


def for_status(code: str, owner: str) -> Attention | None:
    """Return the work a segment status causes on the owner's worklist, or None.

    Args:
        code: the status as received (before :func:`fold`), e.g. ``KK``.
        owner: the office that owns the booking (see :func:`office_queue`).

    Returns:
        ``confirmed`` for KK/KL, ``refused`` for UC/UN/NO/HX/DL, ``waitlisted`` for US/UU,
        ``schedule-change`` for TK/TL/TN/SC/WK/WL/WN; None for requests we originated and
        holding codes (NN SS LL HN PN DK DW HQ HK HL RR GK XX XK XL); ``review`` for any code not
        in the table: an unknown code is never taken for a refusal, nor for silence.
    """
    if code not in _REASONS:
        return Attention(office_queue(owner), "review")
    reason = _REASONS[code]
    return Attention(office_queue(owner), reason) if reason is not None else None
