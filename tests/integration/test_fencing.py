"""Fencing by the lease in the drain loop (issue 29): a worker whose lease was taken over sends
nothing more; a successor takes over only after expiry, with a higher epoch, and delivers what
is left in order; the lease settings come from configuration."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from psycopg import AsyncConnection

from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.mllp import MllpSender
from inturn.worker.spec.config import LeaseSettings, RetryPolicy, WorkerConfig
from inturn.worker.store import lease as leases
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.local import LocalProcess, free_port, manifest, mllp_sender, send, worker_process
from tests.support.local import message as local_message
from tests.support.pipeline import (
    QUICK_LEASE,
    SHORT_ATTEMPTS,
    control_ids,
    count,
    until,
    worker,
    worker_config,
)

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = pytest.mark.slow

DEST = "ward/fenced"


def message(n: int) -> bytes:
    return f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|MSG{n:05d}|P|2.5\r".encode()


def config(port: int, **changes: Any) -> WorkerConfig:
    changes.setdefault("retry", SHORT_ATTEMPTS)
    changes.setdefault("idle_seconds", 30)
    return worker_config(DEST, port, channel="adt", **changes)


def running(
    cfg: WorkerConfig, dsn: str, settings: LeaseSettings = QUICK_LEASE
) -> contextlib.AbstractAsyncContextManager[DestinationWorker]:
    return worker(cfg, dsn, lease=settings)


async def enqueue(dsn: str, numbers: list[int]) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await queue.enqueue(
            conn, [NewItem(DEST, "adt", f"MSG{n:05d}", "ADT^A01", message(n)) for n in numbers]
        )


async def test_a_worker_whose_lease_is_taken_over_sends_nothing_more(fresh_db: str) -> None:
    async with MllpReceiver() as rx, running(config(rx.port, idle_seconds=1), fresh_db) as w:
        await until(lambda: w.state.lock_held)
        first = w.lease
        assert first is not None
        await enqueue(fresh_db, [1])
        await until(lambda: delivered_is(fresh_db, 1))
        # Another holder takes the destination (as after this worker was paused past expiry).
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as admin:
            await admin.execute(
                "UPDATE inturn_lease SET holder = 'thief', epoch = epoch + 1,"
                " expires_at = clock_timestamp() + interval '4 s' WHERE destination = %s",
                (DEST,),
            )
            await enqueue(fresh_db, [2, 3])
            await until(lambda: not w.state.lock_held)
            assert control_ids(rx.received) == ["MSG00001"]  # nothing sent under a stale epoch
            # The thief's lease expires unrenewed: the worker takes it back, epoch raised again.
            await until(lambda: delivered_is(fresh_db, 3))
        assert w.lease is not None and w.lease.epoch == first.epoch + 2
    assert control_ids(rx.received) == ["MSG00001", "MSG00002", "MSG00003"]


async def delivered_is(dsn: str, n: int) -> bool:
    return await count(dsn, "delivered", DEST) == n


async def test_a_dead_holders_lease_is_taken_over_after_expiry_only(fresh_db: str) -> None:
    """A holder that stopped renewing (killed, cut off) keeps the destination until its lease
    expires; then a standby takes it with a higher epoch and sends what is pending, in order."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        dead = await leases.acquire(conn, DEST, "dead-pod:1:0", 2)
        assert dead is not None
    await enqueue(fresh_db, [1, 2, 3])
    async with MllpReceiver() as rx, running(config(rx.port), fresh_db) as w:
        await asyncio.sleep(1)
        assert rx.received == [] and not w.state.lock_held  # the dead lease is still valid
        await until(lambda: delivered_is(fresh_db, 3), timeout=10)
        assert w.lease is not None and w.lease.epoch == dead.epoch + 1
    assert control_ids(rx.received) == ["MSG00001", "MSG00002", "MSG00003"]


async def test_two_workers_never_both_send(fresh_db: str) -> None:
    """Two workers for one destination, two receivers: every message arrives once, in order,
    at one of them (the other worker never holds the lease meanwhile)."""
    async with MllpReceiver() as rx_a, MllpReceiver() as rx_b:
        async with (
            running(config(rx_a.port), fresh_db) as a,
            running(config(rx_b.port), fresh_db) as b,
        ):
            await until(lambda: a.state.lock_held or b.state.lock_held)
            await enqueue(fresh_db, list(range(40)))
            await until(lambda: delivered_is(fresh_db, 40))
            assert [a.state.lock_held, b.state.lock_held].count(True) == 1
        got = control_ids(rx_a.received) + control_ids(rx_b.received)
    assert [] in (rx_a.received, rx_b.received)
    assert got == [f"MSG{n:05d}" for n in range(40)]


async def test_a_clean_stop_releases_the_lease_for_the_successor(fresh_db: str) -> None:
    slow = LeaseSettings(ttl_seconds=600, renew_seconds=60, acquire_seconds=0.2)
    async with MllpReceiver() as rx:
        async with running(config(rx.port), fresh_db, slow) as first:
            await until(lambda: first.state.lock_held)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            info = await leases.holder(conn, DEST)
        assert info is not None and info.seconds_left <= 0  # released, not left to expire
        async with running(config(rx.port), fresh_db, slow) as second:
            await until(lambda: second.state.lock_held, timeout=5)


def test_the_lease_outlives_the_attempt_timeout() -> None:
    cfg = config(1, retry=RetryPolicy(max_attempts=0, timeout_seconds=60))
    worker = DestinationWorker(
        cfg, "host=x", MllpSender(cfg.sender), lease=LeaseSettings(ttl_seconds=45)
    )
    assert worker.lease_settings.ttl_seconds == 65  # 60 s attempts + the margin
    assert worker.lease_settings.takeover_bound_seconds() == 70


def test_lease_settings_from_the_environment() -> None:
    from inturn.worker.spec.config import LeaseSettingsError, lease_settings

    assert lease_settings({}) == LeaseSettings(45, 15, 5)
    assert lease_settings({}).takeover_bound_seconds() < 60
    env = {"INTURN_LEASE_TTL_SECONDS": "20", "INTURN_LEASE_RENEW_SECONDS": "5"}
    assert lease_settings(env) == LeaseSettings(20, 5, 5)
    with pytest.raises(LeaseSettingsError, match="INTURN_LEASE_RENEW_SECONDS"):
        lease_settings({"INTURN_LEASE_TTL_SECONDS": "10", "INTURN_LEASE_RENEW_SECONDS": "10"})
    with pytest.raises(LeaseSettingsError, match="number of seconds"):
        lease_settings({"INTURN_LEASE_TTL_SECONDS": "soon"})


async def test_a_mark_repeated_on_a_live_session_keeps_the_lease(fresh_db: str) -> None:
    """A delivered mark that keeps failing (here a constraint refuses it) renews nothing, so
    the worker renews its lease on its own between tries: a standby never takes over, and the
    message is marked once the cause is gone, never sent twice."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as admin:
        await admin.execute(
            "ALTER TABLE inturn_delivery ADD CONSTRAINT no_delivery"
            " CHECK (state <> 'delivered') NOT VALID"
        )
        try:
            async with (
                MllpReceiver() as rx_a,
                MllpReceiver() as rx_b,
                running(config(rx_a.port), fresh_db) as a,
            ):
                await until(lambda: a.state.lock_held)
                async with running(config(rx_b.port), fresh_db) as b:
                    await enqueue(fresh_db, [1])
                    await until(lambda: a.state.trouble is not None)
                    await asyncio.sleep(2 * QUICK_LEASE.ttl_seconds)  # past an unrenewed lease
                    assert a.state.lock_held and not b.state.lock_held
                    assert rx_b.received == []
                    await admin.execute("ALTER TABLE inturn_delivery DROP CONSTRAINT no_delivery")
                    await until(lambda: delivered_is(fresh_db, 1))
            assert control_ids(rx_a.received) == ["MSG00001"] and rx_b.received == []
        finally:
            await admin.execute("ALTER TABLE inturn_delivery DROP CONSTRAINT IF EXISTS no_delivery")


@pytest.mark.parametrize("lanes", [1, 3])
async def test_a_draining_worker_writes_its_lease_only_when_the_renewal_is_due(
    fresh_db: str, lanes: int
) -> None:
    """Issue 43: the per-message statements check holder and epoch and renew the lease only
    once its renewal is due (renew_seconds, 15 s by default), so a drain of a few seconds
    writes the lease row when it takes it and when it records its sender, not once a
    message; every message still goes once, in order."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as admin:
        await admin.execute("CREATE TABLE lease_writes (n bigint NOT NULL)")
        try:
            await admin.execute(
                "CREATE FUNCTION count_lease_write() RETURNS trigger LANGUAGE plpgsql AS"
                " $$BEGIN INSERT INTO lease_writes VALUES (1); RETURN NULL; END$$"
            )
            await admin.execute(
                "CREATE TRIGGER lease_written AFTER INSERT OR UPDATE ON inturn_lease"
                " FOR EACH ROW EXECUTE FUNCTION count_lease_write()"
            )
            total = 120
            await enqueue(fresh_db, list(range(total)))
            settings = LeaseSettings()  # 45 s, renewed every 15 s
            async with MllpReceiver() as rx:
                cfg = config(rx.port, lanes=lanes)
                async with running(cfg, fresh_db, settings):
                    await until(lambda: _all_delivered(fresh_db, total), timeout=60)
                    cur = await admin.execute("SELECT count(*) FROM lease_writes")
                    writes = await cur.fetchone()
        finally:
            await admin.execute("DROP TRIGGER IF EXISTS lease_written ON inturn_lease")
            await admin.execute("DROP FUNCTION IF EXISTS count_lease_write()")
            await admin.execute("DROP TABLE lease_writes")
    expected = [f"MSG{n:05d}" for n in range(total)]
    if lanes == 1:
        assert control_ids(rx.received) == expected
    else:  # no patient keys: any lane, each message once
        assert sorted(control_ids(rx.received)) == expected
    assert writes is not None and 1 <= writes[0] <= 3, writes  # acquired, sender recorded


async def _all_delivered(dsn: str, total: int) -> bool:
    return await count(dsn, "delivered") == total


# --- a killed worker process on a direct connection: replaced at once (migration 0025) --------


async def _lease_row(dsn: str) -> tuple[int, str, Any, Any, int | None]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT epoch, holder, expires_at, acquired_at, backend_pid FROM inturn_lease"
            " WHERE destination = %s",
            ("default/lab",),
        )
        row = await cur.fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3], row[4]


async def _backlog(dsn: str, dest: str, total: int) -> None:
    """Queue ``total`` messages ``M00000``... for ``dest``."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as c:
        items = [
            NewItem(dest, "adt", f"M{n:05d}", "ADT^A01", local_message(n)) for n in range(total)
        ]
        await queue.enqueue(c, items)


async def test_a_killed_worker_process_is_replaced_at_once_on_a_direct_connection(
    fresh_db: str, tmp_path: Path
) -> None:
    """``inturn worker`` SIGKILLed mid-backlog three times, each time restarted at once, with
    the default 45 s lease: each successor takes the lease over while the dead holder's lease
    is still live (its session ended with the process), the epoch raised once per kill, and
    delivery resumes each time. Nothing is lost, at most one duplicate per kill, in order."""
    total, kills = 400, 3
    dest = "default/lab"
    await _backlog(fresh_db, dest, total)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_LEASE_")}
    env["INTURN_DSN"] = fresh_db
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.01
        path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))

        proc = await worker_process(path, env)
        try:
            for k in range(kills):
                await rx.wait_for(50 * (k + 1), timeout=60)  # delivering
                epoch, holder, expires_at, _, pid = await _lease_row(fresh_db)
                assert epoch == k + 1 and pid is not None  # a direct holder names its backend
                proc.send_signal(signal.SIGKILL)  # mid-backlog, holding the lease
                await asyncio.wait_for(proc.wait(), 30)
                proc = await worker_process(path, env)  # restarted at once
                before = await count(fresh_db, "delivered")
                async with asyncio.timeout(40):  # under the 45 s lease: no expiry waited for
                    while (await _lease_row(fresh_db))[0] == epoch:
                        await asyncio.sleep(0.05)
                new_epoch, new_holder, _, acquired_at, _ = await _lease_row(fresh_db)
                assert new_epoch == epoch + 1 and new_holder != holder
                assert acquired_at < expires_at  # taken over while the dead one's was live
                async with asyncio.timeout(40):  # delivery resumed
                    while await count(fresh_db, "delivered") <= before:
                        await asyncio.sleep(0.05)
            async with asyncio.timeout(120):
                while await count(fresh_db, "delivered") < total:
                    await asyncio.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
        got = control_ids(rx.received)
    expected = [f"M{n:05d}" for n in range(total)]
    assert sorted(set(got)) == expected  # nothing lost
    assert len(got) - len(set(got)) <= kills  # at most the message in flight per kill
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expected  # in order


async def test_a_killed_inturn_local_restarted_at_once_takes_over_at_once(
    fresh_db: str, tmp_path: Path
) -> None:
    """``inturn local --dsn`` (a direct connection) SIGKILLed twice mid-backlog and started
    again at once, the default 45 s leases: the new one is not refused as 'in use' and its
    worker takes the destination's lease over while the dead one's is still live; every message
    accepted is delivered, at most one duplicate per kill, in order."""
    total, kills = 300, 2
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.01
        path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
        listen = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_LEASE_")}

        def local() -> LocalProcess:
            proc = LocalProcess(
                tmp_path / "local.log",
                ["-f", str(path), "--listen", f"adt={listen}", "--dsn", fresh_db],
            )
            proc.env = {k: v for k, v in env.items() if k != "INTURN_DSN"}
            return proc

        run = local()
        await run.start(listen)
        try:
            assert await send(listen, [local_message(n) for n in range(total)]) == ["AA"] * total
            for k in range(kills):
                await rx.wait_for(40 * (k + 1), timeout=60)  # delivering
                epoch, holder, expires_at, _, _ = await _lease_row(fresh_db)
                await run.kill()  # SIGKILL, holding the database's and the destination's leases
                run = local()
                await run.start(listen)  # at once: not refused as "in use"
                async with asyncio.timeout(40):  # under the 45 s lease
                    while (await _lease_row(fresh_db))[0] == epoch:
                        await asyncio.sleep(0.05)
                new_epoch, new_holder, _, acquired_at, _ = await _lease_row(fresh_db)
                assert new_epoch == epoch + 1 and new_holder != holder
                assert acquired_at < expires_at  # taken over while the dead one's was live
            async with asyncio.timeout(120):
                while await count(fresh_db, "delivered") < total:
                    await asyncio.sleep(0.1)
            assert await run.interrupt() == 0
        finally:
            await run.kill()
        got = control_ids(rx.received)
    expected = [f"M{n:05d}" for n in range(total)]
    assert sorted(set(got)) == expected  # nothing lost
    assert len(got) - len(set(got)) <= kills
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expected


async def test_a_stopped_holder_on_a_direct_connection_is_replaced_when_its_lease_expires(
    fresh_db: str, tmp_path: Path
) -> None:
    """``inturn worker`` SIGSTOPped mid-backlog on a direct connection (its session, and the
    destination's session lock with it, live on): a second worker takes the lease over once it
    has expired (within ttl + acquire interval of the last renewal), not never; when the first
    wakes it sends nothing more (at most the one message it was in the middle of). Every
    message arrives, in order."""
    total = 200
    dest = "default/lab"
    await _backlog(fresh_db, dest, total)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_LEASE_")}
    env.update(
        INTURN_DSN=fresh_db,
        INTURN_LEASE_TTL_SECONDS="6",
        INTURN_LEASE_RENEW_SECONDS="2",
        INTURN_LEASE_ACQUIRE_SECONDS="1",
    )
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.02
        path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
        first = await worker_process(path, env)
        second: asyncio.subprocess.Process | None = None
        try:
            await rx.wait_for(30, timeout=60)
            epoch, holder, _, _, pid = await _lease_row(fresh_db)
            assert pid is not None  # a direct holder: its backend is named, its session locked
            first.send_signal(signal.SIGSTOP)
            stopped_at = asyncio.get_running_loop().time()
            second = await worker_process(path, env)
            async with asyncio.timeout(60):
                while (await _lease_row(fresh_db))[0] == epoch:
                    await asyncio.sleep(0.1)
            took = asyncio.get_running_loop().time() - stopped_at
            new_epoch, new_holder, _, _, new_pid = await _lease_row(fresh_db)
            assert new_epoch == epoch + 1 and new_holder != holder
            assert new_pid is None  # taken without the session lock the stopped one still has
            assert took < 6 + 1 + 10  # ttl + acquire interval, and a shared machine's margin
            first.send_signal(signal.SIGCONT)
            async with asyncio.timeout(120):
                while await count(fresh_db, "delivered") < total:
                    await asyncio.sleep(0.1)
            assert (await _lease_row(fresh_db))[0] == new_epoch  # the woken one took nothing back
        finally:
            first.send_signal(signal.SIGCONT)
            for proc in (first, second):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(proc.wait(), 30)
        got = control_ids(rx.received)
    expected = [f"M{n:05d}" for n in range(total)]
    assert sorted(set(got)) == expected  # nothing lost
    assert len(got) - len(set(got)) <= 1  # at most the message the stopped one was sending
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expected  # in order


async def _sessions(dsn: str, application_name: str) -> int:
    """How many sessions of the server carry ``application_name``."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_a_holder_whose_event_loop_is_blocked_is_replaced_and_sends_nothing_after(
    fresh_db: str, tmp_path: Path
) -> None:
    """A worker whose event loop is blocked past its lease's ttl (a long synchronous call; a
    process swapped out or a VM frozen looks the same from outside: nothing of it runs, its
    direct session and the destination's session lock live on) is replaced by a second worker
    within ttl + acquire interval of its last renewal; when its loop runs again it learns its
    epoch is gone before it sends anything new (at most the one message it was sending).
    Every message arrives, in order. The blocked worker runs in a thread of its own, so the
    receiver here does not stop with it."""
    total, block_seconds = 200, 12.0
    dest = "default/lab"
    await _backlog(fresh_db, dest, total)
    ttl, acquire = 6, 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_LEASE_")}
    env.update(
        INTURN_DSN=fresh_db,
        INTURN_LEASE_TTL_SECONDS=str(ttl),
        INTURN_LEASE_RENEW_SECONDS="2",
        INTURN_LEASE_ACQUIRE_SECONDS=str(acquire),
    )
    settings = LeaseSettings(ttl_seconds=ttl, renew_seconds=2, acquire_seconds=acquire)
    async with MllpReceiver() as rx:
        rx.delay_seconds = 0.02
        cfg = worker_config(dest, rx.port, channel="adt", idle_seconds=1)
        loops: list[asyncio.AbstractEventLoop] = []
        stopping: list[asyncio.Event] = []
        failed: list[BaseException] = []

        def first_worker() -> None:
            async def run() -> None:
                loops.append(asyncio.get_running_loop())
                stopping.append(asyncio.Event())
                async with worker(cfg, fresh_db, lease=settings, stop_seconds=30):
                    await asyncio.wait_for(stopping[0].wait(), 300)  # every wait bounded

            try:
                asyncio.run(run())
            except BaseException as exc:  # said by the test below
                failed.append(exc)

        thread = threading.Thread(target=first_worker, daemon=True)
        thread.start()
        second: asyncio.subprocess.Process | None = None
        try:
            await rx.wait_for(30, timeout=60)
            epoch, holder, _, _, pid = await _lease_row(fresh_db)
            assert pid is not None  # a direct holder, its session locked
            # the second worker is up and waiting for the lease before the first one stops:
            # started after, its start-up on a loaded machine outlasted the block (loop pass 3)
            sessions = f"inturn-worker {dest}"
            before = await _sessions(fresh_db, sessions)
            path = manifest(tmp_path / "lab.yaml", "lab", mllp_sender(rx.port))
            second = await worker_process(path, env)
            async with asyncio.timeout(120):
                while await _sessions(fresh_db, sessions) <= before:
                    await asyncio.sleep(0.1)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as c:
                cur = await c.execute("SELECT clock_timestamp()")
                blocked_at = (await cur.fetchone())[0]  # type: ignore[index]
            loops[0].call_soon_threadsafe(time.sleep, block_seconds)  # its loop stops dead
            async with asyncio.timeout(60):
                while (await _lease_row(fresh_db))[0] == epoch:
                    await asyncio.sleep(0.1)
            new_epoch, new_holder, _, acquired_at, new_pid = await _lease_row(fresh_db)
            assert new_epoch == epoch + 1 and new_holder != holder and new_pid is None
            took = (acquired_at - blocked_at).total_seconds()
            assert took < ttl + acquire + 5  # within the bound (a shared machine's margin)
            assert took < block_seconds  # taken over while the first was still blocked
            async with asyncio.timeout(120):
                while await count(fresh_db, "delivered") < total:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(2)  # the woken one had its chance to send or take anything
            assert (await _lease_row(fresh_db))[0] == new_epoch  # it took nothing back
        finally:
            if loops and stopping:
                loops[0].call_soon_threadsafe(stopping[0].set)
            await asyncio.to_thread(thread.join, 60)
            if second is not None:
                second.send_signal(signal.SIGTERM)
                await asyncio.wait_for(second.wait(), 30)
        got = control_ids(rx.received)
    assert not thread.is_alive() and failed == []
    expected = [f"M{n:05d}" for n in range(total)]
    assert sorted(set(got)) == expected  # nothing lost
    assert len(got) - len(set(got)) <= 1  # at most the message it was sending when blocked
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expected  # in order
