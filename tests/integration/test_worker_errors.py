"""An exception nobody foresaw, met by a worker's drain: said in one line, seen on ``/readyz``,
and not the end of the destination's delivery (a new user's trial once saw a worker's task end
without a word, its lease and session gone, until ``inturn local`` exited)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.local.run import _ended
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.testing import MllpReceiver
from tests.support.lab import all_delivered, config, enqueue, message
from tests.support.pipeline import until

pytestmark = pytest.mark.store


class FailsOnce(MllpSender):
    """An MLLP sender with a bug in its first send (a real one afterwards)."""

    failed = False

    async def send(self, payload: bytes, *, item_id: int = 0) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("a bug in the sender\nsecond line")
        await super().send(payload, item_id=item_id)


async def test_an_unexpected_error_is_said_seen_on_readyz_and_the_worker_goes_on(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    await enqueue(fresh_db, [1, 2])
    caplog.set_level(logging.INFO, logger="inturn.drain")
    async with MllpReceiver() as rx:
        cfg = config(rx.port)
        assert isinstance(cfg.sender, MllpSenderConfig)
        worker = DestinationWorker(cfg, fresh_db, FailsOnce(cfg.sender), PrometheusObserver())
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await until(lambda: worker.state.failure is not None, timeout=10)
            assert worker.state.not_ready() == (
                "session ended by an unexpected error (RuntimeError: a bug in the sender)"
            )
            await rx.wait_for(2)
            await until(lambda: all_delivered(fresh_db, 2))
            assert worker.state.failure is None and worker.state.not_ready() is None
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    assert rx.received == [message(1), message(2)]
    said = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert [r.levelname for r in said] == ["ERROR"]
    line = said[0].getMessage()
    assert "\n" not in line and "RuntimeError: a bug in the sender" in line
    assert "the head stays pending" in line and "a new session in 1s" in line


async def test_inturn_local_says_which_worker_ended_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise ValueError("schema missing\nmore")

    task = asyncio.create_task(broken())
    with pytest.raises(ValueError):
        await task
    _ended("ward/lab", task)
    [record] = [r for r in caplog.records if r.name == "inturn.local"]
    assert record.levelname == "ERROR"
    assert record.getMessage() == (
        "destination ward/lab: its worker stopped (ValueError: schema missing); nothing more"
        " is delivered to it (its messages stay pending) until `inturn local` is started again"
    )
