"""The ingest memory budget as values: who gets room, who waits, who is evicted and answered
busy, and the limit formula the chart and the sizing guide use."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inturn.worker.hl7.mllp import Dropped, Frame, FrameReader, frame
from inturn.worker.ingest.budget import (
    BASE_BYTES,
    CONNECTION_BYTES,
    COPIES,
    Busy,
    MemoryBudget,
    budget_for,
    cgroup_memory_limit,
    limit_for,
    memory_limit,
)

MIB = 1024 * 1024


async def test_room_is_granted_while_it_lasts_and_given_back() -> None:
    budget = MemoryBudget(10)
    a, b = budget.hold(), budget.hold()
    await a.grow(6)
    await b.grow(4)
    assert (budget.used, budget.free) == (10, 0)
    a.trim(2)
    assert (a.held, budget.used) == (2, 6)
    a.release()
    b.release()
    assert budget.used == 0 and budget.peak == 10


async def test_a_reader_without_room_waits_until_room_is_given_back() -> None:
    budget = MemoryBudget(10)
    a, b = budget.hold(), budget.hold()
    await a.grow(8)
    waiting = asyncio.create_task(b.grow(5))
    await asyncio.sleep(0)
    assert not waiting.done() and budget.used == 8
    a.release()
    await waiting
    assert (b.held, budget.used) == (5, 5)


async def test_a_wait_that_runs_out_is_busy_and_frees_what_it_held() -> None:
    budget = MemoryBudget(10, wait_seconds=0.05)
    a, b = budget.hold(), budget.hold()
    await a.grow(6)
    await b.grow(3)
    with pytest.raises(Busy):
        await b.grow(3)
    assert (b.held, b.evicted, budget.used) == (0, True, 6)
    with pytest.raises(Busy):  # evicted until it lets go of its frame
        await b.grow(1)
    b.release()
    await b.grow(1)
    assert budget.used == 7


async def test_half_read_frames_never_wait_for_each_other_for_ever() -> None:
    """Twenty frames of 12 units each in a budget of 100: each takes what it can, then the
    oldest waiting frame gets the room of the youngest waiting ones (evicted: answered busy),
    so the oldest completes; nobody waits for room only the others hold."""
    budget = MemoryBudget(100, wait_seconds=30)
    holds = [budget.hold() for _ in range(20)]
    for h in holds:  # each frame's first 5 units: all fit
        await h.grow(5)
    assert budget.used == 100
    tasks = [asyncio.create_task(h.grow(7)) for h in holds]  # the rest of each frame
    await asyncio.sleep(0.01)
    done = [t for t in tasks if t.done() and t.exception() is None]
    busy = [t for t in tasks if t.done() and isinstance(t.exception(), Busy)]
    assert len(done) >= 1 and holds[0].held == 12  # the oldest frame got all of its room
    assert busy and all(not holds[tasks.index(t)].held for t in busy)
    assert budget.used <= budget.capacity
    for t in tasks:
        if not t.done():
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_grants_go_to_the_oldest_frame_first() -> None:
    budget = MemoryBudget(10, wait_seconds=5)
    first, second, third = budget.hold(), budget.hold(), budget.hold()
    await first.grow(10)
    older = asyncio.create_task(second.grow(6))
    await asyncio.sleep(0)
    younger = asyncio.create_task(third.grow(6))
    await asyncio.sleep(0)
    first.release()
    await older
    assert not younger.done()
    second.release()
    await younger
    assert third.held == 6


async def test_a_request_larger_than_the_budget_is_an_error() -> None:
    with pytest.raises(ValueError):
        await MemoryBudget(10).hold().grow(11)
    with pytest.raises(ValueError):
        MemoryBudget(0)


def test_the_limit_formula_and_the_budget_it_leaves_agree() -> None:
    assert limit_for(16 * MIB, 4) == BASE_BYTES + COPIES * 4 * 16 * MIB + MIB
    for size, count in ((16 * MIB, 1), (16 * MIB, 4), (1 * MIB, 50), (3 * MIB, 7)):
        assert budget_for(limit_for(size, count)) >= count * (size + CONNECTION_BYTES)
        assert limit_for(size, count) % MIB == 0
    assert budget_for(BASE_BYTES - 1) == 0
    assert memory_limit(300 * MIB) == 300 * MIB


def test_cgroup_limits_are_read_from_v2_and_v1_files(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("268435456\n")
    assert cgroup_memory_limit(tmp_path) == 268435456
    unlimited = tmp_path / "u"
    (unlimited / "memory").mkdir(parents=True)
    (unlimited / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (unlimited / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(unlimited) is None


def test_a_dropped_frame_keeps_its_head_and_ends_at_its_end_byte() -> None:
    reader = FrameReader(1000)
    payload = b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|X1|P|2.5\r" + b"Z" * 500
    wire = frame(payload)
    assert reader.feed(wire[:300]) == []
    assert reader.buffered_bytes == 299
    reader.drop(40)
    assert reader.dropping and reader.buffered_bytes == 40
    events = reader.feed(wire[300:] + frame(b"MSH|^~\\&|next"))
    assert events == [Dropped(payload[:40], len(payload)), Frame(b"MSH|^~\\&|next")]
    assert not reader.dropping


async def test_a_new_connection_is_served_before_waiting_frames() -> None:
    """A connection's own bytes come first: a waiting frame that began later gives its room up
    (and is answered busy), so new connections are not closed unanswered behind a crowd."""
    budget = MemoryBudget(10, wait_seconds=5)
    full, waiting = budget.hold(), budget.hold()
    await full.grow(6)
    await waiting.grow(4)
    stuck = asyncio.create_task(waiting.grow(3))
    await asyncio.sleep(0)
    connection = budget.hold(priority=True)
    await connection.grow(2)
    with pytest.raises(Busy):
        await stuck
    assert (connection.held, waiting.held, budget.used) == (2, 0, 8)
