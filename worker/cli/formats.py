"""What the queue commands print and parse: the depth table, item rows and states, JSON output,
id lists and ranges (``3 5-9``), and the patient key a ``--patient-id`` looks up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from inturn.worker.crypto.codec import PayloadCodec

from inturn.worker.operations import queue as actions
from inturn.worker.store.model import DepthRow, HeadInfo, Item
from inturn.worker.text.display import printable, printable_values, table
from inturn.worker.text.durations import format_age


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON, every string in it made printable first (text from
    outside, such as a receiver's error text, cannot carry a line break into the output)."""
    click.echo(json.dumps(printable_values(data), indent=2))


def head_json(head: HeadInfo | None) -> dict[str, Any]:
    """The keys ``queue depth --json`` adds per destination about its head (its oldest pending
    item, which everything behind it waits for): ``headId`` (the item id ``queue show`` and
    ``queue skip`` take; null when nothing is pending or its first message is still in the
    channel's log, not yet taken by its worker), ``headAttempts`` (failed attempts so far) and
    ``headLastError`` (``"<class>: <detail>"`` of its last failure, or null)."""
    if head is None or head.item_id <= 0:
        return {"headId": None, "headAttempts": 0, "headLastError": None}
    return {"headId": head.item_id, "headAttempts": head.attempts, "headLastError": head.last_error}


def format_depth(
    rows: list[DepthRow],
    at: datetime | None = None,
    heads: Mapping[str, HeadInfo] | None = None,
) -> str:
    """The depth table: one line per destination with anything pending or failed, and one per
    destination on hold even when nothing is pending; HELD-UNTIL says when a destination
    outside its delivery window (``spec.schedule``) sends again, ``queue resume (suspended by
    WHO)`` for a suspended one (nothing goes until ``inturn queue resume``), or ``never:
    orphaned (not registered)`` for rows of a destination no longer registered. With
    ``heads`` (:func:`inturn.worker.store.reads.heads`), HEAD is the id of each destination's
    oldest pending item (``-`` when none is taken yet) and HEAD-LAST-ERROR its last failure."""
    if not rows:
        return "nothing pending or failed, nothing held"
    now = at or datetime.now(UTC)
    found = heads or {}

    def head_cells(r: DepthRow) -> list[str]:
        if heads is None:
            return []
        head = head_json(found.get(r.destination))
        item_id, error = head["headId"], head["headLastError"]
        return [
            "-" if item_id is None else str(item_id),
            clip(printable(error), 60) if error else "-",
        ]

    def held(r: DepthRow) -> str:
        if not r.registered:
            return "never: orphaned (not registered)"
        if r.held_at is not None:
            return f"queue resume (suspended by {r.held_by or 'someone'})"
        until = r.held_until(now)
        return "-" if until is None else until.strftime("%Y-%m-%d %H:%M UTC")

    columns = ["DESTINATION", "CHANNEL", "PENDING", "FAILED", "OLDEST", "MOST-ATTEMPTS"]
    return table(
        [*columns, "HELD-UNTIL", *(["HEAD", "HEAD-LAST-ERROR"] if heads is not None else [])],
        [
            [
                r.destination,
                r.channel,
                str(r.pending),
                str(r.failed),
                format_age(r.oldest_seconds) if r.pending else "-",
                str(r.max_attempts),
                held(r),
                *head_cells(r),
            ]
            for r in rows
        ],
    )


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def state_text(item: Item) -> str:
    """An item's state, with its resend link: ``failed (resent as 12)``, ``pending (copy of 7)``."""
    if item.resent_as is not None:
        return f"{item.state} (resent as {item.resent_as})"
    if item.resent_from is not None:
        return f"{item.state} (copy of {item.resent_from})"
    return item.state


#: How a delivered item's last error is introduced: it is an earlier attempt's, not its state.
EARLIER_ATTEMPT = "earlier attempt: "


def error_text(item: Item) -> str:
    """An item's last error as a person reads it beside its state: for a delivered item, it is
    the error of an attempt before the one that delivered it (``earlier attempt: AE: no
    text``); for the others, the error as stored (empty when none)."""
    if not item.last_error:
        return ""
    if item.state == "delivered":
        return EARLIER_ATTEMPT + item.last_error
    return item.last_error


def item_rows(items: list[Item]) -> list[list[str]]:
    now = datetime.now(UTC)
    return [
        [
            str(i.id),
            i.destination,
            state_text(i),
            clip(printable(i.message_type), 20),
            clip(printable(i.control_id), 30),
            str(i.attempts),
            format_age(i.age_seconds(now)),
            clip(printable(error_text(i)), 60),
        ]
        for i in items
    ]


def parse_id_ranges(values: tuple[str, ...]) -> tuple[list[int], list[tuple[int, int]]]:
    """Item ids and ranges from ``ID`` and ``FIRST-LAST`` arguments, apart: ``(ids,
    [(first, last)])`` (a range includes both ends; ``7-7`` is the id 7).

    Raises:
        click.BadParameter: not a number or a range, or a range backwards or too long.
    """
    ids: list[int] = []
    ranges: list[tuple[int, int]] = []
    for value in values:
        [low, high] = [min(r := parse_ids((value,))), max(r)]
        if low == high:
            ids.append(low)
        else:
            ranges.append((low, high))
    return ids, ranges


def parse_ids(values: tuple[str, ...]) -> list[int]:
    """Item ids from ``ID`` and ``FIRST-LAST`` arguments (a range includes both ends).

    Raises:
        click.BadParameter: not a number or a range, or a range backwards or too long.
    """
    ids: list[int] = []
    for value in values:
        first, sep, last = value.partition("-")
        try:
            low, high = (int(first), int(last)) if sep else (int(value), int(value))
        except ValueError:
            raise click.BadParameter(f"{value!r}: an item id or a range FIRST-LAST") from None
        if low < 1 or high > 2**63 - 1:
            raise click.BadParameter(f"{value!r}: item ids run from 1 to {2**63 - 1}")
        if high < low:
            raise click.BadParameter(f"{value!r}: the range ends before it starts")
        if high - low >= actions.RESEND_MAX:
            raise click.BadParameter(f"{value!r}: at most {actions.RESEND_MAX} items per resend")
        ids.extend(range(low, high + 1))
    return ids


def patient_key_for(
    patient_id: str | None, authority: str | None, payloads: PayloadCodec | None = None
) -> str | None:
    """The identifier index key of ``--patient-id`` (and ``--authority``), or None; with
    payload keys, its stored forms comma-separated (what the listings' SQL takes)."""
    if patient_id is None:
        if authority is not None:
            raise click.UsageError("--authority goes with --patient-id")
        return None
    if not patient_id.strip():
        raise click.UsageError("--patient-id is empty")
    if authority is not None and not authority.strip():
        raise click.UsageError("--authority is empty")
    from inturn.worker.operations.privacy import patient_lookup_key  # the console's key too

    return patient_lookup_key(patient_id, authority, payloads)


def ids_text(ids: list[int]) -> str:
    text = ",".join(map(str, ids[:5]))
    return text + (f",... ({len(ids)})" if len(ids) > 5 else "")
