"""Production weather at the worker (issue 18, kinds 1 and 6), against a real Postgres.

Kind 1: a delivered mark that cannot be written while the session lives (a full disk; a row
lock forgotten by another session on a server with ``lock_timeout``) is written again, never
sent again: exactly one copy reaches the receiver, ``/readyz`` says why meanwhile and liveness
holds. Kind 6: a statement waiting on another session's lock longer than the threshold names
that session in the log and on ``/readyz``, and the seconds are counted.

The full disk is real: ``inturn_delivery`` is moved to a tablespace on a small tmpfs which is
then filled, and the table's pages are packed so that the mark's new row version needs a page
the disk does not have (needs root and a server on this machine; skipped otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.drain.health import make_app
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.registry import make_sender
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.pipeline import control_ids, worker_config
from tests.support.pipeline import until as until_true
from tests.support.pipeline import worker as run_worker

INTURN = str(Path(sys.executable).with_name("inturn"))

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.store, pytest.mark.slow]

DEST = "ward/weather"


def message(n: int, padding: int = 0) -> bytes:
    note = f"NTE|1||{'x' * padding}\r" if padding else ""
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|W{n:05d}|P|2.5\r"
        f"PID|1||P{n}^^^HOSP^MR||DOE^JOHN\r{note}"
    ).encode()


def config(port: int) -> WorkerConfig:
    return worker_config(DEST, port, channel="adt")


def running_worker(
    port: int, dsn: str, lock_wait_seconds: float = 30.0
) -> contextlib.AbstractAsyncContextManager[DestinationWorker]:
    return run_worker(config(port), dsn, stop_seconds=30, lock_wait_seconds=lock_wait_seconds)


async def enqueue(dsn: str, numbers: list[int], padding: int = 0) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        items = [NewItem(DEST, "adt", f"W{n:05d}", "ADT^A01", message(n, padding)) for n in numbers]
        return await queue.enqueue(conn, items)


async def delivered(dsn: str) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT id FROM inturn_delivery WHERE destination = %s AND state = 'delivered'"
            " ORDER BY id",
            (DEST,),
        )
        return [int(r[0]) for r in await cur.fetchall()]


until = functools.partial(until_true, timeout=30.0)


def failures(step: str) -> float:
    value = REGISTRY.get_sample_value(
        "inturn_store_step_failures_total", {"destination": DEST, "step": step}
    )
    return value or 0.0


def lock_wait_seconds() -> float:
    value = REGISTRY.get_sample_value("inturn_lock_wait_seconds_total", {"destination": DEST})
    return value or 0.0


async def hold_row_lock(dsn: str, item_id: int, name: str) -> AsyncConnection[Any]:
    """A second session that forgot its ``BEGIN; SELECT ... FOR UPDATE`` on one row."""
    holder = await AsyncConnection.connect(dsn, application_name=name)
    await holder.execute("SELECT id FROM inturn_delivery WHERE id = %s FOR UPDATE", (item_id,))
    return holder


async def mark_refused(worker: DestinationWorker, rx: MllpReceiver, times: int = 3) -> bytes:
    """Wait until the head was sent and its delivered mark refused ``times`` times; check the
    session lives on (not ready, alive, nothing sent again); return the ``/readyz`` body."""
    before = failures("mark")
    await rx.wait_for(1)
    await until(lambda: failures("mark") >= before + times)
    app = make_app([worker])
    status, _, body = app.answer("/readyz")
    assert status == 503
    assert app.answer("/healthz")[0] == 200
    assert control_ids(rx.received) == ["W00001"]
    return body


async def test_a_mark_refused_by_lock_timeout_is_retried_and_sent_once(fresh_db: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(fresh_db)["dbname"]
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" SET lock_timeout = 200')
    try:
        [first, second] = await enqueue(fresh_db, [1, 2])
        holder = await hold_row_lock(fresh_db, first, "forgotten-select")
        try:
            async with MllpReceiver() as rx, running_worker(rx.port, fresh_db) as worker:
                body = await mark_refused(worker, rx)
                assert b"delivered mark of id=" in body and b"lock not available" in body
                await holder.rollback()
                await until(lambda: _equal(delivered(fresh_db), [first, second]))
                assert make_app([worker]).answer("/readyz")[0] == 200
        finally:
            await holder.close()
        assert control_ids(rx.received) == ["W00001", "W00002"]  # exactly one copy each
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" RESET lock_timeout')


async def test_a_forgotten_row_lock_is_named_while_the_mark_waits(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="inturn.drain")
    [first] = await enqueue(fresh_db, [1])
    holder = await hold_row_lock(fresh_db, first, "forgotten-select")
    holder_pid = holder.info.backend_pid
    counted = lock_wait_seconds()
    try:
        async with MllpReceiver() as rx, running_worker(rx.port, fresh_db, 0.3) as worker:
            await rx.wait_for(1)
            await until(lambda: worker.state.lock_wait is not None)
            status, _, body = make_app([worker]).answer("/readyz")
            assert status == 503
            text = body.decode()
            assert f"lock held by pid {holder_pid}" in text
            assert "'forgotten-select'" in text and "idle in transaction since" in text
            assert make_app([worker]).answer("/healthz")[0] == 200
            logged = [r.getMessage() for r in caplog.records]
            assert any(f"pid {holder_pid}" in m and "forgotten-select" in m for m in logged)
            await holder.rollback()
            await until(lambda: _equal(delivered(fresh_db), [first]))
            await until(lambda: worker.state.lock_wait is None)
    finally:
        await holder.close()
    assert control_ids(rx.received) == ["W00001"]
    assert lock_wait_seconds() > counted


# --- a full disk --------------------------------------------------------------------------------


@contextlib.contextmanager
def small_tablespace(dsn: str) -> Iterator[tuple[str, Path]]:
    """A tablespace on a 2 MiB tmpfs of its own: ``(name, mount point)``; dropped after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a tmpfs needs root")
    with psycopg.connect(dsn, autocommit=True) as admin:
        data_dir = Path(str(admin.execute("SHOW data_directory").fetchone()[0]))  # type: ignore[index]
    if not data_dir.is_dir():
        pytest.skip("the Postgres server is not on this machine")
    owner = data_dir.stat()
    mount_point = Path(tempfile.mkdtemp(prefix="inturn-full-"))
    mount_point.chmod(0o755)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o",
         f"size=2m,uid={owner.st_uid},gid={owner.st_gid},mode=0700", "inturn-full",
         str(mount_point)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    name = f"inturn_full_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"CREATE TABLESPACE {name} LOCATION '{mount_point}'")
        try:
            yield name, mount_point
        finally:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("ALTER TABLE inturn_delivery SET TABLESPACE pg_default")
                admin.execute(f"DROP TABLESPACE {name}")
    finally:
        subprocess.run(["umount", str(mount_point)], check=False, capture_output=True, timeout=60)
        mount_point.rmdir()


def fill(mount_point: Path) -> Path:
    """Fill the tmpfs to the last byte with a file; return it (delete it to free the space)."""
    filler = mount_point / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 512, 1):
            with contextlib.suppress(OSError):
                while f.write(b"\0" * size):
                    pass
    return filler


def pack_pages(dsn: str) -> int:
    """Insert tiny finished rows until the table cannot grow: every page is then full, so a
    larger row version needs a new page (and the disk has none). Returns the rows added."""
    added = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            try:
                conn.execute(
                    "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                    " payload, size, state, finished_at)"
                    " VALUES ('filler/x', 'f', 'f', 'F', '', 0, 'skipped', now())"
                )
            except psycopg.errors.DiskFull:
                return added
            added += 1
            assert added < 100_000, "the disk never filled"


async def test_a_mark_on_a_full_disk_is_retried_and_sent_once(fresh_db: str) -> None:
    with small_tablespace(fresh_db) as (tablespace, mount_point):
        with psycopg.connect(fresh_db, autocommit=True) as admin:
            admin.execute(f"ALTER TABLE inturn_delivery SET TABLESPACE {tablespace}")
        [first, second] = await enqueue(fresh_db, [1, 2], padding=1500)
        filler = fill(mount_point)
        assert pack_pages(fresh_db) >= 0
        async with MllpReceiver() as rx, running_worker(rx.port, fresh_db) as worker:
            assert b"disk full" in await mark_refused(worker, rx)
            filler.unlink()  # the disk has room again
            await until(lambda: _equal(delivered(fresh_db), [first, second]))
            assert make_app([worker]).answer("/readyz")[0] == 200
        assert control_ids(rx.received) == ["W00001", "W00002"]  # exactly one copy each


async def _equal(awaitable: Any, expected: Any) -> bool:
    return bool(await awaitable == expected)


# --- a command waiting on a lock ----------------------------------------------------------------


async def test_queue_depth_under_lock_table_names_the_lock_not_the_network(fresh_db: str) -> None:
    locker = await AsyncConnection.connect(fresh_db, application_name="table-locker")
    await locker.execute("LOCK TABLE inturn_delivery IN ACCESS EXCLUSIVE MODE")
    locker_pid = locker.info.backend_pid
    try:
        done = await asyncio.create_subprocess_exec(
            INTURN, "queue", "depth", "--dsn", fresh_db,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "INTURN_LOCK_WAIT_SECONDS": "1"},
        )  # fmt: skip
        _, err = await asyncio.wait_for(done.communicate(), 60)
    finally:
        await locker.rollback()
        await locker.close()
    text = err.decode()
    assert done.returncode == 2
    assert f"lock held by pid {locker_pid}" in text, text
    assert "'table-locker'" in text and "statement timeout" in text
    assert "cannot reach the database" not in text


async def test_a_stop_waits_for_the_delivered_mark(fresh_db: str) -> None:
    """A stop asked while the delivered mark is refused waits for the mark (as it waits for the
    attempt in flight): stopping then would send the message again."""
    dbname = psycopg.conninfo.conninfo_to_dict(fresh_db)["dbname"]
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" SET lock_timeout = 200')
    try:
        [first] = await enqueue(fresh_db, [1])
        holder = await hold_row_lock(fresh_db, first, "forgotten-select")
        try:
            async with MllpReceiver() as rx:
                cfg = config(rx.port)
                worker = DestinationWorker(cfg, fresh_db, make_sender(cfg.sender))
                stop = asyncio.Event()
                task = asyncio.create_task(worker.run(stop))
                await until(lambda: worker.state.trouble is not None)
                stop.set()
                await asyncio.sleep(1.5)  # several refusals after the stop
                assert not task.done() and await delivered(fresh_db) == []
                await holder.rollback()
                await asyncio.wait_for(task, 30)
        finally:
            await holder.close()
        assert await delivered(fresh_db) == [first]
        assert control_ids(rx.received) == ["W00001"]
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" RESET lock_timeout')
