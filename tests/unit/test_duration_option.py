"""The duration options: ``inturn purge`` takes an age only with its unit (a bare ``7`` once
meant seven seconds and deleted a week's worth too early); other commands still read bare
seconds."""

from __future__ import annotations

import click
import pytest

from inturn.worker.cli.options import DURATION, DURATION_WITH_UNIT


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("12h", 43200), ("30m", 1800), ("90s", 90), ("2w", 1209600), ("0s", 0)],
)
def test_an_age_with_its_unit_is_seconds(text: str, seconds: int) -> None:
    assert DURATION_WITH_UNIT.convert(text, None, None) == seconds
    assert DURATION.convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["7", " 7 ", "0", "604800"])
def test_a_bare_number_is_refused_with_the_unit_to_add(text: str) -> None:
    with pytest.raises(click.BadParameter) as caught:
        DURATION_WITH_UNIT.convert(text, None, None)
    n = text.strip()
    assert caught.value.message == f"'{n}' has no unit: add one, e.g. {n}d, {n}h, {n}m or {n}s"
    assert DURATION.convert(text, None, None) == int(n)


@pytest.mark.parametrize("text", ["soon", "7 days", "-7d", "7y", ""])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(click.BadParameter) as caught:
        DURATION_WITH_UNIT.convert(text, None, None)
    assert (
        caught.value.message == f"{text.strip()!r} is not a duration like 90s, 30m, 12h, 7d or 2w"
    )
