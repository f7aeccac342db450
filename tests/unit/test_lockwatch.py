"""How a lock wait is told (pure): the blocking sessions, as a person needs to find them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inturn.worker.store.lockwatch import Blocker, LockWait

SINCE = datetime(2026, 12, 1, 3, 40, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("blocker", "text"),
    [
        (
            Blocker(4711, "psql", "alice", "10.0.0.7", "idle in transaction", SINCE, 35.2),
            "pid 4711 (application 'psql', user alice from 10.0.0.7, idle in transaction since"
            " 2026-12-01 03:40:12 UTC, 35s)",
        ),
        (
            Blocker(12, "", "bob", None, "active", SINCE, 2.5),
            "pid 12 (application '', user bob, active since 2026-12-01 03:40:12 UTC, 2.5s)",
        ),
        # what a role without pg_read_all_stats sees of another role's session
        (
            Blocker(99, "inturn-ingest", "ingest", None, None, None, None),
            "pid 99 (application 'inturn-ingest', user ingest)",
        ),
    ],
)
def test_a_blocker_is_named_with_what_the_server_shows(blocker: Blocker, text: str) -> None:
    assert blocker.describe() == text


def test_a_wait_names_every_blocker_and_its_length() -> None:
    wait = LockWait(started=0.0, waited_seconds=12.4)
    wait.blockers = [
        Blocker(1, "a", None, None, None, None, None),
        Blocker(2, "b", None, None, None, None, None),
    ]
    assert wait.describe() == (
        "waiting 12s for a lock held by pid 1 (application 'a'), pid 2 (application 'b')"
    )
    assert wait.describe("waited").startswith("waited 12s for")
