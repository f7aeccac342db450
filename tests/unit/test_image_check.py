"""image/check.py reads the image's commands from its own ``inturn --help``: the parse gives
exactly the CLI's commands (so a new command, such as ``keys`` or ``validate``, needs no list
kept by hand)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from inturn.worker.cli import cli
from tests.support.image_check import checker


def test_the_commands_are_read_from_the_help_text() -> None:
    shown = CliRunner().invoke(cli, ["--help"], terminal_width=60)
    assert shown.exit_code == 0
    names = checker().commands(shown.output)
    assert names == sorted(cli.list_commands(click.Context(cli)))
    assert {"keys", "validate", "worker", "queue"} <= set(names)
    assert set(checker().REQUIRED) <= set(names)


def test_a_help_without_commands_lists_none() -> None:
    text = "Usage: inturn worker [OPTIONS]\n\n  Drain.\n\nOptions:\n  --dsn TEXT  The database.\n"
    assert checker().commands(text) == []
    wrapped = "Commands:\n  keys      Payload encryption: the key\n            store.\n  queue  Q\n"
    assert checker().commands(wrapped) == ["keys", "queue"]
