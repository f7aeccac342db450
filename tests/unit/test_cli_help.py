"""Every option of every command says what it does in ``--help``."""

from __future__ import annotations

from collections.abc import Iterator

import click

from inturn.worker.cli import cli


def options(
    cmd: click.Command, path: str, ctx: click.Context
) -> Iterator[tuple[str, click.Option]]:
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            yield path, param
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, f"{path} {name} does not load"
            yield from options(sub, f"{path} {name}", ctx)


def test_every_option_has_help() -> None:
    ctx = click.Context(cli)
    found = list(options(cli, "inturn", ctx))
    assert len(found) > 50
    assert [f"{path} {opt.opts[0]}" for path, opt in found if not opt.help] == []
