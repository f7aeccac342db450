"""Recovery after a Postgres outage, against a server of the test's own that it stops and starts
(:class:`inturn.worker.testing.ScratchPostgres`): ingest answers AE while the server is away
and AA again once it is back, and a worker resumes its deliveries, both without a restart of
inturn. How soon is measured by ``bench/recovery.py``; the caps that make it soon whatever the
outage's length are held here as values."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import aiohttp
import psycopg
import pytest
from psycopg_pool import PoolTimeout

from inturn.worker.drain.backoff import backoff_seconds
from inturn.worker.drain.runner import RECONNECT_BASE_SECONDS, RECONNECT_MAX_SECONDS
from inturn.worker.ingest.service import Ingest
from inturn.worker.store.migrate import migrate
from inturn.worker.store.pool import (
    POOL_WARNINGS,
    RECONNECT_MAX_DELAY_SECONDS,
    CappedAttempt,
    Pool,
    PoolWarningLimiter,
)
from inturn.worker.testing import POSTGRES_BIN, MllpReceiver, ScratchPostgres
from tests.support.ingest import HOST, Client, config, msg
from tests.support.lab import all_delivered, enqueue, running
from tests.support.lab import config as worker_config
from tests.support.pipeline import control_ids, register

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [
    pytest.mark.skipif(
        not (POSTGRES_BIN / "initdb").exists(),
        reason=f"no PostgreSQL server programs in {POSTGRES_BIN}",
    ),
    pytest.mark.slow,
]

#: Seconds the server stays down: long enough for the library's doubling delay to reach 8 s.
OUTAGE_SECONDS = 10.0


@pytest.fixture
def scratch() -> Iterator[ScratchPostgres]:
    with ScratchPostgres() as server:
        migrate(server.dsn)
        yield server


def test_pool_reconnect_delays_stop_growing_at_two_seconds() -> None:
    attempt = CappedAttempt(timeout=300)
    delays = []
    for second in range(20):
        attempt.update_delay(float(second * 2))
        delays.append(attempt.delay)
    assert delays[0] <= 1.1  # the library's first delay (1 s with 10% jitter) is kept
    assert max(delays) == RECONNECT_MAX_DELAY_SECONDS == 2.0
    assert delays[-1] == 2.0


def test_worker_reconnect_backoff_stops_growing_at_two_seconds() -> None:
    delays = [
        backoff_seconds(n, RECONNECT_BASE_SECONDS, RECONNECT_MAX_SECONDS) for n in range(1, 50)
    ]
    assert delays[:3] == [0.5, 1.0, 2.0]
    assert max(delays) == 2.0


async def send_until_aa(client: Client, control_id: str, limit: float = 60.0) -> list[str]:
    """Send ``control_id`` again and again (each answer awaited) until AA; the codes seen."""
    codes: list[str] = []
    async with asyncio.timeout(limit):
        while not codes or codes[-1] != "AA":
            codes.append((await client.send(msg(control_id))).code)
            if codes[-1] != "AA":
                await asyncio.sleep(0.2)
    return codes


async def ready(port: int) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"http://{HOST}:{port}/readyz") as r:
        return r.status


async def test_ingest_answers_aa_again_after_postgres_returns(scratch: ScratchPostgres) -> None:
    register(scratch.dsn, "hospital/adt-out", "adt")
    cfg = config(store_timeout=1.5, refresh_seconds=0.5)
    async with Ingest(cfg, dsn=scratch.dsn) as ingest:
        c = await Client.connect(ingest.mllp_ports["adt"])
        assert (await c.send(msg("BEFORE"))).code == "AA"
        scratch.stop()
        assert (await c.send(msg("DURING"))).code == "AE"
        await asyncio.sleep(OUTAGE_SECONDS)
        assert (await c.send(msg("DURING"))).code == "AE"
        scratch.start()
        back = time.monotonic()
        codes = await send_until_aa(c, "AFTER")
        took = time.monotonic() - back
        async with asyncio.timeout(30):
            while await ready(ingest.ops_port or 0) != 200:
                await asyncio.sleep(0.2)
        await c.close()
    print(f"first AA {took:.1f} s after the server was back ({len(codes)} tries)")
    assert codes[-1] == "AA"
    with psycopg.connect(scratch.dsn, autocommit=True) as conn:
        stored = [r[0] for r in conn.execute("SELECT control_id FROM inturn_message ORDER BY id")]
    assert stored == ["BEFORE", "AFTER"]  # nothing of the AE'd attempts was kept


async def test_worker_resumes_delivering_after_postgres_returns(scratch: ScratchPostgres) -> None:
    async with MllpReceiver() as rx, running(worker_config(rx.port), scratch.dsn):
        await enqueue(scratch.dsn, [1])
        async with asyncio.timeout(20):
            while not await all_delivered(scratch.dsn, 1):  # its mark committed
                await asyncio.sleep(0.05)
        scratch.stop()
        await asyncio.sleep(OUTAGE_SECONDS)
        scratch.start()
        await enqueue(scratch.dsn, [2, 3])
        async with asyncio.timeout(60):
            while not await all_delivered(scratch.dsn, 3):
                await asyncio.sleep(0.1)
    assert control_ids(rx.received) == ["MSG00001", "MSG00002", "MSG00003"]


def pool_warnings(caplog: pytest.LogCaptureFixture, pool: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "psycopg.pool" and r.levelno >= logging.WARNING and pool in r.getMessage()
    ]


async def test_a_pool_warns_once_per_interval_during_an_outage(
    scratch: ScratchPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    """A real outage of about 7 s: the pool tries to reconnect every 2 s (at least 3 tries,
    each a warning from psycopg_pool), and the log holds ONE line for it; the next after the
    interval says how many were dropped."""
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    limiter = POOL_WARNINGS
    limiter._seen.clear()
    async with Pool(scratch.dsn, min_size=2, max_size=2, name="outage-test", open=False) as pool:
        await pool.wait(timeout=10)
        scratch.stop()
        await pool.check()  # finds both connections dead: the pool starts replacing them
        tries = 0
        async with asyncio.timeout(30):
            end = time.monotonic() + 7.0
            while time.monotonic() < end:
                with contextlib.suppress(PoolTimeout):
                    async with pool.connection(timeout=0.5):
                        pass
                tries += 1
        dropped = sum(n for (_, name), (_, n) in limiter._seen.items() if name == "outage-test")
        lines = pool_warnings(caplog, "outage-test")
        scratch.start()
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(PoolTimeout, psycopg.OperationalError):
                    async with pool.connection(timeout=1) as conn:
                        await conn.execute("SELECT 1")
                        break
    connecting = [line for line in lines if line.startswith("error connecting in 'outage-test'")]
    print(f"{tries} requests, {len(lines)} warning line(s), {dropped} dropped")
    assert len(connecting) == 1
    assert dropped >= 3  # what the log would have held without the limiter, beyond the first


def test_the_limiter_passes_one_per_pool_and_kind_per_interval() -> None:
    now = [0.0]
    limiter = PoolWarningLimiter(interval=30.0, clock=lambda: now[0])

    def record(template: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("psycopg.pool", logging.WARNING, "x", 1, template, args, None)

    passed = []
    for second in range(0, 65, 2):  # a try every 2 s for 64 s, in two pools
        now[0] = float(second)
        for pool in ("ingest-write", "ingest-read"):
            r = record("error connecting in %r: %s", pool, "refused")
            if limiter.filter(r):
                passed.append((second, r.getMessage()))
    assert passed == [
        (0, "error connecting in 'ingest-write': refused"),
        (0, "error connecting in 'ingest-read': refused"),
        (30, "error connecting in 'ingest-write': refused (14 more like it in the last 30 s)"),
        (30, "error connecting in 'ingest-read': refused (14 more like it in the last 30 s)"),
        (60, "error connecting in 'ingest-write': refused (14 more like it in the last 30 s)"),
        (60, "error connecting in 'ingest-read': refused (14 more like it in the last 30 s)"),
    ]
    info = logging.LogRecord("psycopg.pool", logging.INFO, "x", 1, "growing", (), None)
    assert all(limiter.filter(info) for _ in range(3))  # below WARNING: untouched
