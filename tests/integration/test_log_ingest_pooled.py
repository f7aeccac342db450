"""Ingest writing the channel log through a real PgBouncer (session and transaction mode;
issue 43): four senders at once feed one channel with two destinations, one a single stream and
one with four lanes (five patients), ingest and both workers connected through the pooler (the
workers poll: no LISTEN behind a transaction pooler). Each message is stored once, in the log;
each destination gets every message once, the single stream in the log's order and the lanes in
each patient's order; their rows are slim rows of the log."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.testing import MllpReceiver
from tests.support import pgbouncer
from tests.support.ingest import sender
from tests.support.pipeline import QUICK_LEASE, control_ids, register, worker, worker_config

pytestmark = pytest.mark.skipif(bool(pgbouncer.missing()), reason=str(pgbouncer.missing()))

ONE, LANES = "ward/one", "ward/lanes"
COUNT = 60


def adt(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|PL{n:04d}|P|2.5\r".encode()
        + f"PID|1||MRN-{n % 5}^^^HOSP^MR||POOL^PAT\r".encode()
    )


def patient(control_id: str) -> int:
    return int(control_id[2:]) % 5


async def test_ingest_through_the_pooler_stores_once_and_each_destination_keeps_its_order(
    pooled: str, fresh_db: str
) -> None:
    register(fresh_db, ONE, "adt")
    register(fresh_db, LANES, "adt")
    config = IngestConfig(
        listeners=[ListenerConfig("adt", "127.0.0.1", 0)],
        refresh_seconds=0.2,
        store_timeout=5.0,
        shutdown_grace=2.0,
    )
    sent = [adt(n) for n in range(COUNT)]
    options = {"lease": QUICK_LEASE, "poll_seconds": 0.2}
    async with (
        MllpReceiver() as rx_one,
        MllpReceiver() as rx_lanes,
        Ingest(config, dsn=pooled) as running,
        worker(worker_config(ONE, rx_one.port, channel="adt"), pooled, **options),
        worker(worker_config(LANES, rx_lanes.port, channel="adt", lanes=4), pooled, **options),
    ):

        async def feed(k: int) -> None:
            async with sender(running) as client:
                for payload in sent[k::4]:
                    await client.send(payload)  # AA, or DeliveryError

        await asyncio.gather(*(feed(k) for k in range(4)))
        await rx_one.wait_for(COUNT, timeout=60)
        await rx_lanes.wait_for(COUNT, timeout=60)
        await asyncio.sleep(0.5)  # a duplicate would have come by now
    with psycopg.connect(fresh_db) as conn:
        logged = [r[0] for r in conn.execute("SELECT control_id FROM inturn_message ORDER BY id")]
        rows = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE payload IS NULL AND message_id IS NOT NULL)"
            " FROM inturn_delivery"
        ).fetchone()
    assert sorted(logged) == sorted(control_ids(sent))  # each message once, in the log
    assert rows == (2 * COUNT, 2 * COUNT)  # every row a slim row naming it
    assert control_ids(rx_one.received) == logged  # the single stream: the log's order
    got = control_ids(rx_lanes.received)
    assert sorted(got) == sorted(logged)
    for p in range(5):  # the lanes: each patient's messages in the log's order
        assert [c for c in got if patient(c) == p] == [c for c in logged if patient(c) == p]
