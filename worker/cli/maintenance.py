"""``inturn migrate`` and ``inturn purge``: the upkeep of the database (its schema and roles,
and deleting finished items past their retention).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click

from inturn.worker.cli.db import act
from inturn.worker.cli.options import (
    DURATION_WITH_UNIT,
    dsn_option,
)
from inturn.worker.operations import queue as actions
from inturn.worker.operations.actor import Trusted
from inturn.worker.store import roles, roles_apply
from inturn.worker.store.dsn import resolve_dsn
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
    "--dry-run",
    is_flag=True,
    help="Count what would be deleted; delete nothing (and record nothing in the audit).",
)
def purge_command(
    dsn: str | None,
    older_than: int,
    delivered: int | None,
    failed: int | None,
    skipped: int | None,
    worklist_cleared: int,
    batch: int,
    dry_run: bool,
) -> None:
    """Delete finished items and cleared worklist items older than their retention, in
    batches, and the lease rows of deleted destinations (lease expired more than --older-than
    ago). Pending items and pending worklist items are never touched. Exits 0 without doing
    anything when another purge is running. A real purge records its counts in the audit."""
    now = datetime.now(UTC)
    ages = {"delivered": delivered, "failed": failed, "skipped": skipped}
    cutoffs = {
        state: now - timedelta(seconds=older_than if age is None else age)
        for state, age in ages.items()
    }

    done = act(
        dsn,
        lambda conn: actions.purge(
            conn,
            Trusted("purge"),
            cutoffs,
            worklist_cleared_after=worklist_cleared,
            batch=batch,
            leases_expired_after=older_than,
            dry_run=dry_run,
        ),
    )
    if not done.ran:
        click.echo("another purge is running; nothing done")
        return
    summary = actions.purge_summary(done.counts)
    click.echo(
        f"would purge {summary} (dry run: nothing deleted)" if dry_run else f"purged {summary}"
    )
