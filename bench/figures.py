"""The last line of every benchmark: its figures as one JSON object a script can compare.

Each ``bench/*.py`` ends by calling :func:`emit`, so ``make bench | grep '^{"bench"'`` (or
the last line of one benchmark) gives every figure with its target, and the test suite's tiny
runs (``tests/acceptance/test_bench.py``) check that each benchmark still gets that far.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def emit(bench: str, figures: Mapping[str, Any]) -> None:
    """Print ``{"bench": bench, **figures}`` as one line of JSON (keys in the given order).

    ``figures`` values must be JSON-serialisable (numbers, strings, None, lists, dicts);
    a figure that was not measured in this run (a part left out) is None.
    """
    print(json.dumps({"bench": bench, **figures}), flush=True)
