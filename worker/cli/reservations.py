"""``inturn bookings import|show|apply-status``: reservation records from the command line.

The same operations as :mod:`inturn.worker.reservations.bookings`, one per command, each on
one database connection. A malformed import file prints every problem with its entry's index
and field, imports nothing and exits 2.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import psycopg

from inturn.worker.cli.db import watched
from inturn.worker.cli.options import dsn_option, json_option
from inturn.worker.reservations import bookings as api
from inturn.worker.reservations.bookings import Applied
from inturn.worker.reservations.codes import is_status_code
from inturn.worker.reservations.records import Booking, BookingFileError, parse_instant
from inturn.worker.store.bookings import SegmentEvent
from inturn.worker.store.connect import write_target
from inturn.worker.store.dsn import resolve_dsn
from inturn.worker.worklist import announce
from inturn.worker.worklist.publishers import close_all, from_env

T = TypeVar("T")


def run_conn(dsn: str | None, action: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
    """Open one autocommit connection on ``dsn`` (or ``$INTURN_DSN``), run ``action`` under a
    lock watch (:func:`inturn.worker.cli.db.watched`), close it."""
    target = resolve_dsn(dsn)

    async def go() -> T:
        async with await psycopg.AsyncConnection.connect(
            target,
            autocommit=True,
            connect_timeout=5,
            application_name="inturn-bookings",
            **write_target(target),
        ) as conn:
            return await watched(target, conn, action)

    return asyncio.run(go())


@click.group("bookings")
def bookings_group() -> None:
    """Import and inspect reservation records; apply a partner's status to a segment."""


@bookings_group.command("import")
@dsn_option()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def import_command(dsn: str | None, file: Path) -> None:
    """Import FILE, a JSON list of bookings (all or nothing; a locator again updates it)."""
    try:
        entries = api.read_file(file)
    except OSError as exc:
        raise click.ClickException(f"nothing imported: {file}: {exc.strerror or exc}") from None
    except BookingFileError as exc:
        lines = [f"{file}: {e}" for e in exc.errors[:20]]
        if len(exc.errors) > 20:
            lines.append(f"... and {len(exc.errors) - 20} more")
        raise click.ClickException(
            "nothing imported:\n  " + "\n  ".join(lines)
            if len(lines) > 1
            else f"nothing imported: {lines[0]}"
        ) from None
    summary = run_conn(dsn, lambda c: api.import_bookings(c, entries))
    click.echo(f"imported {summary}")


def _when(value: datetime | None) -> str:
    return value.isoformat().replace("+00:00", "Z") if value else "-"


def format_booking(booking: Booking, history: list[SegmentEvent]) -> str:
    """The ``bookings show`` text: the booking, its segments, and its status history."""
    lines = [
        f"locator:            {booking.locator}",
        f"owner:              {booking.owner}",
        f"created:            {_when(booking.created_at)}",
        f"ticketing deadline: {_when(booking.ticketing_deadline)}"
        + (
            f"  (given as {booking.ticketing_deadline_text})"
            if booking.ticketing_deadline_text
            else ""
        ),
        "ticketed:           "
        + ("yes " + " ".join(booking.ticket_numbers) if booking.ticketed else "no"),
    ]
    if booking.cancelled_at is not None:
        lines.append(f"cancelled:          {_when(booking.cancelled_at)} ({booking.cancel_reason})")
    lines.append("")
    lines.append(
        "SEG  CARRIER  FLIGHT  DATE        FROM  TO   STATUS  REQUESTED             CHANGED"
    )
    for s in booking.segments:
        lines.append(
            f"{s.number:<4} {s.carrier:<8} {s.flight:<7} {s.date.isoformat()}  {s.origin:<5}"
            f" {s.destination:<4} {s.status:<7} {_when(s.requested_at):<21}"
            f" {_when(s.status_changed_at)}"
        )
    if history:
        lines.append("")
        lines.append("history:")
        for e in history:
            lines.append(
                f"  {_when(e.received_at)}  segment {e.number}: {e.code}"
                f" ({e.previous} -> {e.result}, {e.outcome})"
            )
    return "\n".join(lines)


@bookings_group.command("show")
@dsn_option()
@json_option
@click.argument("locator")
def show_command(dsn: str | None, as_json: bool, locator: str) -> None:
    """One booking: its segments and the history of their statuses."""
    found = run_conn(dsn, lambda c: api.show(c, locator.upper()))
    if found is None:
        raise click.ClickException(f"no booking {locator.upper()}")
    booking, history = found
    if as_json:
        doc = booking.to_json()
        doc["history"] = [e.to_json() for e in history]
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_booking(booking, history))


class _StatusCode(click.ParamType[str]):
    name = "code"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """Return the code in upper case; anything but two letters or digits is a usage error."""
        code = str(value).upper()
        if not is_status_code(code):
            self.fail(
                f"{value!r} is not a status code (two letters or digits, e.g. KK)", param, ctx
            )
        return code


class _Instant(click.ParamType[datetime]):
    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        """Return an aware UTC datetime from RFC 3339 text with an offset."""
        if isinstance(value, datetime):
            return value
        try:
            return parse_instant(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@bookings_group.command("apply-status")
@dsn_option()
@json_option
@click.argument("locator")
@click.argument("segment", type=click.IntRange(1, 99))
@click.argument("code", type=_StatusCode())
@click.option(
    "--received-at",
    type=_Instant(),
    default=None,
    help="When the partner's message arrived (RFC 3339; default: database now).",
)
@click.option("--who", default="bookings", show_default=True, help="Recorded as placed_by.")
def apply_status_command(
    dsn: str | None,
    as_json: bool,
    locator: str,
    segment: int,
    code: str,
    received_at: datetime | None,
    who: str,
) -> None:
    """Apply a partner's CODE (reply or schedule change) to SEGMENT of LOCATOR.

    The segment takes the holding code the reply folds into (KK to HK, US to HL...), and the
    work it causes goes on the owner's worklist in the same transaction. A reply for a
    cancelled segment is recorded and raised as late-reply, the segment unchanged.
    """

    target = resolve_dsn(dsn)
    try:
        publishers = from_env(os.environ, target)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None

    async def go(conn: psycopg.AsyncConnection[Any]) -> Applied:
        try:
            done = await api.apply_status(
                conn, locator.upper(), segment, code, received_at, placed_by=who
            )
            if done.placement is not None:  # committed: announce it (INTURN_WORKLIST_*)
                await announce([done.placement], publishers)
        finally:
            await close_all(publishers)
        return done

    try:
        done = run_conn(target, go)
    except api.SegmentNotFound as exc:
        raise click.ClickException(str(exc)) from None
    placed = done.placement
    if as_json:
        click.echo(
            json.dumps(
                {
                    "locator": done.locator,
                    "segment": done.segment,
                    "code": done.code,
                    "outcome": done.outcome,
                    "previous": done.previous,
                    "status": done.status,
                    "placed": None
                    if placed is None
                    else {
                        "id": placed.item.id,
                        "queue": placed.item.queue,
                        "reason": placed.item.reason,
                        "created": placed.created,
                    },
                    "answered": [i.id for i in done.answered],
                },
                indent=2,
            )
        )
        return
    head = f"{done.locator} segment {done.segment}: {done.code}"
    if done.outcome == "late":
        head += f" arrived late (segment stays {done.status})"
    else:
        head += f" applied ({done.previous} -> {done.status})"
    click.echo(head)
    if placed is not None:
        how = "placed" if placed.created else "already on"
        click.echo(
            f"{how} worklist {placed.item.queue}: {placed.item.reason} (item {placed.item.id})"
        )
    for item in done.answered:
        click.echo(f"cleared item {item.id} ({item.reason}): answered")
