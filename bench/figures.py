"""The last line of every benchmark: its figures as one JSON object a script can compare.

Each ``bench/*.py`` ends by calling :func:`emit`, so ``make bench | grep '^{"bench"'`` (or
the last line of one benchmark) gives every figure with its target, and the test suite's tiny
runs (``tests/acceptance/test_bench.py``) check that each benchmark still gets that far.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any


def emit(bench: str, figures: Mapping[str, Any]) -> None:
    """Print ``{"bench": bench, **figures}`` as one line of JSON (keys in the given order).

    ``figures`` values must be JSON-serialisable (numbers, strings, None, lists, dicts);
    a figure that was not measured in this run (a part left out) is None.
    """
    print(json.dumps({"bench": bench, **figures}), flush=True)


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, tiny: Mapping[str, Any]
) -> argparse.Namespace:
    """Parse ``argv`` with ``--tiny`` added: a run of seconds, sizes from ``tiny``.

    ``--tiny`` replaces the defaults named in ``tiny`` (options given explicitly still win),
    so that the test suite runs every benchmark end to end at a toy size and a change that
    breaks one fails ``make test``. Its figures mean nothing; only that it completes does.
    """
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a run of seconds at a toy size (the test suite's; its figures mean nothing)",
    )
    known, _ = parser.parse_known_args(argv)
    if known.tiny:
        parser.set_defaults(**tiny)
    return parser.parse_args(argv)
