"""The maintenance jobs' processes (the purge and the sweeper CronJobs: ``inturn purge``,
``inturn sweep``) wait out a database that refuses for a while (issue 40, part 3): their
singleton's lease and every statement of their run meet, on a Postgres server of the test's
own, a read-only database (``default_transaction_read_only``, server-wide, as a maintenance
window sets it), the singletons' table locked by a second session past ``lock_timeout``, and
their session ended while it waits (``pg_terminate_backend``). Each run is tried again after a
bounded backoff (:func:`inturn.worker.cli.db.through_refusals`) with one line when the refusal
begins and one when it ends, takes its own singleton again (one holder per process), finishes
with exit 0 and its usual report once the database works, and releases the singleton."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from inturn.worker.cli import main
from inturn.worker.store.migrate import migrate
from tests.support import pgcluster

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.store,
    pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing())),
    pytest.mark.slow,
]

#: How long each fault lasts while the job runs, seconds.
FAULT_SECONDS = 2.0


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[pgcluster.Cluster, str]]:
    cluster = pgcluster.Cluster()
    try:
        dsn = cluster.primary.dsn()
        migrate(dsn)
        yield cluster, dsn
    finally:
        cluster.close()


def _setting(cluster: pgcluster.Cluster, name: str, value: str | None) -> None:
    cluster.set_system(name, value)


def _waiting_sessions(dsn: str) -> int:
    """Sessions of the job waiting for a lock (it has reached its singleton's table)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def _run_job(argv: list[str], outcome: dict[str, object]) -> None:
    try:
        main(argv)
        outcome["code"] = 0
    except SystemExit as exc:
        outcome["code"] = exc.code


@pytest.mark.parametrize("fault", ["read-only", "lock-timeout", "connection-lost"])
@pytest.mark.parametrize("job", ["purge", "sweep"])
def test_a_maintenance_job_waits_out_a_refusal(
    server: tuple[pgcluster.Cluster, str],
    capsys: pytest.CaptureFixture[str],
    job: str,
    fault: str,
) -> None:
    cluster, dsn = server
    argv = (
        ["purge", "--dsn", dsn, "--older-than", "7d"] if job == "purge" else ["sweep", "--dsn", dsn]
    )
    outcome: dict[str, object] = {}
    runner = threading.Thread(target=_run_job, args=(argv, outcome), daemon=True)
    blocker: psycopg.Connection[object] | None = None
    if fault == "read-only":
        _setting(cluster, "default_transaction_read_only", "on")
    else:
        if fault == "lock-timeout":
            _setting(cluster, "lock_timeout", "300ms")
        blocker = psycopg.connect(dsn)
        blocker.execute("SET lock_timeout = '20s'")  # the fault's lock is not held to 300 ms
        blocker.execute("LOCK TABLE inturn_lease IN ACCESS EXCLUSIVE MODE")
    try:
        began = time.monotonic()
        runner.start()
        if fault == "connection-lost":  # its session ended while it waits for the lock
            deadline = time.monotonic() + 20
            while _waiting_sessions(dsn) == 0:
                assert time.monotonic() < deadline, "the job never reached its singleton"
                time.sleep(0.1)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                )
        else:
            time.sleep(FAULT_SECONDS)
            assert runner.is_alive()  # refused, and waiting: not ended
    finally:
        if fault == "read-only":
            _setting(cluster, "default_transaction_read_only", None)
        if blocker is not None:
            blocker.close()
        if fault == "lock-timeout":
            _setting(cluster, "lock_timeout", None)
    runner.join(timeout=60)
    assert not runner.is_alive()
    took = time.monotonic() - began
    assert outcome["code"] == 0
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if line.startswith(f"{job}:")]
    assert len(said) == 2, captured.err
    assert "the database refuses:" in said[0] and "trying again for up to 120 s" in said[0]
    cause = {
        "read-only": "read-only",
        "lock-timeout": "lock timeout",
        "connection-lost": "",
    }[fault]
    assert cause in said[0]
    assert said[1].startswith(f"{job}: works again after") and "refused tries" in said[1]
    assert took < 40  # the backoff is bounded: tried again within seconds of the end
    if job == "purge":
        assert captured.out.startswith("purged ")
    else:
        assert "another sweep is running" not in captured.out
    with psycopg.connect(dsn) as conn:
        held = conn.execute(
            "SELECT count(*) FROM inturn_lease WHERE destination = %s"
            " AND expires_at > clock_timestamp()",
            (f"inturn:{job}",),
        ).fetchone()
    assert held == (0,)  # the singleton is released: the next run is not kept waiting
