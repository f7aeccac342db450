"""How pytest-xdist hands the test files to its workers (``--dist loadfile``, ``make test``).

xdist's ``loadfile`` sends a whole file to one worker, the files with the most tests first. Two
things about this suite make that slow at its end: a few files are long runs of independent
tests (``test_bench.py``: 21 whole benchmark runs, 370 test-seconds on one worker while the other
had finished), and the number of tests in a file says little about its time (147 quick role
checks go before one 60-second image build). So, on top of ``loadfile``:

- the tests of a file in :data:`SPREAD` are each a unit of their own (their fixtures are per
  test or per worker session: nothing is shared within the file), so both workers share them;
- the units in :data:`FIRST` go out first, in that order (the longest, by the test-seconds
  measured in docs/explanation/architecture.md, Tests), then the other tests of the SPREAD files,
  then the rest as xdist orders them: a worker never starts a minute-long unit when the other
  is about to run dry.

Only the order and the grouping change: every worker still collects every test, and each test
runs once, on one worker. Without xdist (``PARALLEL=``) this plugin does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

#: Files whose tests are independent units of work (spread over the workers one by one).
SPREAD = ("tests/acceptance/test_bench.py",)

#: Units that go out first, in this order (test files, or a test's id in a SPREAD file): those
#: of 20 test-seconds and more in ``make test``'s parallel part (5 December 2026, two workers,
#: load 1 to 2.5), longest first. A unit not named here goes after them, in xdist's order (the
#: most tests first); a name here that no longer matches anything is passed over.
FIRST = (
    "tests/acceptance/test_image.py",  # 128 s (64 to 334: the first build makes its base)
    "tests/acceptance/test_local.py",  # 78
    "tests/integration/test_fencing.py",  # 67
    "tests/integration/test_restore.py",  # 63
    "tests/integration/test_periodic_statements.py",  # 56
    "tests/integration/test_failover.py",  # 52
    "tests/acceptance/test_bench.py::test_benchmark_runs_tiny[partition]",  # 45
    "tests/acceptance/test_bench.py::test_benchmark_runs_tiny[scale]",  # 42
    "tests/unit/test_documents_bounded.py",  # 42
    "tests/integration/test_pgbouncer_processes.py",  # 41
    "tests/integration/test_restart_no_duplicates.py",  # 39
    "tests/integration/test_pgbouncer_frozen.py",  # 37
    "tests/integration/test_recovery.py",  # 37
    "tests/acceptance/test_cli.py",  # 34
    "tests/monitoring/test_dashboard_live.py",  # 32
    "tests/acceptance/test_bench.py::test_benchmark_runs_tiny[delivery]",  # 31
    "tests/acceptance/test_bench.py::test_benchmark_runs_tiny[failover]",  # 27
    "tests/integration/test_index_rotation.py",  # 26
    "tests/console/test_browser.py",  # 26
    "tests/integration/test_operator.py",  # 25
    "tests/integration/test_lanes.py",  # 25
    "tests/acceptance/test_bench.py::test_benchmark_runs_tiny[ingest]",  # 22
)


def first_unit(units: Iterable[str]) -> str | None:
    """The unit to hand out next, ahead of xdist's order: the earliest in :data:`FIRST`, else a
    test of a :data:`SPREAD` file (a whole run of its own, 5 to 20 s); None: xdist's order."""

    def rank(unit: str) -> int | None:
        for i, name in enumerate(FIRST):
            if unit.startswith(name):
                return i
        return len(FIRST) if "::" in unit and unit.split("::", 1)[0] in SPREAD else None

    ranked = [(r, unit) for unit in units if (r := rank(unit)) is not None]
    return min(ranked)[1] if ranked else None


class FirstTheLongest(LoadFileScheduling):
    """``loadfile``, with :data:`SPREAD` files split by test and :data:`FIRST` units first."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return nodeid if path in SPREAD else path

    def _assign_work_unit(self, node: Any) -> None:
        unit = first_unit(self.workqueue)
        if unit is not None:
            self.workqueue.move_to_end(unit, last=False)
        super()._assign_work_unit(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FirstTheLongest | None:
    """Our scheduler for ``--dist loadfile``; xdist's own for any other ``--dist``."""
    if config.getvalue("dist") != "loadfile":
        return None
    return FirstTheLongest(config, log)
