"""``inturn migrate``, ``inturn queue ...`` and ``inturn purge``: the operators' command line.

Each command opens the store with the DSN from ``--dsn`` or ``INTURN_DSN``, runs one operation
and exits. Listings never show payloads; ``payload`` writes one item's bytes on purpose.
Decisions that abandon or delete messages (skip, drain, erase) require ``--who``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from psycopg import AsyncConnection

from inturn.worker.cli.options import DURATION, dsn_option, json_option, who_option, why_option
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.store import identifiers, lockwatch, queue, registry, roles
from inturn.worker.store.connect import READ_STATEMENT_TIMEOUT_MS, Pools, probe, resolve_dsn
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import STATES, DepthRow, Item
from inturn.worker.text.display import printable, printable_values
from inturn.worker.text.durations import format_age
from inturn.worker.worklist.store import purge as worklist_purge

T = TypeVar("T")

patient_id_option = click.option(
    "--patient-id",
    help="Only the items naming this patient ID in PID-2, PID-3, PID-4 or MRG-1 (indexed).",
)
authority_option = click.option(
    "--authority",
    help="With --patient-id: only identifiers assigned by this authority (CX-4 namespace or"
    " universal ID).",
)

#: Items read by ``erase --scan`` before it tells how long the rest will take.
SCAN_RATE_SAMPLE = 2000


def run_db(dsn: str | None, action: Callable[[Pools], Awaitable[T]]) -> T:
    """Open the pools on ``dsn`` (or ``$INTURN_DSN``), run ``action`` with them, close them.

    Raises:
        click.ClickException: ``INTURN_LOCK_WAIT_SECONDS`` is not a number of seconds.
    """
    target = resolve_dsn(dsn)
    try:
        lockwatch.threshold_from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    # The probe fails fast with the server's own words; the pool would retry for 10 s.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

    async def go() -> T:
        await probe(target)
        async with await Pools.open(target, write_size=1, read_size=1) as pools:
            return await action(pools)

    return asyncio.run(go())


def run_read(dsn: str | None, action: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
    """Run ``action`` on a connection of the read-only pool (see :func:`run_db`), under a lock
    watch (:func:`watched`)."""

    async def go(pools: Pools) -> T:
        async with pools.read.connection() as conn:
            return await watched(pools, conn, action)

    return run_db(dsn, go)


def run_write(dsn: str | None, action: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
    """Run ``action`` on a connection of the write pool (see :func:`run_db`), under a lock
    watch (:func:`watched`)."""

    async def go(pools: Pools) -> T:
        async with pools.write.connection() as conn:
            return await watched(pools, conn, action)

    return run_db(dsn, go)


async def watched(
    pools: Pools, conn: AsyncConnection[Any], action: Callable[[AsyncConnection[Any]], Awaitable[T]]
) -> T:
    """Run ``action(conn)`` under a lock watch (:mod:`inturn.worker.store.lockwatch`): past the
    threshold (``INTURN_LOCK_WAIT_SECONDS``, and at most half the read pool's statement
    timeout, so that the look comes before the timeout), a line on stderr names the session
    the command waits for; a statement cancelled by its timeout after such a wait fails with
    :class:`~inturn.worker.store.lockwatch.LockWaitError` naming it, not as an unreachable
    database."""
    threshold = min(lockwatch.threshold_from_env(), READ_STATEMENT_TIMEOUT_MS / 2000)

    conninfo = pools.write.conninfo
    assert isinstance(conninfo, str)  # Pools.open gives the pools the DSN itself

    async def side() -> AsyncConnection[Any]:
        return await AsyncConnection.connect(
            conninfo,
            autocommit=True,
            application_name="inturn lock watch",
            connect_timeout=lockwatch.CONNECT_TIMEOUT_SECONDS,
        )

    said = False

    def on_wait(wait: lockwatch.LockWait, added_seconds: float) -> None:
        nonlocal said
        if not said and not wait.ended:
            said = True
            click.echo(f"inturn: {wait.describe()}", err=True)

    async with lockwatch.watch(conn, side, threshold=threshold, on_wait=on_wait):
        return await action(conn)


async def _why_not(conn: AsyncConnection[Any], item_id: int, action: str) -> str:
    """Why ``action`` (retry, skip) did nothing to ``item_id``: the same words as ``show``."""
    item = await queue.get_item(conn, item_id)
    if item is None:
        return f"no item {item_id}"
    if item.state == "failed" and action == "retry":
        return (
            f"item {item_id} failed (it is not pending): `inturn queue resend {item_id} --who ...`"
            " queues a copy of it"
        )
    return f"item {item_id} is {item.state}, not pending: nothing to {action}"


async def _known_destination(conn: AsyncConnection[Any], destination: str) -> bool:
    """Whether ``destination`` is registered or has items in any state."""
    if any(r.destination == destination for r in await registry.list_all(conn)):
        return True
    items, _ = await queue.list_items(conn, destination=destination, limit=1)
    return bool(items)


@click.command("migrate")
@dsn_option()
@click.option(
    "--create-roles",
    is_flag=True,
    help="Also create one least-privilege role per component and (re)set their grants.",
)
@click.option(
    "--role-prefix",
    default=roles.DEFAULT_PREFIX,
    show_default=True,
    help="Prefix of the role names (<prefix>ingest, <prefix>worker, ...).",
)
def migrate_command(dsn: str | None, create_roles: bool, role_prefix: str) -> None:
    """Apply the schema migrations (safe to run twice, or from two pods at once)."""
    if create_roles:
        try:
            roles.role_name(roles.COMPONENTS[0], role_prefix)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--role-prefix") from None
    target = resolve_dsn(dsn)
    applied = migrate(target)
    if applied:
        for m in applied:
            click.echo(f"applied {m.version:04d}_{m.name}")
    else:
        click.echo("schema is up to date")
    if create_roles:
        try:
            created = roles.apply_roles(target, role_prefix)
        except roles.RolesError as exc:
            raise click.ClickException(str(exc)) from None
        for role in created:
            click.echo(f"created role {role}")
        names = ", ".join(roles.role_name(c, role_prefix) for c in roles.COMPONENTS)
        click.echo(f"grants set for {names}")


def _echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON, every string in it made printable first (text from
    outside, such as a receiver's error text, cannot carry a line break into the output)."""
    click.echo(json.dumps(printable_values(data), indent=2))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain text table; every cell is made printable (see :mod:`inturn.worker.text.display`)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def format_depth(rows: list[DepthRow], at: datetime | None = None) -> str:
    """The depth table: one line per destination with anything pending or failed; HELD-UNTIL
    says when a destination outside its delivery window (``spec.schedule``) sends again."""
    if not rows:
        return "nothing pending or failed"
    now = at or datetime.now(UTC)

    def held(r: DepthRow) -> str:
        until = r.held_until(now)
        return "-" if until is None else until.strftime("%Y-%m-%d %H:%M UTC")

    return _table(
        ["DESTINATION", "CHANNEL", "PENDING", "FAILED", "OLDEST", "MAX-ATTEMPTS", "HELD-UNTIL"],
        [
            [
                r.destination,
                r.channel,
                str(r.pending),
                str(r.failed),
                format_age(r.oldest_seconds) if r.pending else "-",
                str(r.max_attempts),
                held(r),
            ]
            for r in rows
        ],
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _item_rows(items: list[Item]) -> list[list[str]]:
    now = datetime.now(UTC)
    return [
        [
            str(i.id),
            i.destination,
            i.state,
            _clip(printable(i.message_type), 20),
            _clip(printable(i.control_id), 30),
            str(i.attempts),
            format_age(i.age_seconds(now)),
            _clip(printable(i.last_error or ""), 60),
        ]
        for i in items
    ]


@click.group("queue")
def queue_group() -> None:
    """Inspect and act on delivery queues."""


@queue_group.command("depth")
@dsn_option()
@json_option
def depth_command(dsn: str | None, as_json: bool) -> None:
    """Per destination: pending, failed, age of the oldest, highest attempt count, and until
    when it is held outside its delivery window."""
    rows = run_read(dsn, queue.depth)
    if as_json:
        now = datetime.now(UTC)
        _echo_json([r.to_json(now) for r in rows])
    else:
        click.echo(format_depth(rows))


@queue_group.command("list")
@dsn_option()
@json_option
@click.option("--destination", "-d", help="namespace/name")
@click.option("--channel", "-c", help="Only the items of this channel.")
@click.option("--state", "-s", type=click.Choice(STATES), help="Only the items in this state.")
@click.option("--control-id", help="Only the items of this MSH-10 (exact match; indexed).")
@patient_id_option
@authority_option
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
    limit: int,
    offset: int,
    before: int | None,
) -> None:
    """Items newest first (never payloads), with the total count."""
    patient_key = _patient_key(patient_id, authority)

    async def go(conn: AsyncConnection[Any]) -> tuple[list[Item], int, int]:
        items, total = await queue.list_items(
            conn,
            destination=destination,
            channel=channel,
            state=state,
            control_id=control_id,
            patient_key=patient_key,
            limit=limit,
            offset=offset,
            before=before,
        )
        unindexed = 0
        if patient_key is not None:
            unindexed = await identifiers.unindexed_count(conn)
        return items, total, unindexed

    items, total, unindexed = run_read(dsn, go)
    if unindexed:
        click.echo(
            f"warning: {unindexed} item(s) are not indexed yet and were not searched; run"
            " `inturn migrate` to index them (`queue erase --patient-id` reads them anyway)",
            err=True,
        )
    if as_json:
        _echo_json({"total": total, "items": [i.to_json() for i in items]})
        return
    click.echo(
        _table(
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
            _item_rows(items),
        )
    )
    click.echo(f"{len(items)} of {total}")


@queue_group.command("show")
@dsn_option()
@json_option
@click.argument("item_id", type=int)
def show_command(dsn: str | None, as_json: bool, item_id: int) -> None:
    """One item's fields (not its payload)."""
    item = run_read(dsn, lambda conn: queue.get_item(conn, item_id))
    if item is None:
        raise click.ClickException(f"no item {item_id}")
    data = item.to_json()
    if as_json:
        _echo_json(data)
    else:
        for key, value in data.items():
            click.echo(f"{key + ':':14} {'' if value is None else printable(str(value))}")


@queue_group.command("payload")
@dsn_option()
@click.argument("item_id", type=int)
@click.option("--who", default="cli", show_default=True, help="Recorded in the audit.")
@why_option
def payload_command(dsn: str | None, item_id: int, who: str, why: str | None) -> None:
    """Write one item's bytes to standard output exactly as its sender sends them (the viewing
    is audited).

    These are the stored bytes: ingest stores a message with its segment terminators already
    normalised (see :mod:`inturn.worker.hl7.terminators`); the rule is applied here too, and
    changes nothing, so that rows stored before it print what is sent.
    """
    data = run_write(dsn, lambda conn: queue.view_payload(conn, item_id, who=who, why=why))
    if data is None:
        raise click.ClickException(f"no item {item_id}")
    sys.stdout.buffer.write(normalise_terminators(data))
    sys.stdout.buffer.flush()


@queue_group.command("retry")
@dsn_option()
@click.argument("item_id", type=int, required=False)
@click.option("--destination", "-d", help="Retry every pending item of this destination.")
@click.option("--who", default="cli", show_default=True, help="Recorded in the audit.")
@why_option
def retry_command(
    dsn: str | None, item_id: int | None, destination: str | None, who: str, why: str | None
) -> None:
    """Make an item (or a whole destination) due now, with its attempts reset to 0."""
    if (item_id is None) == (destination is None):
        raise click.UsageError("give exactly one of ITEM_ID or --destination")
    ids = run_write(
        dsn,
        lambda conn: queue.retry_now(
            conn, who=who, item_id=item_id, destination=destination, why=why
        ),
    )
    if not ids and item_id is not None:
        raise click.ClickException(run_read(dsn, lambda conn: _why_not(conn, item_id, "retry")))
    if not ids:
        raise click.ClickException(f"nothing pending for {destination}")
    click.echo(f"retrying now: {len(ids)} item(s)")


@queue_group.command("skip")
@dsn_option()
@click.argument("item_id", type=int)
@who_option
@why_option
def skip_command(dsn: str | None, item_id: int, who: str, why: str | None) -> None:
    """Abandon one pending item on purpose (state skipped; audited)."""
    if not run_write(dsn, lambda conn: queue.skip(conn, item_id, who=who, why=why)):
        raise click.ClickException(run_read(dsn, lambda conn: _why_not(conn, item_id, "skip")))
    click.echo(f"skipped {item_id}")


@queue_group.command("drain")
@dsn_option()
@click.argument("destination")
@who_option
@why_option
def drain_command(dsn: str | None, destination: str, who: str, why: str | None) -> None:
    """Skip every pending item of DESTINATION (namespace/name); audited."""
    ids = run_write(dsn, lambda conn: queue.drain(conn, destination, who=who, why=why))
    if not ids and not run_read(dsn, lambda conn: _known_destination(conn, destination)):
        raise click.ClickException(
            f"no destination {destination} (names are namespace/name; see `inturn queue depth`)"
        )
    click.echo(f"drained {len(ids)} item(s) from {destination}")


def _hold_command(verb: str) -> click.Command:
    action = registry.suspend if verb == "suspend" else registry.resume

    @click.command(verb)
    @dsn_option()
    @click.argument("destination")
    @who_option
    @why_option
    def command(dsn: str | None, destination: str, who: str, why: str | None) -> None:
        if not run_write(dsn, lambda conn: action(conn, destination, who=who, why=why)):
            raise click.ClickException(f"no registered destination {destination}")
        click.echo(f"{'suspended' if verb == 'suspend' else 'resumed'} {destination}")

    command.help = (
        "Hold DESTINATION's delivery (namespace/name): its worker sends nothing after the attempt"
        " in flight, messages keep queueing; audited."
        if verb == "suspend"
        else "Lift the hold on DESTINATION and wake its worker; audited."
    )
    return command


queue_group.add_command(_hold_command("suspend"))
queue_group.add_command(_hold_command("resume"))


@queue_group.command("remove")
@dsn_option()
@click.argument("item_ids", type=int, nargs=-1, required=True)
@click.option("--who", default="cli", show_default=True, help="Recorded in the audit.")
@why_option
def remove_command(dsn: str | None, item_ids: tuple[int, ...], who: str, why: str | None) -> None:
    """Delete finished items (delivered, failed, skipped); pending ones are refused."""
    ids = run_write(dsn, lambda conn: queue.remove(conn, list(item_ids), who=who, why=why))
    kept = sorted(set(item_ids) - set(ids))
    click.echo(f"removed {len(ids)} item(s)")
    if kept:
        raise click.ClickException(f"not removed (pending or missing): {', '.join(map(str, kept))}")


@queue_group.command("resend")
@dsn_option()
@click.argument("item_id", type=int)
@who_option
@why_option
def resend_command(dsn: str | None, item_id: int, who: str, why: str | None) -> None:
    """Queue a copy of a finished item at the tail of its destination's queue; audited."""
    try:
        new = run_write(dsn, lambda conn: queue.resend(conn, item_id, who=who, why=why))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if new is None:
        raise click.ClickException(f"no item {item_id}")
    click.echo(f"queued copy of {item_id} as {new}")


@queue_group.command("erase")
@dsn_option()
@click.argument("item_ids", type=int, nargs=-1)
@click.option(
    "--patient-id",
    help="Erase every held message naming this ID in PID-2, PID-3, PID-4 or MRG-1.",
)
@authority_option
@click.option(
    "--scan",
    is_flag=True,
    help="Find the patient by reading every payload instead of the index (slow: says how long).",
)
@click.option("--who", help="Who decides (recorded in the audit); not needed with --dry-run.")
@why_option
@click.option("--dry-run", is_flag=True, help="Show what would be erased; erase nothing.")
@json_option
def erase_command(
    dsn: str | None,
    item_ids: tuple[int, ...],
    patient_id: str | None,
    authority: str | None,
    scan: bool,
    who: str | None,
    why: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Erase items in any state (data-subject erasure), by id or by patient identifier."""
    if who is None and not dry_run:
        raise click.UsageError("missing option '--who' (it is recorded in the audit)")
    if bool(item_ids) == bool(patient_id and patient_id.strip()):
        raise click.UsageError("give exactly one of ITEM_IDS or a non-empty --patient-id")
    if (authority is not None or scan) and not patient_id:
        raise click.UsageError("--authority and --scan go with --patient-id")
    _patient_key(patient_id, authority)  # a blank --authority is a usage error

    async def go(pools: Pools) -> tuple[list[dict[str, Any]], list[int]]:
        matched: list[dict[str, Any]] = []
        async with pools.read.connection() as conn:
            if patient_id and scan:
                matched = await _scan_for_patient(conn, patient_id, authority)
            elif patient_id:
                found = await identifiers.find_patient(conn, patient_id, authority)
                matched = [_erase_row(i.id, i.destination, i.state, i.message_type) for i in found]
            else:
                for item_id in item_ids:
                    item = await queue.get_item(conn, item_id)
                    if item is not None:
                        matched.append(
                            _erase_row(item.id, item.destination, item.state, item.message_type)
                        )
        if dry_run or not matched:
            return matched, []
        async with pools.write.connection() as conn:
            erased = await queue.erase(conn, [m["id"] for m in matched], who=who or "", why=why)
        return matched, erased

    matched, erased = run_db(dsn, go)
    if as_json:
        _echo_json({"matched": matched, "erased": erased, "dryRun": dry_run})
        return
    for m in matched:
        click.echo(f"{m['id']}  {m['destination']}  {m['state']}  {m['messageType']}")
    verb = "would erase" if dry_run else "erased"
    if matched or not item_ids:
        click.echo(f"{verb} {len(matched) if dry_run else len(erased)} item(s)")
    missing = sorted(set(item_ids) - {m["id"] for m in matched})
    if missing:
        raise click.ClickException(f"no item {', '.join(map(str, missing))}")


def _erase_row(item_id: int, destination: str, state: str, message_type: str) -> dict[str, Any]:
    return {"id": item_id, "destination": destination, "state": state, "messageType": message_type}


async def _scan_for_patient(
    conn: AsyncConnection[Any], patient_id: str, authority: str | None
) -> list[dict[str, Any]]:
    """Read every held payload (the fallback of ``erase --scan``), saying first how much."""
    from inturn.worker.hl7.pid import has_patient_id

    rows, size = await identifiers.scan_estimate(conn)
    click.echo(
        f"scanning every payload: about {rows} item(s), {size / 1e6:.0f} MB; the index answers"
        " the same question without --scan",
        err=True,
    )
    matched: list[dict[str, Any]] = []
    started = time.monotonic()
    seen = 0
    told = False
    async for held in queue.scan_payloads(conn):
        seen += 1
        if not told and seen == SCAN_RATE_SAMPLE:
            told = True
            elapsed = time.monotonic() - started
            left = max(rows - seen, 0) * elapsed / seen
            click.echo(f"at the rate of the first {seen} items: about {left:.0f}s more", err=True)
        if has_patient_id(held.payload, patient_id, authority):
            matched.append(_erase_row(held.id, held.destination, held.state, held.message_type))
    return matched


def _patient_key(patient_id: str | None, authority: str | None) -> str | None:
    """The identifier index key of ``--patient-id`` (and ``--authority``), or None."""
    if patient_id is None:
        if authority is not None:
            raise click.UsageError("--authority goes with --patient-id")
        return None
    if not patient_id.strip():
        raise click.UsageError("--patient-id is empty")
    if authority is not None and not authority.strip():
        raise click.UsageError("--authority is empty")
    from inturn.worker.hl7.pid import lookup_key

    return lookup_key(patient_id, authority)


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
    entries = run_read(dsn, lambda conn: queue.audit_log(conn, limit))
    if as_json:
        _echo_json(entries)
        return
    click.echo(
        _table(
            ["AT", "WHO", "ACTION", "DESTINATION", "ITEMS", "WHY"],
            [
                [
                    e["at"][:19],
                    e["who"],
                    e["action"],
                    e["destination"] or "-",
                    _ids(e["itemIds"]),
                    e["why"] or "",
                ]
                for e in entries
            ],
        )
    )


def _ids(ids: list[int]) -> str:
    text = ",".join(map(str, ids[:5]))
    return text + (f",... ({len(ids)})" if len(ids) > 5 else "")


@click.command("purge")
@dsn_option()
@click.option(
    "--older-than",
    type=DURATION,
    default="7d",
    show_default=True,
    help="Age of finished items to delete, for every finished state.",
)
@click.option("--delivered", type=DURATION, help="Override the age for delivered items.")
@click.option("--failed", type=DURATION, help="Override the age for failed items.")
@click.option("--skipped", type=DURATION, help="Override the age for skipped items.")
@click.option(
    "--worklist-cleared",
    type=DURATION,
    default="90d",
    show_default=True,
    help="Age (since cleared) of cleared worklist items to delete; pending ones are kept.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 5000),
    default=5000,
    show_default=True,
    help="Rows deleted per transaction.",
)
def purge_command(
    dsn: str | None,
    older_than: int,
    delivered: int | None,
    failed: int | None,
    skipped: int | None,
    worklist_cleared: int,
    batch: int,
) -> None:
    """Delete finished items and cleared worklist items older than their retention, in
    batches. Pending items and pending worklist items are never touched. Exits 0 without doing
    anything when another purge is running."""
    now = datetime.now(UTC)
    ages = {"delivered": delivered, "failed": failed, "skipped": skipped}
    cutoffs = {
        state: now - timedelta(seconds=older_than if age is None else age)
        for state, age in ages.items()
    }

    async def both(conn: AsyncConnection[Any]) -> dict[str, int] | None:
        counts = await queue.purge(conn, cutoffs, batch=batch)
        if counts is not None:
            counts["worklist cleared"] = await worklist_purge(conn, worklist_cleared, batch=batch)
        return counts

    counts = run_write(dsn, both)
    if counts is None:
        click.echo("another purge is running; nothing done")
        return
    click.echo("purged " + ", ".join(f"{state} {n}" for state, n in counts.items()))
