"""``inturn sweep``: run the sweeper's rule packs once; one line per rule.

The command's own options (``--limit``, ``--dry-run``, ``--only``, ``--json``, ``--dsn``) are
the same for everyone. A rule pack's options (:class:`~inturn.worker.worklist.rules.PackOption`)
join them only when that pack runs (by default, or named by ``--only``), in parsing and in
``--help``: ``inturn sweep --only reservations --help`` shows the reservation settings, a plain
``inturn sweep --help`` does not. Exits 0 on success (also when another sweep is running, which
it says), 1 when a rule failed, 2 on bad arguments or no database.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import click
from psycopg import AsyncConnection

from inturn.worker.cli.db import run_write, through_refusals
from inturn.worker.cli.options import DURATION, dsn_option, json_option
from inturn.worker.operations import packs
from inturn.worker.store.dsn import resolve_dsn
from inturn.worker.store.lease import holder_id
from inturn.worker.worklist.publishers import close_all, from_env
from inturn.worker.worklist.rules import PackOption, RulePack
from inturn.worker.worklist.sweep import DEFAULT_LIMIT, SweepReport

#: Where :class:`SweepCommand` keeps the chosen packs' click options for one invocation.
_PACK_OPTIONS = "inturn.sweep.pack_options"


def _param_name(pack: RulePack[Any], option: PackOption) -> str:
    return f"{pack.name}_{option.field}".replace("-", "_")


def click_option(pack: RulePack[Any], option: PackOption) -> click.Option:
    """The click option of one pack option: its flag, environment variable, default and help;
    a value its ``check`` refuses is a one-line usage error."""

    def checked(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if option.check is None:
            return value
        try:
            return option.check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    common: dict[str, Any] = {
        "help": option.help,
        "envvar": option.envvar,
        "show_envvar": option.envvar is not None,
        "default": option.default,
        "show_default": True,
        "callback": checked,
    }
    name = _param_name(pack, option)
    if option.kind == "switch":
        off = "--no-" + option.flag.removeprefix("--")
        return click.Option([f"{option.flag}/{off}", name], is_flag=True, **common)
    if option.kind == "many":
        return click.Option([option.flag, name], multiple=True, **common)
    return click.Option([option.flag, name], type=DURATION, **common)


def only_values(args: Sequence[str]) -> list[str]:
    """The values of ``--only`` in raw command-line arguments (up to ``--``)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--only" and i + 1 < len(args):
            out.append(args[i + 1])
        elif arg.startswith("--only="):
            out.append(arg.partition("=")[2])
    return out


class SweepCommand(click.Command):
    """A click command whose options are its own plus those of the packs the run runs."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Find the packs (named by ``--only``, else the default ones) before parsing."""
        try:
            chosen = packs.chosen(only_values(args))
        except packs.UnknownPack:
            chosen = ()  # --only's own check reports it
        ctx.meta[_PACK_OPTIONS] = [click_option(p, o) for p in chosen for o in p.options]
        return super().parse_args(ctx, args)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        """The command's options, then the chosen packs' options, then ``--help``."""
        params = super().get_params(ctx)
        extra: list[click.Parameter] = ctx.meta.get(_PACK_OPTIONS, [])
        help_option = self.get_help_option(ctx)
        own = [p for p in params if p is not help_option]
        return [*own, *extra, *([help_option] if help_option in params else [])]


def _check_only(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    try:
        packs.chosen(value)
    except packs.UnknownPack as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value


def _only_help() -> str:
    default = ", ".join(p.name for p in packs.PACKS if p.default)
    others = ", ".join(p.name for p in packs.PACKS if not p.default)
    text = f"Only the rules of this pack; repeatable. Without it: {default}."
    if others:
        text += f" Others: {others} (`inturn sweep --only PACK --help` shows a pack's options)."
    return text


@click.command("sweep", cls=SweepCommand)
@dsn_option()
@click.option(
    "--limit",
    type=click.IntRange(1, None),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Records per rule and run, most overdue first; the rest wait for the next run.",
)
@click.option(
    "--dry-run", is_flag=True, help="Change nothing; say what would be placed and cleared."
)
@click.option("--only", multiple=True, metavar="PACK", callback=_check_only, help=_only_help())
@json_option
def sweep_command(
    dsn: str | None,
    limit: int,
    dry_run: bool,
    only: tuple[str, ...],
    as_json: bool,
    **pack_values: Any,
) -> None:
    """Place work for what happened because time passed; clear what no longer holds.

    Prints one line per rule. Exits 0 on success (also when another sweep is running), 1 when
    a rule failed.
    """
    chosen = packs.chosen(only)
    settings = {
        p.name: {o.field: pack_values[_param_name(p, o)] for o in p.options} for p in chosen
    }
    packs.select(only, settings)  # a setting the pack does not have fails here, before connecting
    target = resolve_dsn(dsn)
    try:
        from_env(os.environ, target)  # a bad variable is said here, before connecting
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    holder = holder_id("sweep")  # one per process: a run tried again takes its singleton again

    async def go(conn: AsyncConnection[Any]) -> SweepReport:
        publishers = [] if dry_run else from_env(os.environ, target)  # on this run's loop
        try:
            return await packs.sweep(
                conn,
                only,
                settings,
                limit=limit,
                dry_run=dry_run,
                publishers=publishers,
                holder=holder,
            )
        finally:
            await close_all(publishers)

    # a database that refuses for a while (a maintenance window) is waited out, not a failure
    report = through_refusals("sweep", lambda: run_write(target, go))
    if not report.locked:
        click.echo("another sweep is running; nothing done")
        return
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dryRun": dry_run,
                    "rules": [
                        {
                            "rule": r.rule.name,
                            "group": r.rule.group,
                            "placed": r.outcome.placed,
                            "alreadyThere": r.outcome.already,
                            "cleared": r.outcome.cleared,
                            "error": r.error,
                        }
                        for r in report.results
                    ],
                },
                indent=2,
            )
        )
    else:
        for r in report.results:
            click.echo(r.summary(dry_run))
    if not report.ok:
        sys.exit(1)
