"""A destination on hold keeps its queue gauges exact (a new user's trial: a suspended queue
read 0 pending and 0 s in /metrics while 15 messages had waited for minutes), and ``queue
depth`` lists every held destination and every orphaned queue, even with nothing pending."""

from __future__ import annotations

import json

import psycopg
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.cli.formats import format_depth
from inturn.worker.store import delivery, reads, registry
from inturn.worker.store import lease as leases
from inturn.worker.testing import MllpReceiver
from tests.support import pipeline
from tests.support.channel_log import append

DEST = "hie/all39"
OTHER = "hie/gone"
CHANNEL = "adt"


def gauge(name: str, destination: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"destination": destination})


def age_log(dsn: str, seconds: int) -> None:
    """Make every log message of the channel ``seconds`` older (as if accepted then)."""
    with psycopg.connect(dsn, autocommit=True) as sync:
        sync.execute(
            "UPDATE inturn_message SET enqueued_at = enqueued_at - make_interval(secs => %s)",
            (seconds,),
        )


async def test_a_held_worker_counts_what_waits_pulled_or_not_and_says_it_is_held(
    fresh_db: str,
) -> None:
    pipeline.register(fresh_db, DEST, CHANNEL)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await registry.suspend(conn, DEST, who="me", why="trial")
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [DEST], 5, tag="P")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, DEST, "test", 1)
        assert (await delivery.pull(conn, DEST, CHANNEL, lease=lease)).count == 5  # pulled rows
        assert await delivery.next_head(conn, DEST, lease=lease) == (None, delivery.ON_HOLD)
        await leases.release(conn, lease)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [DEST], 10, tag="U")  # and log messages no pull has seen
    age_log(fresh_db, 150)
    async with MllpReceiver() as rx:
        config = pipeline.worker_config(DEST, rx.port, channel=CHANNEL)
        async with pipeline.worker(config, fresh_db):
            await pipeline.until(
                lambda: (
                    gauge("inturn_queue_pending", DEST) == 15.0
                    and gauge("inturn_destination_held", DEST) == 1.0
                )
            )
            age = gauge("inturn_queue_oldest_age_seconds", DEST)
            assert age is not None and 150.0 <= age < 200.0
            assert rx.received == []
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                assert await registry.resume(conn, DEST, who="me")
            await rx.wait_for(15)
            await pipeline.until(
                lambda: (
                    gauge("inturn_queue_pending", DEST) == 0.0
                    and gauge("inturn_destination_held", DEST) == 0.0
                )
            )
    assert gauge("inturn_queue_oldest_age_seconds", DEST) == 0.0
    assert len(rx.received) == 15


async def test_a_worker_held_mid_stream_counts_the_rest(fresh_db: str) -> None:
    """Held between two sends (the mark's next head says so): the rest is counted, not 0."""
    pipeline.register(fresh_db, DEST, CHANNEL)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [DEST], 40, tag="M")
    async with MllpReceiver() as rx:
        config = pipeline.worker_config(DEST, rx.port, channel=CHANNEL)
        async with pipeline.worker(config, fresh_db):
            await rx.wait_for(3)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                assert await registry.suspend(conn, DEST, who="me", why="trial")
            await pipeline.until(lambda: gauge("inturn_destination_held", DEST) == 1.0)
            await pipeline.until(
                lambda: gauge("inturn_queue_pending", DEST) == 40.0 - len(rx.received)
            )
            assert 0 < len(rx.received) < 40


async def test_depth_lists_a_held_empty_destination_and_an_orphaned_queue(
    fresh_db: str,
) -> None:
    pipeline.register(fresh_db, DEST, CHANNEL)
    pipeline.register(fresh_db, OTHER, CHANNEL)
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        append(sync, [OTHER], 2, tag="O")
    pipeline.register(fresh_db, OTHER, CHANNEL, deleted=True)  # its manifest is gone
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await registry.suspend(conn, DEST, who="inturn-local", why="a restore")
        rows = await reads.depth(conn)
        own = await reads.own_depth(conn, DEST)
    assert [(r.destination, r.pending, r.registered, r.held_by) for r in rows] == [
        (DEST, 0, True, "inturn-local"),
        (OTHER, 2, False, None),
    ]
    assert own is not None and [(r.pending, r.held_at is not None) for r in own] == [(0, True)]
    text = format_depth(rows)
    assert "queue resume (suspended by inturn-local)" in text.splitlines()[1]
    assert "never: orphaned (not registered)" in text.splitlines()[2]
    listed = json.loads(pipeline.cli(fresh_db, "queue", "depth", "--json").stdout)
    assert [(d["destination"], d["pending"], d["suspendedBy"], d["orphaned"]) for d in listed] == [
        (DEST, 0, "inturn-local", False),
        (OTHER, 2, None, True),
    ]
