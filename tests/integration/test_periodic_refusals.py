"""A database that refuses for a while never ends a process (issue 40, part 3): the periodic
statements of long-running processes meet a read-only database (a maintenance window set with
``default_transaction_read_only``), a lock held past ``lock_timeout`` by a second session, and a
lost connection; each is logged once when it begins and once when it ends, and the process
goes on. On a Postgres server of the test's own (the read-only setting is server-wide)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import psycopg
import pytest

from inturn.worker.local import run as local_run
from inturn.worker.store import faults, locks
from inturn.worker.store.connect import connect_worker
from inturn.worker.store.lease import holder_id
from inturn.worker.store.migrate import migrate
from inturn.worker.text.conditions import Condition
from tests.support import pgcluster

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.store,
    pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing())),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[pgcluster.Cluster, str]]:
    cluster = pgcluster.Cluster()
    try:
        dsn = cluster.primary.dsn()
        migrate(dsn)
        yield cluster, dsn
    finally:
        cluster.close()


def _read_only(cluster: pgcluster.Cluster, on: bool) -> None:
    cluster.set_system("default_transaction_read_only", "on" if on else "off")


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "inturn.local"
        and r.levelno == level
        and "inturn local lease" in r.getMessage()
    ]


async def _renew_times(dsn: str, owner: psycopg.AsyncConnection, held: locks.Singleton, n: int):  # type: ignore[type-arg]
    stop = asyncio.Event()
    for _ in range(n):
        owner, renewed = await local_run._keep_local(
            dsn,
            owner,
            held.holder,
            held,
            stop,
            Condition(logging.getLogger("inturn.local"), local_run.LEASE_WHAT),
        )
        assert renewed is not None
        held = renewed
        assert not stop.is_set()
    return owner, held


@pytest.mark.parametrize("fault", ["read-only", "lock-timeout", "connection-lost"])
async def test_the_local_lease_rides_out_a_refusal(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    cluster, dsn = server
    lease = Condition(
        logging.getLogger("inturn.local"), local_run.LEASE_WHAT
    )  # as a run of inturn local makes its own
    caplog.clear()
    owner = await connect_worker(dsn, application_name="inturn-local")
    holder = holder_id("local")
    held = await locks.take_singleton(owner, "local", holder, local_run.LOCAL_LEASE_SECONDS)
    assert held is not None
    blocker: psycopg.Connection | None = None  # type: ignore[type-arg]
    try:
        with caplog.at_level(logging.DEBUG, logger="inturn.local"):
            if fault == "read-only":
                _read_only(cluster, True)
            elif fault == "lock-timeout":
                blocker = psycopg.connect(dsn)
                blocker.execute("SET lock_timeout = 0")
                blocker.execute(
                    "SELECT * FROM inturn_lease WHERE destination = 'inturn:local' FOR UPDATE"
                )
                await owner.execute("SET lock_timeout = '200ms'")
            else:
                pid = owner.info.backend_pid
                with psycopg.connect(dsn, autocommit=True) as killer:
                    killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # renewals refused (three; a lost connection is made again at the next turn): the run
            # goes on, the lease is kept, one line is logged
            stop = asyncio.Event()
            refusals = 1 if fault == "connection-lost" else 3
            for _ in range(refusals):
                owner, kept = await local_run._keep_local(dsn, owner, holder, held, stop, lease)
                assert kept == held and not stop.is_set()
            assert lease.active
            assert len(_lines(caplog, logging.WARNING)) == 1
            # the refusal ends: the next renewal works and says how long it lasted
            if fault == "read-only":
                _read_only(cluster, False)
            elif blocker is not None:
                blocker.rollback()
            owner, renewed = await local_run._keep_local(dsn, owner, holder, held, stop, lease)
            assert renewed is not None and renewed.epoch >= held.epoch and not stop.is_set()
            assert not lease.active
        ended = _lines(caplog, logging.INFO)
        assert len(ended) == 1 and "works again after" in ended[0]
        assert f"{refusals} failed tries" in ended[0]
        assert len(_lines(caplog, logging.WARNING)) == 1
    finally:
        _read_only(cluster, False)
        if blocker is not None:
            blocker.close()
        await owner.close()


@pytest.mark.parametrize(
    ("sqlstate", "refused"),
    [
        ("25006", True),  # read-only transaction
        ("55P03", True),  # lock not available
        ("57014", True),  # statement timeout
        ("53300", True),  # too many connections
        ("57P03", True),  # cannot connect now
        ("40001", True),  # serialization failure
        ("42P01", False),  # no inturn schema: a person must migrate
        ("42501", False),  # a missing grant
        ("22001", False),  # a value too long: a bug, not a wait
    ],
)
def test_which_errors_a_periodic_statement_waits_out(sqlstate: str, refused: bool) -> None:
    exc = psycopg.errors.lookup(sqlstate)("refused")
    assert (faults.refusal(exc) is not None) is refused
    assert faults.refusal(ValueError("a bug")) is None


async def test_a_postgres_restart_under_many_destinations_is_two_lines(
    server: tuple[pgcluster.Cluster, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty destinations' workers in one process (as ``inturn local`` runs them), the server
    stopped for a few seconds and started again (issue 39, part 2: a 22 s restart logged 2,522
    lines from 200 destinations): one WARNING when the first worker loses it, one INFO when the
    last has it back, whatever the number of workers and tries; then every one delivers."""
    from inturn.worker.drain import runner
    from inturn.worker.testing import MllpReceiver
    from tests.support.pipeline import until, worker, worker_config

    cluster, dsn = server
    names = [f"ward/d{i:02d}" for i in range(20)]
    caplog.set_level(logging.DEBUG, logger="inturn.drain")
    async with MllpReceiver() as rx, contextlib.AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                worker(worker_config(n, rx.port, channel="adt", idle_seconds=1), dsn)
            )
            for n in names
        ]
        await until(lambda: all(w.state.lock_held for w in workers), timeout=30)
        caplog.clear()
        cluster.primary.stop("fast")
        await until(lambda: all(not w.state.db_ok for w in workers), timeout=30)
        await asyncio.sleep(3)  # several tries each (0.5 s to 2 s apart)
        cluster.primary.start()
        await until(lambda: all(w.state.lock_held for w in workers), timeout=60)
        await until(lambda: not runner.AWAY[dsn].waiting, timeout=30)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "inturn.drain"
        and r.levelno >= logging.WARNING
        and "database" in r.getMessage()
    ]
    back = [r.getMessage() for r in caplog.records if "database back after" in r.getMessage()]
    tries = [
        r for r in caplog.records if r.levelno == logging.DEBUG and "database" in r.getMessage()
    ]
    assert len(warnings) == 1, warnings
    assert "the workers of this process wait for it" in warnings[0]
    assert len(back) == 1
    assert len(tries) >= len(names)  # the tries happened, at DEBUG
