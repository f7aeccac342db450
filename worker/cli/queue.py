"""``inturn queue ...``: the operators' command line for the delivery queue.

Each command opens the store with the DSN from ``--dsn`` or ``INTURN_DSN``, runs one operation
and exits. Listings never show payloads; ``payload`` writes one item's bytes on purpose.
Decisions that abandon, delete or expose messages require ``--who`` (skip, drain, erase) and
``--why`` (skip, drain, erase, payload, a search by ``--patient-id``), as in the console: the
rules are :data:`inturn.worker.operations.actor.ACTIONS`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import psycopg
from psycopg import AsyncConnection

from inturn.worker.cli.db import act, run_read, with_payloads
from inturn.worker.cli.formats import (
    echo_json,
    error_text,
    format_depth,
    head_json,
    ids_text,
    item_rows,
    parse_id_ranges,
    patient_key_for,
)
from inturn.worker.cli.options import (
    ITEM_ID,
    audit_who_option,
    dsn_option,
    json_option,
    payload_keys_options,
    who_option,
    why_for,
    why_option,
)
from inturn.worker.cli.privacy import (
    authority_option,
    erase_command,
    patient_id_option,
    payload_command,
)
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.drain.lanes import LaneSummary, summarize
from inturn.worker.errors import InturnError, ReasonRequired
from inturn.worker.operations import privacy
from inturn.worker.operations import queue as actions
from inturn.worker.operations.actor import Trusted, permit
from inturn.worker.store import history, reads, registry
from inturn.worker.store.model import STATES, DepthRow, HeadInfo
from inturn.worker.text.display import printable, table

T = TypeVar("T")


@click.group("queue")
def queue_group() -> None:
    """Inspect and act on delivery queues."""


#: What ``queue depth`` says of a destination whose lane window could not be read in time.
LANE_VIEW_UNAVAILABLE = (
    f"lanes view unavailable (its pending messages took longer than"
    f" {reads.LANE_VIEW_TIMEOUT_MS / 1000:g} s to read)"
)


def lane_json(summary: LaneSummary | None, count: int) -> dict[str, Any]:
    """A destination's ``laneView`` in ``queue depth --json``: the summary's JSON, or
    ``{"count": n, "unavailable": text}`` when its window could not be read in time."""
    if summary is None:
        return {"count": count, "unavailable": LANE_VIEW_UNAVAILABLE}
    return summary.to_json()


@queue_group.command("depth")
@dsn_option()
@json_option
def depth_command(dsn: str | None, as_json: bool) -> None:
    """Per destination: pending, failed, age of the oldest, highest attempt count, until
    when it is held outside its delivery window, and its head: the id of its oldest pending
    item (what everything behind it waits for; ``queue show`` and ``queue skip`` take it) and
    that item's last error; for a destination with lanes (``spec.lanes.count`` above 1), what
    its lanes send and what holds its oldest waiting message. Then, in the table form, the
    history's size and oldest day, the hot table's size and when ``inturn purge`` last ran
    (and whether a day is late to turn or to drop)."""

    async def read(
        conn: AsyncConnection[Any],
    ) -> tuple[list[DepthRow], dict[str, HeadInfo], dict[str, LaneSummary | None], history.Status]:
        rows = await reads.depth(conn)
        heads = await reads.heads(conn, [r.destination for r in rows if r.pending])
        lanes: dict[str, LaneSummary | None] = {}
        for r in rows:
            if r.lanes > 1 and r.pending:  # each bounded: a slow one fails only its own view
                window = await reads.lane_window_within(conn, r.destination)
                lanes[r.destination] = (
                    None if window is None else summarize(window, r.lanes, reads.LANE_VIEW_LIMIT)
                )
        return rows, heads, lanes, await history.status(conn, count_up_to=history.COUNT_UP_TO)

    rows, heads, lanes, kept = run_read(dsn, read)
    if as_json:
        now = datetime.now(UTC)
        echo_json(
            [
                {**r.to_json(now), **head_json(heads.get(r.destination)),
                 **({"laneView": lane_json(lanes[r.destination], r.lanes)}
                    if r.destination in lanes else {})}
                for r in rows
            ]
        )  # fmt: skip
    else:
        click.echo(format_depth(rows, heads=heads))
        for destination, summary in lanes.items():
            text = LANE_VIEW_UNAVAILABLE if summary is None else summary.describe()
            click.echo(f"{destination}: {text}")
        click.echo(kept.describe(datetime.now(UTC)))


@queue_group.command("list")
@dsn_option()
@json_option
@click.option("--destination", "-d", help="namespace/name")
@click.option("--channel", "-c", help="Only the items of this channel.")
@click.option("--state", "-s", type=click.Choice(STATES), help="Only the items in this state.")
@click.option("--control-id", help="Only the items of this MSH-10 (exact match; indexed).")
@patient_id_option
@authority_option
@audit_who_option
@click.option(
    "--why",
    help="With --patient-id: why (required; recorded in the audit, as every search by patient).",
)
@payload_keys_options
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Items to show (at most 1,000).",
)
@click.option("--offset", type=click.IntRange(0), default=0, help="Skip this many (the next page).")
@click.option("--before", type=click.IntRange(1), help="Only items with a smaller id (a cursor).")
def list_command(
    dsn: str | None,
    as_json: bool,
    destination: str | None,
    channel: str | None,
    state: str | None,
    control_id: str | None,
    patient_id: str | None,
    authority: str | None,
    who: str,
    why: str | None,
    payload_keys: str | None,
    key_dsn: str | None,
    limit: int,
    offset: int,
    before: int | None,
) -> None:
    """Items newest first (never payloads), with the total count.

    A --patient-id search is the console's patient search (one rule: the privacy role's
    search-patient): it needs --why and is audited with --who, the reason and the ids shown
    (never the identifier), on the write connection. With --payload-keys it finds rows under
    the blind index too."""
    patient_key_for(patient_id, authority)  # usage errors before connecting
    filters = reads.PageFilters(
        destination=destination,
        channel=channel,
        state=state,
        control_id=control_id,
        offset=offset,
        before=before,
    )
    if patient_id is None:
        if why is not None:
            raise click.UsageError("--why goes with --patient-id (a listing is not audited)")
        items, total = run_read(dsn, lambda conn: reads.list_items(conn, limit=limit, **filters))
        unindexed = 0
        if destination is not None and total == 0 and offset == 0 and before is None:
            # an empty listing of a name nobody knows is most often a typo: say so (exit 1)
            known = run_read(dsn, lambda conn: actions.known_destination(conn, destination))
            if not known:
                raise click.ClickException(
                    f"no destination {destination} (names are namespace/name; see"
                    " `inturn queue depth`)"
                )
    else:
        actor = Trusted(who)
        try:
            permit(actor, "search-patient", why)  # refused before connecting
        except ReasonRequired as exc:
            raise click.UsageError(f"{exc} (--why)") from None
        except InturnError as exc:
            raise click.UsageError(str(exc)) from None

        def search(conn: AsyncConnection[Any]) -> Awaitable[privacy.PatientSearch]:
            assert patient_id is not None
            return with_payloads(
                payload_keys,
                key_dsn,
                lambda codec: privacy.search_patient(
                    conn,
                    actor,
                    patient_id,
                    authority,
                    why,
                    limit=limit,
                    payloads=codec,
                    **filters,
                ),
            )

        found = act(dsn, search)
        items, total, unindexed = found.items, found.total, found.unindexed
    listing_all = patient_id is None and destination is None and control_id is None
    if listing_all and state in (None, "pending"):
        unlisted = run_read(dsn, lambda conn: _untaken(conn, channel))
        if unlisted:
            click.echo(
                f"note: {unlisted} pending message(s) not yet taken by their destination's"
                " worker are listed only with --destination (or --control-id); `inturn queue"
                " depth` counts them",
                err=True,
            )
    if unindexed:
        click.echo(
            f"warning: {unindexed} item(s) are not indexed yet and were not searched; run"
            " `inturn migrate` to index them (`queue erase --patient-id` reads them anyway)",
            err=True,
        )
    if as_json:
        echo_json({"total": total, "items": [i.to_json() for i in items]})
        return
    click.echo(
        table(
            [
                "ID",
                "DESTINATION",
                "STATE",
                "TYPE",
                "CONTROL-ID",
                "ATTEMPTS",
                "IN-QUEUE",
                "LAST-ERROR",
            ],
            item_rows(items),
        )
    )
    click.echo(f"{len(items)} of {total}")


async def _untaken(conn: AsyncConnection[Any], channel: str | None) -> int:
    """Pending messages of the channel log no destination's worker has taken yet (counted by
    the depth, listed by a listing only per destination or MSH-10)."""
    waiting = sum(
        r.pending for r in await reads.depth(conn, holds=False) if channel in (None, r.channel)
    )
    _, taken = await reads.list_items(conn, channel=channel, state="pending", limit=0)
    return max(waiting - taken, 0)


@queue_group.command("show")
@dsn_option()
@json_option
@click.argument("item_id", type=ITEM_ID)
def show_command(dsn: str | None, as_json: bool, item_id: int) -> None:
    """One item's fields (not its payload), and what its receiver is sent: its destination's
    receiver profile (see `inturn queue payload ID --as-sent`) and its MSH-13 number."""

    async def read(conn: AsyncConnection[Any]) -> tuple[Any, reads.ReceiverView | None]:
        found = await reads.get_item(conn, item_id)
        if found is None:
            return None, None
        return found, await reads.receiver_view(conn, found.destination, item_id)

    item, view = run_read(dsn, read)
    if item is None or view is None:
        raise click.ClickException(f"no item {item_id}")
    data = item.to_json()
    if as_json:
        echo_json({**data, "profile": view.profile, "sequenceNumber": view.sequence_number})
        return
    for key, value in data.items():
        if key == "lastError" and value is not None:
            value = error_text(item)  # a delivered item's: an earlier attempt's, not its state
        click.echo(f"{key + ':':14} {'' if value is None else printable(str(value))}")
    if view.profile is None:
        click.echo(f"{'profile:':14} none (its receiver gets the stored bytes)")
    else:
        rules = ", ".join(sorted(view.profile))
        click.echo(
            f"{'profile:':14} {rules} (`inturn queue payload {item_id} --as-sent` prints what"
            " its receiver gets)"
        )
    if view.sequence_number is not None:
        click.echo(f"{'sequence:':14} {view.sequence_number} (MSH-13 as sent)")


@queue_group.command("retry")
@dsn_option()
@click.argument("item_id", type=ITEM_ID, required=False)
@click.option("--destination", "-d", help="Retry every pending item of this destination.")
@audit_who_option
@why_option
def retry_command(
    dsn: str | None, item_id: int | None, destination: str | None, who: str, why: str | None
) -> None:
    """Make an item (or a whole destination) due now, with its attempts reset to 0."""
    if (item_id is None) == (destination is None):
        raise click.UsageError("give exactly one of ITEM_ID or --destination")
    actor = Trusted(who)
    if item_id is not None:
        done = act(dsn, lambda conn: actions.retry_item(conn, actor, item_id, why))
    else:
        assert destination is not None
        done = act(dsn, lambda conn: actions.retry_destination(conn, actor, destination, why))
    if not done.ids:
        raise click.ClickException(f"nothing pending for {destination}")
    click.echo(f"retrying now: {len(done.ids)} item(s)")


@queue_group.command("skip")
@dsn_option()
@click.argument("item_id", type=ITEM_ID)
@who_option
@why_for("skip")
def skip_command(dsn: str | None, item_id: int, who: str, why: str) -> None:
    """Abandon one pending item on purpose (state skipped; audited with the reason).

    Any pending item may be skipped; when it was not its destination's head (its oldest
    pending item, what holds the queue), a warning names the head, its attempts and its last
    error: the item most often meant is the head."""

    async def skip(conn: AsyncConnection[Any]) -> HeadInfo | None:
        head = None
        try:
            async with conn.transaction():  # a savepoint: a login that may not read it still skips
                item = await reads.get_item(conn, item_id)
                if item is not None and item.state == "pending":
                    head = (await reads.heads(conn, [item.destination])).get(item.destination)
        except psycopg.errors.InsufficientPrivilege:
            head = None
        await actions.skip(conn, Trusted(who), item_id, why)
        return head if head is not None and head.item_id != item_id else None

    head = act(dsn, skip)
    click.echo(f"skipped {item_id}")
    if head is not None:
        click.echo(not_the_head(item_id, head), err=True)


def not_the_head(item_id: int, head: HeadInfo) -> str:
    """The warning of ``queue skip`` for an item that was not its destination's head."""
    if head.item_id <= 0:  # the oldest is still in the channel's log: none taken before it
        return f"warning: {item_id} was not the head of its destination; it was skipped anyway"
    error = printable(head.last_error) if head.last_error else "none"
    return (
        f"warning: {item_id} was not the head of its destination; it was skipped anyway. The"
        f" head (its oldest pending item, which holds the queue) is {head.item_id}:"
        f" {head.attempts} failed attempt(s), last error: {error}"
    )


@queue_group.command("drain")
@dsn_option()
@click.argument("destination")
@who_option
@why_for("drain")
def drain_command(dsn: str | None, destination: str, who: str, why: str) -> None:
    """Skip every pending item of DESTINATION (namespace/name); audited with the reason."""
    done = act(dsn, lambda conn: actions.drain(conn, Trusted(who), destination, why))
    click.echo(f"drained {len(done.ids)} item(s) from {destination}")


def _hold_command(verb: str) -> click.Command:
    hold = actions.suspend if verb == "suspend" else actions.resume

    @click.command(verb)
    @dsn_option()
    @click.argument("destination")
    @who_option
    @why_option
    def command(dsn: str | None, destination: str, who: str, why: str | None) -> None:
        click.echo(act(dsn, lambda conn: hold(conn, Trusted(who), destination, why)).describe())

    command.help = (
        "Hold DESTINATION's delivery (namespace/name): its worker sends nothing after the attempt"
        " in flight, messages keep queueing; audited."
        if verb == "suspend"
        else "Lift the hold on DESTINATION and wake its worker; audited."
    )
    return command


queue_group.add_command(_hold_command("suspend"))
queue_group.add_command(_hold_command("resume"))


@queue_group.command("mark-delivered")
@dsn_option()
@click.argument("destination")
@click.option(
    "--through",
    type=click.IntRange(min=1),
    default=None,
    help="The id of the last item its receiver already has (as inturn queue list shows it)."
    " Without it: what the operator found it had delivered before the restore.",
)
@who_option
@why_for("mark-delivered")
def mark_delivered_command(
    dsn: str | None, destination: str, through: int | None, who: str, why: str
) -> None:
    """Mark DESTINATION's pending messages delivered, never to be sent: after the queue
    database was restored from a backup, those its receiver already got (by default, what the
    operator found it had delivered before; a message accepted after the restore is never
    marked). Audited with the reason; then `inturn queue resume DESTINATION` lets the rest go."""
    done = act(
        dsn, lambda conn: actions.mark_delivered(conn, Trusted(who), destination, through, why)
    )
    upto = f" up to id {through}" if through is not None else " delivered before the restore"
    click.echo(f"marked delivered: {len(done.ids)} item(s) of {destination}{upto}")


@queue_group.command("remove")
@dsn_option()
@click.argument("item_ids", type=ITEM_ID, nargs=-1, required=True)
@audit_who_option
@why_option
def remove_command(dsn: str | None, item_ids: tuple[int, ...], who: str, why: str | None) -> None:
    """Delete finished items (delivered, failed, skipped); pending ones are refused."""
    done = act(dsn, lambda conn: actions.remove(conn, Trusted(who), item_ids, why))
    click.echo(f"removed {len(done.removed)} item(s)")
    for reason in done.reasons:
        click.echo(f"not removed: {reason}", err=True)
    if done.kept:
        kept = ", ".join(map(str, done.kept))
        raise click.ClickException(f"not removed: {kept}")


@queue_group.command("resend")
@dsn_option()
@click.argument("items", nargs=-1, metavar="[ID|FIRST-LAST]...")
@click.option(
    "-d",
    "--destination",
    help="Every failed item of this destination that was never resent (instead of ids).",
)
@click.option(
    "--message-type",
    metavar="PATTERN",
    help="With --destination: only failed items whose MSH-9 matches (* and ? wildcards).",
)
@click.option(
    "--include-delivered",
    is_flag=True,
    help="Also resend delivered and skipped items among the ids and ranges (their receivers"
    " get them again). Without it only failed items are resent.",
)
@who_option
@why_option
@json_option
@payload_keys_options
def resend_command(
    dsn: str | None,
    items: tuple[str, ...],
    destination: str | None,
    message_type: str | None,
    include_delivered: bool,
    who: str,
    why: str | None,
    as_json: bool,
    payload_keys: str | None,
    key_dsn: str | None,
) -> None:
    """Queue copies of failed items at the tail of their queues, in their original order.

    Give item ids and ranges ('inturn queue resend 120 125-130'), or --destination for
    every failed item of a destination that still needs a person. One transaction, audited
    once; the originals keep their history and are shown as resent.

    Only failed items are resent unless --include-delivered is given. One id that cannot be
    resent is the command's error (its reason, exit 2); among several ids, one that is not
    resent is listed with its reason (exit 1). A range covers the items of the
    destination of its ends only (ids interleave across destinations): its other items
    (other destinations, delivered, pending, already resent) are left out, one line per
    kind with its count, and nothing changes for them.

    A copy goes out after everything queued since its original: it can reach the receiver
    after later messages about the same patient. A copy for a destination that is no longer
    registered (its manifest or Destination removed) is queued all the same, with a warning:
    no worker sends it until the destination is registered again.
    """
    if bool(items) == bool(destination):
        raise click.UsageError("give item ids or ranges, or --destination (not both)")
    if message_type and not destination:
        raise click.UsageError("--message-type goes with --destination")
    if include_delivered and destination:
        raise click.UsageError("--include-delivered goes with ids and ranges")

    def keyed(call: Callable[[PayloadCodec], Awaitable[T]]) -> Awaitable[T]:
        return with_payloads(payload_keys, key_dsn, call)

    if destination:
        done = act(
            dsn,
            lambda conn: keyed(
                lambda c: actions.resend_failed(
                    conn, Trusted(who), destination, why, message_type=message_type, payloads=c
                )
            ),
        )
    else:
        ids, ranges = parse_id_ranges(items)
        if len(ids) == 1 and not ranges:  # one item: its refusal is the command's error
            one = act(
                dsn,
                lambda conn: keyed(
                    lambda c: actions.resend(
                        conn, Trusted(who), ids[0], why, c, include_delivered=include_delivered
                    )
                ),
            )
            done = actions.ResentMany(((one.original, one.copy),), ())
        else:
            done = act(
                dsn,
                lambda conn: keyed(
                    lambda c: actions.resend_many(
                        conn,
                        Trusted(who),
                        ids,
                        why,
                        c,
                        ranges=ranges,
                        include_delivered=include_delivered,
                    )
                ),
            )
    if as_json:
        click.echo(json.dumps(done.to_json(), indent=2))
    else:
        for original, copy in done.copies:
            click.echo(f"queued copy of {original} as {copy}")
        for dest in run_read(dsn, lambda conn: unregistered_of(conn, done.copies, destination)):
            click.echo(
                f"warning: {dest} is not registered (its manifest or Destination is gone): no"
                " worker sends its copies until it is registered again (`inturn queue depth`"
                " shows it orphaned)",
                err=True,
            )
        for line in done.left_out_lines():
            click.echo(line, err=True)
        for item_id, reason in done.refused:
            click.echo(f"not resent: {item_id}: {reason}", err=True)
        if not done.copies and not done.refused:
            click.echo("nothing resent", err=True)
    if done.refused or not done.copies:
        sys.exit(1)


async def unregistered_of(
    conn: AsyncConnection[Any], copies: tuple[tuple[int, int], ...], destination: str | None
) -> list[str]:
    """The destinations of ``copies`` (``(original, copy)`` ids; all of ``destination`` when
    given, else each copy read) that are not registered (no worker serves them: a removed
    manifest, a deleted Destination), sorted; a new user's trial resent into a removed
    destination and was told nothing."""
    if not copies:
        return []
    known = {r.destination: r.deleted for r in await registry.list_all(conn)}
    found: set[str] = {destination} if destination else set()
    for _, copy in () if destination else copies:
        item = await reads.get_item(conn, copy)
        if item is not None:
            found.add(item.destination)
    return sorted(d for d in found if known.get(d, True))


@queue_group.command("audit")
@dsn_option()
@json_option
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="Entries to show, newest first.",
)
def audit_command(dsn: str | None, as_json: bool, limit: int) -> None:
    """Who decided what (skip, drain, erase, retry-now, resend, remove), when, and why."""
    entries = run_read(dsn, lambda conn: reads.audit_log(conn, limit))
    if as_json:
        echo_json(entries)
        return
    click.echo(
        table(
            ["AT", "WHO", "ACTION", "DESTINATION", "ITEMS", "WHY"],
            [
                [
                    e["at"][:19],
                    e["who"],
                    e["action"],
                    e["destination"] or "-",
                    ids_text(e["itemIds"]),
                    e["why"] or "",
                ]
                for e in entries
            ],
        )
    )


queue_group.add_command(payload_command)
queue_group.add_command(erase_command)
