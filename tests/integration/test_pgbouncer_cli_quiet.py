"""A command that runs and ends says a pooling fact only when it matters to it (issue 39, part 2):
``inturn queue`` commands behind PgBouncer print no pooling line (before: every one printed
the long note), while a long-running process still says it once (tests/integration/
test_pgbouncer_processes.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.pipeline import INTURN

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.store, pytest.mark.slow]


@pytest.mark.parametrize("args", [("queue", "depth"), ("queue", "list"), ("worklist", "list")])
def test_queue_commands_behind_a_pooler_print_no_pooling_line(
    pooled: str, args: tuple[str, ...]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_")}
    env["INTURN_DSN"] = pooled
    done = subprocess.run(
        [str(INTURN), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "pooled connection" not in done.stderr
    assert "pooled connection" not in done.stdout
