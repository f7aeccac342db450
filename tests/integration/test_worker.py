"""The per-destination worker against a real Postgres and a real MLLP receiver."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from psycopg import AsyncConnection

from inturn.worker import worklist
from inturn.worker.drain.health import bound_port, make_app, serve
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders.mllp import MllpSender
from inturn.worker.spec.config import AckPolicy, RetryPolicy
from inturn.worker.store import actions, queue, reads
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.lab import DEST, all_delivered, config, enqueue, running, states
from tests.support.pipeline import control_ids, until


async def test_failed_head_is_never_overtaken(fresh_db: str) -> None:
    """The ordering pitfall end to end: the head fails, a later one arrives, order holds."""
    async with MllpReceiver(ack_code="AE") as rx, running(config(rx.port), fresh_db):
        await enqueue(fresh_db, [1])
        await rx.wait_for(2)  # the head was tried and retried
        await enqueue(fresh_db, [2])
        await rx.wait_for(3)
        rx.ack_code = "AA"
        await until(lambda: all_delivered(fresh_db, 2))
    seen = control_ids(rx.received)
    assert seen[-1] == "MSG00002" and set(seen[:-1]) == {"MSG00001"}
    rows = await states(fresh_db)
    assert [r[1] for r in rows] == ["delivered", "delivered"]
    assert rows[0][2] == len(seen) - 1  # attempts of the head


async def test_gives_up_after_max_attempts_and_moves_on(fresh_db: str) -> None:
    retry = RetryPolicy(max_attempts=2, backoff_seconds=0, max_backoff_seconds=0, timeout_seconds=5)
    async with MllpReceiver(ack_code="AR") as rx, running(config(rx.port, retry=retry), fresh_db):
        await enqueue(fresh_db, [1, 2])
        await until(lambda: _finished(fresh_db, 2))
    rows = await states(fresh_db)
    assert [(r[1], r[2]) for r in rows] == [("failed", 2), ("failed", 2)]
    assert control_ids(rx.received) == ["MSG00001", "MSG00001", "MSG00002", "MSG00002"]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        item = await reads.get_item(conn, rows[0][0])
        assert item is not None and item.reason is not None and item.reason.startswith("AR")
        page = await worklist.list_items(conn, queue="delivery-failed")
    assert [(i.record_key, i.reason, i.placed_by) for i in page.items] == [
        (str(rows[0][0]), "attempts-exhausted", "worker"),
        (str(rows[1][0]), "attempts-exhausted", "worker"),
    ]
    assert page.items[0].details["controlId"] == "MSG00001"


async def _finished(dsn: str, n: int) -> bool:
    rows = await states(dsn)
    return len(rows) == n and all(r[1] != "pending" for r in rows)


async def test_ack_policy_fail_gives_up_at_once(fresh_db: str) -> None:
    cfg = config(0, ack_policy=AckPolicy(AR="fail"))
    async with MllpReceiver(ack_code="AR") as rx:
        cfg = config(rx.port, ack_policy=AckPolicy(AR="fail"))
        async with running(cfg, fresh_db):
            await enqueue(fresh_db, [1])
            await until(lambda: _finished(fresh_db, 1))
    assert [(r[1], r[2]) for r in await states(fresh_db)] == [("failed", 1)]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        page = await worklist.list_items(conn, queue="delivery-failed")
    assert [i.reason for i in page.items] == ["ack-ar"]


async def test_control_id_mismatch_is_retried_by_default(fresh_db: str) -> None:
    async with MllpReceiver() as rx, running(config(rx.port), fresh_db):
        rx.ack_control_id_override = "SOMETHING-ELSE"
        await enqueue(fresh_db, [1])
        await rx.wait_for(2)
        rx.ack_control_id_override = None
        await until(lambda: all_delivered(fresh_db, 1))
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        [item], _ = await reads.list_items(conn)
    assert item.reason is not None and item.reason.startswith("controlIdMismatch")


async def test_two_workers_on_one_destination_only_one_sends(fresh_db: str) -> None:
    async with MllpReceiver() as rx:
        async with running(config(rx.port), fresh_db) as a, running(config(rx.port), fresh_db) as b:
            await until(lambda: _any(lambda: a.state.lock_held or b.state.lock_held))
            await enqueue(fresh_db, list(range(50)))
            await until(lambda: all_delivered(fresh_db, 50))
            assert [a.state.lock_held, b.state.lock_held].count(True) == 1
        assert control_ids(rx.received) == [f"MSG{n:05d}" for n in range(50)]


async def _any(fn: Any) -> bool:
    return bool(fn())


async def test_suspended_worker_holds_the_lock_and_sends_nothing(fresh_db: str) -> None:
    async with MllpReceiver() as rx:
        async with running(config(rx.port, suspend=True), fresh_db) as r:
            await enqueue(fresh_db, [1])
            await until(lambda: _any(lambda: r.state.lock_held))
            await asyncio.sleep(1.5)  # more than one idle period: still nothing sent
            assert rx.received == []
        async with running(config(rx.port), fresh_db):
            await until(lambda: all_delivered(fresh_db, 1))


async def test_lost_connection_is_regained_and_delivery_resumes(fresh_db: str) -> None:
    async with MllpReceiver() as rx, running(config(rx.port), fresh_db) as r:
        await enqueue(fresh_db, [1])
        await until(lambda: all_delivered(fresh_db, 1))
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'inturn-worker%%'"
                " AND datname = current_database()"  # not the workers of other test runs
            )
        await enqueue(fresh_db, [2])
        await until(lambda: all_delivered(fresh_db, 2))
        assert r.state.lock_held
    assert control_ids(rx.received) == ["MSG00001", "MSG00002"]


async def test_health_endpoints_follow_the_lock(fresh_db: str) -> None:
    async with MllpReceiver() as rx:
        async with running(config(rx.port), fresh_db) as a, running(config(rx.port), fresh_db) as b:
            await until(lambda: _any(lambda: a.state.lock_held or b.state.lock_held))
            runners = [await serve(make_app([w]), "127.0.0.1", 0) for w in (a, b)]
            try:
                async with aiohttp.ClientSession() as http:
                    codes = []
                    for runner in runners:
                        base = f"http://127.0.0.1:{bound_port(runner)}"
                        async with http.get(base + "/readyz") as resp:
                            ready = resp.status
                        async with http.get(base + "/healthz") as resp:
                            alive = resp.status
                        async with http.get(base + "/metrics") as resp:
                            text = await resp.text()
                        codes.append((ready, alive))
                        assert "inturn_lock_held" in text
            finally:
                for runner in runners:
                    await runner.cleanup()
        assert sorted(codes) == [(200, 200), (503, 200)]


async def test_every_sample_arrives_identical_apart_from_separators(
    fresh_db: str, samples: list[Path]
) -> None:
    raw = []
    for path in samples:
        payload = path.read_bytes()
        try:
            parse_header(payload)
        except HeaderError:
            continue  # the few deliberately broken samples: ingest answers them AR
        raw.append(payload)
    assert len(raw) >= 100
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(
            conn, [NewItem(DEST, "adt", f"S{i}", "X", payload) for i, payload in enumerate(raw)]
        )
    async with MllpReceiver() as rx, running(config(rx.port), fresh_db):
        await until(lambda: all_delivered(fresh_db, len(raw)), timeout=60)
    assert rx.received == [normalise_terminators(p) for p in raw]


class Recording(PrometheusObserver):
    """The Prometheus observer, also keeping every depth it was told."""

    def __init__(self) -> None:
        self.depths: list[tuple[int, int]] = []

    def depth(
        self, destination: str, pending: int, oldest_seconds: float, max_attempts: int
    ) -> None:
        super().depth(destination, pending, oldest_seconds, max_attempts)
        self.depths.append((pending, max_attempts))


async def test_an_idle_worker_is_woken_by_the_enqueue_not_by_polling(fresh_db: str) -> None:
    """With a safety poll of an hour, only the enqueue's NOTIFY can start the delivery."""
    seen = Recording()
    async with MllpReceiver() as rx:
        cfg = config(rx.port, idle_seconds=3600)
        worker = DestinationWorker(cfg, fresh_db, MllpSender(cfg.sender), seen)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await until(lambda: _true(seen.depths == [(0, 0)]))  # looked, found nothing: waits
            await enqueue(fresh_db, [1, 2])
            await until(lambda: all_delivered(fresh_db, 2))
            await until(lambda: _true(seen.depths[-1] == (0, 0)))
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    assert control_ids(rx.received) == ["MSG00001", "MSG00002"]


async def test_a_trickle_queries_no_depth_and_a_backlog_is_counted(fresh_db: str) -> None:
    """A queue that empties after each message never has its depth queried before a send (the
    gauges say 0 when the head query finds nothing); a backlog's depth is queried after the
    first send, when the mark has returned the next head (``bench/latency.py --hops`` found a
    depth query before most sends of a trickle)."""
    seen = Recording()
    async with MllpReceiver() as rx:
        cfg = config(rx.port, idle_seconds=3600)
        worker = DestinationWorker(cfg, fresh_db, MllpSender(cfg.sender), seen)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await until(lambda: _true(seen.depths == [(0, 0)]))
            for n in (1, 2, 3):
                await enqueue(fresh_db, [n])
                await until(lambda n=n: all_delivered(fresh_db, n))
                await until(lambda n=n: _true(seen.depths.count((0, 0)) >= n + 1))
            trickle = len(seen.depths)
            await enqueue(fresh_db, list(range(4, 14)))  # ten in one transaction
            await until(lambda: all_delivered(fresh_db, 13))
            await until(lambda: _true(seen.depths[-1] == (0, 0)))
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    assert set(seen.depths[:trickle]) == {(0, 0)}
    assert seen.depths[trickle:] == [(9, 0), (0, 0)]
    assert control_ids(rx.received) == [f"MSG{n:05d}" for n in range(1, 14)]


async def test_a_drain_wakes_a_worker_waiting_out_a_backoff(fresh_db: str) -> None:
    """The worker's gauges follow a drain at once, though its head backs off for an hour."""
    seen = Recording()
    slow = RetryPolicy(max_attempts=0, backoff_seconds=3600, max_backoff_seconds=3600)
    async with MllpReceiver(ack_code="AE") as rx:
        cfg = config(rx.port, idle_seconds=3600, retry=slow)
        worker = DestinationWorker(cfg, fresh_db, MllpSender(cfg.sender), seen)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await enqueue(fresh_db, [1, 2])
            await rx.wait_for(1)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                assert len(await actions.drain(conn, DEST, who="t")) == 2
            # The drain may land before the worker has recorded its first gauge.
            await until(lambda: _true(seen.depths[-1:] == [(0, 0)]))
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def _true(value: bool) -> bool:
    return value
