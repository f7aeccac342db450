"""A bound on what a peer creates holds across restarts and replicas (issue 27, item 2).

Feed senders (MSH-3/MSH-4 of a per-sender feed) are a peer's to create. On a real Postgres,
through ingest's own recorder (``FeedRecorder``, each a process's memory): after restarts, with
several replicas flushing at once, with junk and real senders mixed, the table never holds more
than the bound; real senders keep their place ahead of newcomers; and the sweeper never raises
a sender seen once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.feeds.declare import parse_feeds
from inturn.worker.feeds.recorder import FeedRecorder
from inturn.worker.feeds.rules import feed_silent
from inturn.worker.store import feeds as store
from inturn.worker.store.connect import Pools

pytestmark = pytest.mark.store

FEEDS = parse_feeds({"feeds": [{"channel": "lab", "silentAfterSeconds": 600, "perSender": True}]})


@pytest_asyncio.fixture
async def pools(fresh_db: str) -> AsyncIterator[Pools]:
    async with await Pools.open(fresh_db, write_size=4, read_size=1) as opened:
        yield opened


async def replica(pools: Pools, bound: int) -> FeedRecorder:
    """A freshly started ingest's recorder (empty memory), its declaration written."""
    recorder = FeedRecorder(FEEDS, max_senders=bound)
    await recorder.declare(pools.write)
    return recorder


async def senders(conn: AsyncConnection[Any]) -> dict[str, int]:
    cur = await conn.execute(
        "SELECT sender, messages FROM inturn_feed_sender WHERE channel = 'lab'"
    )
    return {str(s): int(n) for s, n in await cur.fetchall()}


def over_bound() -> float:
    value = REGISTRY.get_sample_value(
        "inturn_ingest_feed_senders_over_bound_total", {"channel": "lab"}
    )
    return value or 0.0


async def send(recorder: FeedRecorder, names: list[str], times: int = 1) -> None:
    for _ in range(times):
        for name in names:
            recorder.seen("lab", name, "SITE")


@pytest.mark.parametrize("bound", [1, 10, 100])
async def test_restarts_cannot_multiply_the_bound(
    pools: Pools, conn: AsyncConnection[Any], bound: int
) -> None:
    real = [f"REAL{i}" for i in range(bound)]
    first = await replica(pools, bound)
    await send(first, real, times=2)  # real senders: heard more than once
    await first.flush(pools.write)
    before = over_bound()
    for restart in range(3):  # each restart forgets its memory; the table does not
        again = await replica(pools, bound)
        await send(again, [f"JUNK{restart}-{i}" for i in range(bound + 50)])
        await again.flush(pools.write)
    held = await senders(conn)
    assert len(held) == bound
    assert set(held) == {f"{r}^SITE" for r in real}  # real senders keep their place
    assert over_bound() - before == 3 * (bound + 50)


async def test_replicas_flushing_at_once_share_one_bound(
    pools: Pools, conn: AsyncConnection[Any]
) -> None:
    replicas = [await replica(pools, 40) for _ in range(4)]
    for n, r in enumerate(replicas):  # each its own junk, each under the bound in memory
        await send(r, [f"R{n}-{i}" for i in range(30)])
    await asyncio.gather(*(r.flush(pools.write) for r in replicas))
    assert len(await senders(conn)) == 40


async def test_a_newcomer_takes_the_place_of_noise_never_of_a_real_sender(
    pools: Pools, conn: AsyncConnection[Any]
) -> None:
    r = await replica(pools, 5)
    await send(r, ["REAL1", "REAL2"], times=3)
    await send(r, ["NOISE1", "NOISE2", "NOISE3"])
    await r.flush(pools.write)
    assert len(await senders(conn)) == 5
    r = await replica(pools, 5)  # a restart, then three newcomers
    await send(r, ["NEW1", "NEW2", "NEW3"])
    await r.flush(pools.write)
    held = await senders(conn)
    assert set(held) == {"REAL1^SITE", "REAL2^SITE", "NEW1^SITE", "NEW2^SITE", "NEW3^SITE"}
    assert (held["REAL1^SITE"], held["NEW1^SITE"]) == (3, 1)
    # a newcomer heard again becomes real and keeps its place too
    r = await replica(pools, 5)
    await send(r, ["NEW1"])
    await send(r, [f"LATE{i}" for i in range(10)])
    await r.flush(pools.write)
    held = await senders(conn)
    assert held["NEW1^SITE"] == 2 and {"REAL1^SITE", "REAL2^SITE"} <= set(held)
    assert len(held) == 5


async def test_the_sweeper_does_not_raise_a_sender_seen_once(
    pools: Pools, conn: AsyncConnection[Any]
) -> None:
    r = await replica(pools, 100)
    await send(r, ["REAL"], times=2)
    await send(r, [f"JUNK{i}" for i in range(50)])
    await r.flush(pools.write)
    await conn.execute("UPDATE inturn_feed SET last_message_at = now() - interval '1 hour'")
    await conn.execute("UPDATE inturn_feed_sender SET last_message_at = now() - interval '1 hour'")
    placed = await feed_silent(conn, limit=100, dry_run=False)
    assert sorted(p.item.record_key for p in placed.placements) == ["lab", "lab/REAL^SITE"]
    # nor does the console or the CLI list noise as a feed
    assert [(r.channel, r.sender) for r in await store.overview(conn)] == [
        ("lab", ""),
        ("lab", "REAL^SITE"),
    ]
