"""A worklist item's details as a sentence a person reads, not ``key=value`` pairs (pure).

Each reason placed by inturn has its own sentence, written from the details its placer records
(:mod:`inturn.worker.worklist.delivery_failed`, :mod:`inturn.worker.worklist.delivery_rules`,
the reservation rules). A reason this module does not know, or details missing a field it
expects, falls back to a plain list (``carrier LH, flight 400``): never an error, never an
empty cell. Text from outside (control IDs, error texts) is escaped by the caller, as every
other value the console shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from inturn.worker.text.durations import format_age

Details = Mapping[str, Any]


def _when(iso: Any) -> str:
    """``2026-12-01 08:00 UTC`` from an ISO 8601 text (the text itself if it is not one)."""
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return str(iso)


def _words(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", " ", key).lower()


def plain(details: Details) -> str:
    """The fallback: ``carrier LH, flight 400`` (keys in words, in their order)."""
    parts = []
    for key, value in details.items():
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        parts.append(f"{_words(key)} {value}")
    return ", ".join(parts) + "." if parts else ""


def _failed(d: Details) -> str:
    attempts = d["attempts"]
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    cause = d.get("cause")
    said = f": {cause}" if cause else f" (last outcome {d['outcome']})"
    return (
        f"{d['messageType']} {d['controlId']} to {d['destination']} was given up after {tries}"
        f"{said}. Resend it once the cause is fixed, or clear this."
    )


def _stuck(d: Details) -> str:
    text = (
        f"The head (item {d['headId']}, queued {_when(d['headEnqueuedAt'])}) has waited"
        f" {format_age(d['waitingSeconds'])}, past the threshold of"
        f" {format_age(d['stuckAfterSeconds'])}, after {d.get('headAttempts', 0)} attempt(s)."
    )
    if d.get("suspended"):
        text += " Delivery is suspended (spec.suspend)."
    if d.get("lanes"):
        text += (
            f" The destination has {d['lanes']} lanes: this message holds its patient's later"
            " messages (and the merges and barriers that name it); other patients go on."
        )
    return text


def _orphaned(d: Details) -> str:
    gone = f" was deleted {_when(d['deletedAt'])}" if d.get("deletedAt") else " is not registered"
    return (
        f"Messages wait for a destination that{gone}: no worker sends them. The oldest (item"
        f" {d['headId']}) was queued {_when(d['headEnqueuedAt'])}."
    )


def _expired(d: Details) -> str:
    return (
        f"{d['messageType']} {d['controlId']} to {d['destination']} was skipped: pending longer"
        f" than {format_age(d['expireAfterSeconds'])} (queued {_when(d['enqueuedAt'])},"
        f" {d['attempts']} attempt(s))."
    )


def _status(verb: str) -> Callable[[Details], str]:
    def text(d: Details) -> str:
        return (
            f"{d['carrier']} answered {d['code']}: {verb} (status {d['previous']} is now"
            f" {d['status']})."
        )

    return text


def _unanswered(d: Details) -> str:
    return (
        f"{d['carrier']} {d['flight']} is still {d['status']}: no answer since"
        f" {_when(d['requestedAt'])}."
    )


def _ticketing(d: Details) -> str:
    return f"Not ticketed; the ticketing deadline is {_when(d['deadline'])}."


SENTENCES: dict[tuple[str | None, str], Callable[[Details], str]] = {
    ("delivery-stuck", "destination-stuck"): _stuck,
    ("delivery-stuck", "orphaned-queue"): _orphaned,
    ("delivery-expired", "expired"): _expired,
    (None, "confirmed"): _status("pass the confirmation on"),
    (None, "refused"): _status("rebook"),
    (None, "waitlisted"): _status("waitlisted"),
    (None, "schedule-change"): _status("schedule change"),
    (None, "review"): _status("an unknown code, to review"),
    (None, "late-reply"): _status("a reply for a segment already cancelled"),
    (None, "unanswered"): _unanswered,
    (None, "ticketing-due"): _ticketing,
}


def sentence(item: Mapping[str, Any]) -> str:
    """The sentence for a worklist item's JSON (``queue``, ``reason``, ``details``).

    Falls back to :func:`plain` for a reason without a sentence or details without the fields
    the sentence needs.
    """
    details: Details = item.get("details") or {}
    queue, reason = item.get("queue"), str(item.get("reason"))
    if queue == "delivery-failed":
        build: Callable[[Details], str] | None = _failed
    else:
        build = SENTENCES.get((queue, reason)) or SENTENCES.get((None, reason))
    if build is not None:
        try:
            return build(details)
        except (KeyError, TypeError, ValueError):
            pass
    return plain(details)
