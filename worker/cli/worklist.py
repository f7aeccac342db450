"""``inturn worklist list|count|show|clear``.

Listings show codes, record keys, times and who; details are small and never a payload.
``clear`` requires ``--who`` and ``--note``. (``inturn sweep`` is :mod:`inturn.worker.cli.sweep`.)
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from psycopg import AsyncConnection

from inturn.worker.cli.db import run_read, run_write
from inturn.worker.cli.options import dsn_option, json_option
from inturn.worker.errors import Conflict, NotFound
from inturn.worker.operations import worklist as worklist_actions
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import worklist as store
from inturn.worker.store.worklist_model import ITEM_STATES, CountRow, Page, WorklistItem
from inturn.worker.text.display import printable, table
from inturn.worker.text.durations import format_age
from inturn.worker.worklist.describe import sentence

T = TypeVar("T")


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def format_items(items: list[WorklistItem], now: datetime) -> str:
    """The listing table: one line per item, oldest or newest first as asked."""
    if not items:
        return "no items"
    rows = [
        [
            str(i.id),
            i.queue,
            i.reason,
            f"{i.record_kind}:{i.record_key}",
            i.state,
            format_age((now - i.placed_at).total_seconds()),
            i.placed_by,
            i.cleared_by or "",
        ]
        for i in items
    ]
    return table(
        ["ID", "QUEUE", "REASON", "RECORD", "STATE", "AGE", "PLACED BY", "CLEARED BY"], rows
    )


def format_counts(rows: list[CountRow], now: datetime) -> str:
    """The count table: items per queue and reason, with the oldest placement's age."""
    if not rows:
        return "no items"
    return table(
        ["QUEUE", "REASON", "ITEMS", "OLDEST"],
        [
            [
                r.queue,
                r.reason,
                str(r.items),
                format_age((now - r.oldest).total_seconds()) if r.oldest else "-",
            ]
            for r in rows
        ],
    )


def format_item(item: WorklistItem) -> str:
    """One item, field by field: what it is about as a sentence, then its details as compact
    JSON."""
    lines = [
        f"id:         {item.id}",
        f"queue:      {item.queue}",
        f"reason:     {item.reason}",
        f"record:     {item.record_kind}:{item.record_key}",
        f"state:      {item.state}",
        f"placed:     {_when(item.placed_at)} by {item.placed_by}",
    ]
    if item.cleared_at is not None:
        lines.append(f"cleared:    {_when(item.cleared_at)} by {item.cleared_by}")
        lines.append(f"note:       {item.note}")
    lines.append(f"what:       {printable(sentence(item.to_json()))}")
    lines.append(f"details:    {json.dumps(item.details, sort_keys=True)}")
    return "\n".join(lines)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group("worklist")
def worklist_group() -> None:
    """List, count, show and clear worklist items (work for people)."""


@worklist_group.command("list")
@dsn_option()
@click.option("--queue", help="Only this queue.")
@click.option("--reason", help="Only this reason.")
@click.option(
    "--state",
    type=click.Choice([*ITEM_STATES, "all"]),
    default="pending",
    show_default=True,
    help="Only items in this state (all: both).",
)
@click.option(
    "--record", metavar="KIND:KEY", help="Only items about this record, e.g. delivery:42."
)
@click.option("--placed-from", type=click.DateTime(), help="Placed at or after (UTC).")
@click.option("--placed-to", type=click.DateTime(), help="Placed before (UTC).")
@click.option("--newest-first", is_flag=True, help="Newest placements first (default: oldest).")
@click.option(
    "--limit",
    type=click.IntRange(1, None),
    default=store.LIST_LIMIT_DEFAULT,
    show_default=True,
    help=f"Items per page (at most {store.LIST_LIMIT_MAX}).",
)
@click.option("--cursor", type=click.IntRange(0, None), help="Next page: the cursor printed last.")
@json_option
def list_command(
    dsn: str | None,
    queue: str | None,
    reason: str | None,
    state: str,
    record: str | None,
    placed_from: datetime | None,
    placed_to: datetime | None,
    newest_first: bool,
    limit: int,
    cursor: int | None,
    as_json: bool,
) -> None:
    """List items, oldest first (the longest waiting), a page at a time."""
    kind = key = None
    if record is not None:
        kind, sep, key = record.partition(":")
        if not sep or not kind or not key:
            raise click.BadParameter("expected KIND:KEY, e.g. delivery:42", param_hint="--record")

    async def go(conn: AsyncConnection[Any]) -> tuple[Page, datetime]:
        page = await store.list_items(
            conn,
            queue=queue,
            reason=reason,
            state=None if state == "all" else state,
            record_kind=kind,
            record_key=key,
            placed_from=placed_from.replace(tzinfo=UTC) if placed_from else None,
            placed_to=placed_to.replace(tzinfo=UTC) if placed_to else None,
            newest_first=newest_first,
            limit=limit,
            cursor=cursor,
        )
        return page, await store.now(conn)

    page, now = run_read(dsn, go)
    if as_json:
        _emit(page.to_json())
        return
    click.echo(format_items(page.items, now))
    if page.next_cursor is not None:
        click.echo(f"more: --cursor {page.next_cursor}")


@worklist_group.command("count")
@dsn_option()
@click.option("--queue", help="Only this queue.")
@click.option(
    "--state",
    type=click.Choice(ITEM_STATES),
    default="pending",
    show_default=True,
    help="Count the items in this state.",
)
@json_option
def count_command(dsn: str | None, queue: str | None, state: str, as_json: bool) -> None:
    """Items per queue and reason."""

    async def go(conn: AsyncConnection[Any]) -> tuple[list[CountRow], datetime]:
        return await store.count(conn, state=state, queue=queue), await store.now(conn)

    rows, now = run_read(dsn, go)
    if as_json:
        _emit([r.to_json() for r in rows])
        return
    click.echo(format_counts(rows, now))


@worklist_group.command("show")
@dsn_option()
@click.argument("item_id", type=click.IntRange(1, None))
@json_option
def show_command(dsn: str | None, item_id: int, as_json: bool) -> None:
    """One item and the history of its record (every item placed for it)."""
    try:
        shown = run_read(dsn, lambda conn: store.show(conn, item_id))
    except store.ItemNotFound as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        _emit(shown.to_json())
        return
    click.echo(format_item(shown.item))
    click.echo("history:")
    for i in shown.history:
        cleared = (
            f", cleared {_when(i.cleared_at)} by {i.cleared_by}: {i.note}" if i.cleared_at else ""
        )
        click.echo(
            f"  {i.id}  {i.queue}/{i.reason}  placed {_when(i.placed_at)} by {i.placed_by}{cleared}"
        )


@worklist_group.command("clear")
@dsn_option()
@click.argument("item_id", type=click.IntRange(1, None))
@click.option("--who", required=True, help="Who clears it (recorded on the item and in the audit).")
@click.option(
    "--note", required=True, help="What was done (recorded on the item and in the audit)."
)
@json_option
def clear_command(dsn: str | None, item_id: int, who: str, note: str, as_json: bool) -> None:
    """Clear one pending item: who did the work and what was done."""
    try:
        item = run_write(
            dsn, lambda conn: worklist_actions.clear(conn, Trusted(who), item_id, note)
        )
    except (NotFound, Conflict) as exc:
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:  # a blank --who or --note, a note too long
        raise click.UsageError(str(exc)) from None
    if as_json:
        _emit(item.to_json())
        return
    click.echo(
        f"cleared {item.id} ({item.queue}/{item.reason}, {item.record_kind}:{item.record_key})"
    )
