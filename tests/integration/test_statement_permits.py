"""Workers of one process sharing a bound on their statements (``inturn local``, issue 43,
:mod:`inturn.worker.drain.permits`): every destination still gets its messages once and in
order, and a receiver that never answers holds no permit while its attempt waits, so the other
destinations keep delivering. Real workers, real MLLP sockets, the test session's Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.permits import StatementPermits
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.registry import make_sender
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.testing import MllpReceiver
from tests.support import pipeline
from tests.support.channel_log import CHANNEL, append


@contextlib.asynccontextmanager
async def workers(
    configs: Sequence[WorkerConfig], dsn: str, permits: StatementPermits
) -> AsyncIterator[list[DestinationWorker]]:
    """Run a worker per config, all sharing ``permits``, until the block ends; then stop them
    (an attempt still in flight after 15 s is abandoned: a silent receiver's)."""
    stop = asyncio.Event()
    running = [
        DestinationWorker(c, dsn, make_sender(c.sender), PrometheusObserver(), permits=permits)
        for c in configs
    ]
    tasks = [asyncio.create_task(w.run(stop)) for w in running]
    try:
        yield running
    finally:
        stop.set()
        _, late = await asyncio.wait(tasks, timeout=15)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def payloads_of(dsn: str, destination: str) -> list[bytes]:
    """The log's payloads routed to ``destination``, in log order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            bytes(r[0])
            for r in conn.execute(
                "SELECT m.payload FROM inturn_message m JOIN inturn_route r ON r.id = m.route"
                " WHERE %s = ANY(r.destinations) ORDER BY m.id",
                (destination,),
            ).fetchall()
        ]


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_workers_bound_to_one_statement_deliver_everything_in_order(
    fresh_db: str, lanes: int
) -> None:
    names = [f"ward/p{n}" for n in range(6)]
    permits = StatementPermits(1)
    async with contextlib.AsyncExitStack() as stack:
        receivers = [await stack.enter_async_context(MllpReceiver()) for _ in names]
        configs = [
            pipeline.worker_config(name, rx.port, channel=CHANNEL, lanes=lanes)
            for name, rx in zip(names, receivers, strict=True)
        ]
        async with workers(configs, fresh_db, permits):
            with psycopg.connect(fresh_db, autocommit=True) as sync:
                append(sync, names, 15, "A")
                append(sync, names[:3], 5, "B")  # half of them take these too
                append(sync, names, 10, "C")
            for name, rx in zip(names, receivers, strict=True):
                await rx.wait_for(len(payloads_of(fresh_db, name)), timeout=30)
    for name, rx in zip(names, receivers, strict=True):
        # one patient key for every message: lanes keep its order too
        assert rx.received == payloads_of(fresh_db, name)
    assert permits.peak == 1 and permits.running == 0


async def test_a_receiver_that_never_answers_does_not_hold_up_the_others(fresh_db: str) -> None:
    """One permit for five destinations, one of whose receivers reads and never answers
    (attempts bounded at 60 s): while its first attempt waits, the four others get every
    message; a permit held across the send would have stopped them for the whole minute."""
    names = [f"ward/s{n}" for n in range(5)]
    permits = StatementPermits(1)
    async with contextlib.AsyncExitStack() as stack:
        receivers = [await stack.enter_async_context(MllpReceiver()) for _ in names]
        silent = receivers[0]
        silent.reply = False
        slow = dataclasses.replace(pipeline.FAST_RETRY, timeout_seconds=60)
        configs = [
            pipeline.worker_config(name, rx.port, channel=CHANNEL, retry=slow)
            for name, rx in zip(names, receivers, strict=True)
        ]
        async with workers(configs, fresh_db, permits) as running:
            with psycopg.connect(fresh_db, autocommit=True) as sync:
                append(sync, names, 20)
            await silent.wait_for(1, timeout=20)
            for rx in receivers[1:]:
                await rx.wait_for(20, timeout=20)
            assert running[0].state.sending_since is not None  # its attempt still waits
            assert silent.received == payloads_of(fresh_db, names[0])[:1]
    for name, rx in zip(names[1:], receivers[1:], strict=True):
        assert rx.received == payloads_of(fresh_db, name)
