"""The order in which xdist's workers get the test files (tests/support/schedule.py)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from tests.support import schedule

ROOT = Path(__file__).resolve().parents[2]


def test_every_named_unit_is_a_test_file_here() -> None:
    """A renamed or removed file would silently lose its place: the names must stay true."""
    for name in (*schedule.SPREAD, *schedule.FIRST):
        assert (ROOT / name.split("::", 1)[0]).is_file(), name


def test_the_named_units_go_first_then_the_spread_ones_then_xdists_order() -> None:
    bench = "tests/acceptance/test_bench.py::test_benchmark_runs_tiny"
    queue: OrderedDict[str, dict[str, bool]] = OrderedDict(
        (unit, {})
        for unit in [
            "tests/unit/test_roles.py",
            f"{bench}[lanes]",
            "tests/acceptance/test_local.py",
            "tests/unit/test_a.py",
            f"{bench}[scale]",
            "tests/acceptance/test_image.py",
        ]
    )
    order = []
    while queue:  # as the scheduler hands them out: the first unit, then xdist's next
        unit = schedule.first_unit(queue)
        if unit is not None:
            queue.move_to_end(unit, last=False)
        order.append(queue.popitem(last=False)[0])
    assert order == [
        "tests/acceptance/test_image.py",
        "tests/acceptance/test_local.py",
        f"{bench}[scale]",
        f"{bench}[lanes]",
        "tests/unit/test_roles.py",
        "tests/unit/test_a.py",
    ]
