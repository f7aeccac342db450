"""Item id arguments: a number the database cannot hold is the command's usage error, named,
before any connection (a new user's trial got "database error: bigint out of range")."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from inturn.worker.cli import cli
from inturn.worker.cli.formats import parse_id_ranges

TOO_BIG = str(2**63)
#: Never reached: the argument is refused first.
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"


@pytest.mark.parametrize(
    "args",
    [
        ["queue", "show", TOO_BIG],
        ["queue", "skip", TOO_BIG, "--who", "jo", "--why", "x"],
        ["queue", "show", "0"],
    ],
)
def test_an_item_id_out_of_range_is_a_usage_error(args: list[str]) -> None:
    done = CliRunner().invoke(cli, [*args, "--dsn", NOWHERE])
    assert done.exit_code == 2
    assert "is not in the range 1<=x<=9223372036854775807" in done.output


def test_ranges_are_bounded_like_ids() -> None:
    assert parse_id_ranges(("7", "9223372036854775806-9223372036854775807")) == (
        [7],
        [(2**63 - 2, 2**63 - 1)],
    )
    for bad in (f"1-{TOO_BIG}", "0-3"):
        with pytest.raises(click.BadParameter, match="item ids run from 1 to 9223372036854775807"):
            parse_id_ranges((bad,))
