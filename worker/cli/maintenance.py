"""``inturn migrate`` and ``inturn purge``: the upkeep of the database (its schema and roles,
and deleting finished items past their retention).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click

from inturn.worker.cli.db import act, through_refusals
from inturn.worker.cli.options import (
    DURATION_WITH_UNIT,
    dsn_option,
)
from inturn.worker.errors import Invalid
from inturn.worker.operations import queue as actions
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import history, roles, roles_apply
from inturn.worker.store import ingest as ingest_store
from inturn.worker.store.dsn import resolve_dsn
from inturn.worker.store.lease import holder_id
from inturn.worker.store.migrate import migrate


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
            report = roles_apply.apply_roles(target, role_prefix)
        except roles_apply.RolesError as exc:
            raise click.ClickException(str(exc)) from None
        for role in report.created:
            click.echo(f"created role {role}")
        for warning in report.warnings:
            click.echo(f"warning: {warning}", err=True)
        names = ", ".join(roles.role_name(c, role_prefix) for c in roles.COMPONENTS)
        click.echo(f"grants set for {names}")


def purge_warnings(hot_seconds: int, retention_seconds: int) -> list[str]:
    """What ``inturn purge`` says before it runs when its windows defeat a promise (it still
    runs: a person may mean it). A hot window shorter than ingest's default lost-ACK window
    (ingest looks a delivered copy up in the hot table only): a message sent again after a
    lost ACK is delivered again once its copy moved to history. A retention not longer than
    the hot window: finished items are deleted from the hot table row by row, never moved to
    history and dropped by the day."""
    said = []
    window = ingest_store.DEFAULT_DELIVERED_WINDOW_SECONDS
    if hot_seconds < window:
        said.append(
            f"--hot-window {hot_seconds}s is shorter than ingest's --duplicate-delivered-window"
            f" ({window:.0f}s by default): a message sent again after a lost ACK is delivered"
            " again once its copy has moved to history"
        )
    if retention_seconds <= hot_seconds:
        said.append(
            f"the retention ({retention_seconds}s) is not longer than --hot-window"
            f" ({hot_seconds}s): finished items are deleted from the hot table row by row,"
            " never moved to history"
        )
    return said


@click.command("purge")
@dsn_option()
@click.option(
    "--older-than",
    type=DURATION_WITH_UNIT,
    default="7d",
    show_default=True,
    help="Age of finished items to delete, for every finished state, with a unit (7d, 12h, 30m,"
    " 90s; a bare number is refused); also how long ago the lease of a deleted destination"
    " must have expired for its row to go. A finished item that a pending worklist item names"
    " (a given-up message still to resend) is kept, whatever its age.",
)
@click.option("--delivered", type=DURATION_WITH_UNIT, help="Override the age for delivered items.")
@click.option("--failed", type=DURATION_WITH_UNIT, help="Override the age for failed items.")
@click.option("--skipped", type=DURATION_WITH_UNIT, help="Override the age for skipped items.")
@click.option(
    "--worklist-cleared",
    type=DURATION_WITH_UNIT,
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
@click.option(
    "--hot-window",
    type=DURATION_WITH_UNIT,
    default="15m",
    show_default=True,
    help="How long a finished item stays in the hot table before it moves to history; keep it"
    " longer than ingest's --duplicate-delivered-window (10m by default), which reads it.",
)
@click.option(
    "--epoch",
    type=DURATION_WITH_UNIT,
    default="1d",
    show_default=True,
    help="The length of a day of history: the channel log and the history are partitioned by"
    " it, and retention drops whole ones (the longest of the ages above after it closed).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Count what would be deleted, moved and dropped; change nothing (and record nothing"
    " in the audit).",
)
def purge_command(
    dsn: str | None,
    older_than: int,
    delivered: int | None,
    failed: int | None,
    skipped: int | None,
    worklist_cleared: int,
    batch: int,
    hot_window: int,
    epoch: int,
    dry_run: bool,
) -> None:
    """The maintenance job: move finished items older than --hot-window to history, create
    the next day's partitions ahead and turn the day, drop whole days of history older than
    the retention (after moving out what a person still needs: pending messages keep their
    payload, a given-up message still on a worklist goes back to the hot table), then delete
    finished items still in the hot table and cleared worklist items older than their
    retention, in batches, and the lease rows of deleted destinations (lease expired more than
    --older-than ago). Pending items and pending worklist items are never touched. Exits 0
    without doing anything when another purge is running. A real purge records its counts in
    the audit, and each day dropped."""
    now = datetime.now(UTC)
    ages = {"delivered": delivered, "failed": failed, "skipped": skipped}
    cutoffs = {
        state: now - timedelta(seconds=older_than if age is None else age)
        for state, age in ages.items()
    }
    retention = max([older_than, *(age for age in ages.values() if age is not None)])
    try:
        partitions = history.Settings(
            retention_seconds=retention, epoch_seconds=epoch, hot_seconds=hot_window, batch=batch
        )
    except Invalid as exc:
        raise click.BadParameter(str(exc)) from None

    for warning in purge_warnings(hot_window, retention):
        click.echo(f"warning: {warning}", err=True)
    holder = holder_id("purge")  # one per process: a run tried again takes its singleton again
    # a database that refuses for a while (a maintenance window) is waited out, not a failure
    done = through_refusals(
        "purge",
        lambda: act(
            dsn,
            lambda conn: actions.purge(
                conn,
                Trusted("purge"),
                cutoffs,
                worklist_cleared_after=worklist_cleared,
                batch=batch,
                leases_expired_after=older_than,
                dry_run=dry_run,
                partitions=partitions,
                holder=holder,
            ),
        ),
    )
    if not done.ran:
        click.echo("another purge is running; nothing done")
        return
    summary = actions.purge_summary(done.counts)
    click.echo(
        f"would purge {summary} (dry run: nothing deleted)" if dry_run else f"purged {summary}"
    )
    for line in history_lines(done):
        click.echo(line)


def history_lines(done: actions.Purged) -> list[str]:
    """What the partition work did (or, in a dry run, would do), one line each."""
    if done.would is not None:
        would = done.would
        lines = [f"would move {would.movable} finished item(s) to history"]
        if would.turn:
            lines.append("would turn the epoch (a new day of history)")
        lines += [
            f"would drop epoch {e.n} (closed {e.closed_at:%Y-%m-%d %H:%M:%SZ})" for e in would.drop
        ]
        return lines
    if done.upkeep is None:
        return []
    upkeep = done.upkeep
    lines = [f"moved {upkeep.moved} finished item(s) to history"]
    if upkeep.prepared:
        made = ", ".join(str(n) for n in upkeep.prepared)
        lines.append(f"partitions made ahead for epoch {made}")
    if upkeep.turned is not None:
        lines.append(f"turned: epoch {upkeep.turned} is open")
    lines += [f"dropped {d.summary()} in {d.seconds:.3f}s" for d in upkeep.dropped]
    lines += [f"waiting: {w}" for w in upkeep.waiting]
    return lines
