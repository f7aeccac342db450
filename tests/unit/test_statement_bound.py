"""The bound on a process's worker statements (``inturn local``, issue 43): at most ``limit``
at once, a permit given back when its statement ends or has run too long, and the setting."""

from __future__ import annotations

import asyncio

import pytest

from inturn.worker.drain import permits as bound
from inturn.worker.drain.permits import StatementPermits, permits_from_env
from inturn.worker.errors import Invalid


async def test_at_most_limit_statements_run_at_once() -> None:
    permits = StatementPermits(2)
    running = 0
    most = 0

    async def statement() -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return 1

    async with asyncio.timeout(10):
        done = await asyncio.gather(*(permits.run(statement) for _ in range(20)))
    assert done == [1] * 20
    assert most == 2 and permits.peak == 2 and permits.running == 0


async def test_a_statement_that_runs_too_long_gives_its_permit_back() -> None:
    """One statement stuck (a lock a person holds) ties its permit up for release_after only:
    the next statement runs while it still waits."""
    permits = StatementPermits(1, release_after=0.05)
    stuck = asyncio.Event()
    order: list[str] = []

    async def waits() -> None:
        async with asyncio.timeout(10):  # every wait bounded (tests/unit/test_isolation.py)
            await stuck.wait()
        order.append("stuck")

    async def quick() -> None:
        order.append("quick")

    async with asyncio.timeout(10):
        first = asyncio.create_task(permits.run(waits))
        await asyncio.sleep(0)
        await permits.run(quick)
        stuck.set()
        await first
    assert order == ["quick", "stuck"]
    assert permits.running == 0


async def test_a_statement_that_waited_too_long_for_a_permit_runs_without_one() -> None:
    """The bound never delays a statement by more than wait_at_most, however long the one
    holding the only permit runs (release_after set past it here)."""
    permits = StatementPermits(1, release_after=60, wait_at_most=0.05)
    stuck = asyncio.Event()

    async def waits() -> None:
        async with asyncio.timeout(10):  # every wait bounded (tests/unit/test_isolation.py)
            await stuck.wait()

    async def quick() -> str:
        return "ran"

    async with asyncio.timeout(10):
        first = asyncio.create_task(permits.run(waits))
        await asyncio.sleep(0)
        assert await permits.run(quick) == "ran"
        assert permits.unbounded == 1 and permits.running == 1
        stuck.set()
        await first
    assert permits.running == 0
    assert await permits.run(quick) == "ran"  # the permit came back
    assert permits.unbounded == 1


async def test_an_error_gives_the_permit_back() -> None:
    permits = StatementPermits(1)

    async def fails() -> None:
        raise RuntimeError("boom")

    for _ in range(3):
        with pytest.raises(RuntimeError):
            await permits.run(fails)
    assert permits.running == 0


def test_the_setting() -> None:
    unset = permits_from_env({})
    assert unset is not None and unset.limit == bound.default_limit() >= 1
    assert permits_from_env({bound.PERMITS_ENV: "0"}) is None
    four = permits_from_env({bound.PERMITS_ENV: " 4 "})
    assert four is not None and four.limit == 4
    for wrong in ("-1", "two", "1.5"):
        with pytest.raises(Invalid, match=bound.PERMITS_ENV):
            permits_from_env({bound.PERMITS_ENV: wrong})
