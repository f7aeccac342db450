"""Plain data of the worklists: items, placements, counts, pages. No I/O here.

An item says "record ``record_kind``/``record_key`` needs attention on ``queue`` for ``reason``".
Names (queue, kind, reason) are short lowercase codes; details are a small JSON object and
never carry a payload (patient data stays in the delivery queue).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from inturn.worker.errors import Invalid

ItemState = Literal["pending", "cleared"]
ITEM_STATES: tuple[ItemState, ...] = ("pending", "cleared")

#: Queue, record kind and reason codes: lowercase letters, digits, '-', '_' and '.'.
CODE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
#: Longest record key, in characters.
RECORD_KEY_MAX = 256
#: Largest details object, in bytes of compact JSON.
DETAILS_MAX_BYTES = 4096
#: Longest clearing note, in characters.
NOTE_MAX = 1000


def check_code(field: str, value: str) -> str:
    """Return ``value`` if it is a valid code for ``field`` (queue, record kind, reason).

    Raises:
        Invalid: naming the field, when the value is empty, too long or not lowercase.
    """
    if not CODE.match(value):
        raise Invalid(
            f"{field} {value!r} is not a code (lowercase letters, digits, '-', '_', '.';"
            " at most 63 characters)"
        )
    return value


def check_record_key(value: str) -> str:
    """Return ``value`` if it is a non-empty record key of at most 256 characters.

    Raises:
        Invalid: empty or too long.
    """
    if not value or len(value) > RECORD_KEY_MAX:
        raise Invalid(f"record key must be 1..{RECORD_KEY_MAX} characters")
    return value


def encode_details(details: dict[str, Any]) -> str:
    """Compact JSON of ``details``, at most 4,096 bytes.

    Raises:
        Invalid: not a JSON object, not serialisable, or too large.
    """
    if not isinstance(details, dict):
        raise Invalid("details must be a JSON object")
    try:
        text = json.dumps(details, separators=(",", ":"), sort_keys=True, default=str)
    except (TypeError, ValueError) as exc:
        raise Invalid(f"details are not JSON: {exc}") from None
    if len(text.encode()) > DETAILS_MAX_BYTES:
        raise Invalid(f"details exceed {DETAILS_MAX_BYTES} bytes; keep them small")
    return text


def check_clear(who: str, note: str) -> None:
    """Check the two things every clear must say: who, and why.

    Raises:
        Invalid: ``who`` or ``note`` is blank, or the note is longer than 1,000 characters.
    """
    if not who.strip():
        raise Invalid("who must be given to clear an item")
    if not note.strip():
        raise Invalid("a note must be given to clear an item")
    if len(note) > NOTE_MAX:
        raise Invalid(f"note must be at most {NOTE_MAX} characters")


@dataclass(frozen=True)
class WorklistItem:
    """One item of work. Times are timezone-aware (database time)."""

    id: int
    queue: str
    record_kind: str
    record_key: str
    reason: str
    details: dict[str, Any]
    placed_at: datetime
    placed_by: str
    state: ItemState
    cleared_at: datetime | None
    cleared_by: str | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (camelCase keys, ISO 8601 times)."""
        return {
            "id": self.id,
            "queue": self.queue,
            "recordKind": self.record_kind,
            "recordKey": self.record_key,
            "reason": self.reason,
            "details": self.details,
            "placedAt": self.placed_at.isoformat(),
            "placedBy": self.placed_by,
            "state": self.state,
            "clearedAt": self.cleared_at.isoformat() if self.cleared_at else None,
            "clearedBy": self.cleared_by,
            "note": self.note,
        }


@dataclass(frozen=True)
class Placement:
    """The result of placing: the pending item, and whether this placement created it.

    ``created`` is False when the same (queue, record, reason) was already pending: a repeat
    placement is not an error, it is a sweep doing its job again.
    """

    item: WorklistItem
    created: bool

    @property
    def item_id(self) -> int:
        """The pending item's id (new or already there)."""
        return self.item.id


@dataclass(frozen=True)
class CountRow:
    """Items of one queue and reason in one state; ``oldest`` is the oldest placement time."""

    queue: str
    reason: str
    items: int
    oldest: datetime | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "queue": self.queue,
            "reason": self.reason,
            "items": self.items,
            "oldest": self.oldest.isoformat() if self.oldest else None,
        }


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[WorklistItem]
    next_cursor: int | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"items": [...], "nextCursor": n | null}``."""
        return {"items": [i.to_json() for i in self.items], "nextCursor": self.next_cursor}


@dataclass(frozen=True)
class Shown:
    """One item and its record's history: every item placed for the same record, oldest first."""

    item: WorklistItem
    history: list[WorklistItem]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the item's fields plus ``history``."""
        return {**self.item.to_json(), "history": [i.to_json() for i in self.history]}
