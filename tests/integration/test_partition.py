"""A worker cut off from Postgres by a network partition (issue 18, item 8a).

The mechanism, asserted: every session carries server-side keepalive and user-timeout settings
(seen in ``pg_settings`` from the session itself) and the libpq ones; with the worker's node
cut off by nftables drop rules in a namespace of its own (no RST, no ICMP), the server ends its
session by itself and frees the advisory lock, the cut-off worker's ``/readyz`` turns, and a
replacement takes the lock and delivers everything, in order, at most one message twice.
The time it takes is measured by ``bench/partition.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.destination import render_worker_config
from inturn.worker.store import queue
from inturn.worker.store.connect import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_SECONDS,
    KEEPALIVE_INTERVAL_SECONDS,
    TCP_USER_TIMEOUT_MS,
    Pools,
    connect_worker,
)
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.netpart import (
    DEST,
    HOST_FOR_NODE,
    HOST_FOR_PG,
    NODE_FOR_HOST,
    NODE_FOR_PG,
    NODE_HTTP_PORT,
    PG_FOR_HOST,
    PG_FOR_NODE,
    Partition,
    config,
    message,
    probe,
    sessions_from_node,
)
from tests.support.netpart import missing as no_partition
from tests.support.pgcluster import Cluster
from tests.support.pgcluster import missing as no_cluster
from tests.support.pipeline import until as pipeline_until

#: The server-side settings and the values every session must carry.
SERVER_SIDE = {
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE_SECONDS),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_SECONDS),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}
#: The libpq (client-side) ones.
CLIENT_SIDE = {
    "keepalives": "1",
    "keepalives_idle": str(KEEPALIVE_IDLE_SECONDS),
    "keepalives_interval": str(KEEPALIVE_INTERVAL_SECONDS),
    "keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}
#: The cut-off worker's probe port (inside its own namespace, so never taken).
#: serial: a partition, waited out by the server's keepalives: alone, after the parallel part.
pytestmark = pytest.mark.serial

needs_cluster = pytest.mark.skipif(no_cluster() is not None, reason=str(no_cluster()))


@pytest.fixture(scope="module")
def tcp_server() -> Iterator[Cluster]:
    """A server reached over TCP (the settings mean nothing on a Unix socket)."""
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.close()


async def settings_of(conn: AsyncConnection[Any]) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(SERVER_SIDE),)
    )
    return {str(name): str(value) for name, value in await cur.fetchall()}


def client_side(conn: AsyncConnection[Any]) -> dict[str, str]:
    params = conn.info.get_parameters()
    return {k: params.get(k, "") for k in CLIENT_SIDE}


@needs_cluster
async def test_every_session_carries_the_session_loss_settings(tcp_server: Cluster) -> None:
    dsn = tcp_server.primary.dsn()
    worker_conn = await connect_worker(dsn)
    try:
        assert await settings_of(worker_conn) == SERVER_SIDE
        assert client_side(worker_conn) == CLIENT_SIDE
    finally:
        await worker_conn.close()
    async with await Pools.open(dsn, write_size=1, read_size=1) as pools:
        for pool in (pools.write, pools.read):
            async with pool.connection() as conn:
                assert await settings_of(conn) == SERVER_SIDE
                assert client_side(conn) == CLIENT_SIDE


@needs_cluster
async def test_a_dsn_keeps_its_own_values(tcp_server: Cluster) -> None:
    dsn = tcp_server.primary.dsn() + " keepalives_idle=7 options='-c tcp_keepalives_idle=7'"
    conn = await connect_worker(dsn)
    try:
        assert (await settings_of(conn))["tcp_keepalives_idle"] == "7"
        assert conn.info.get_parameters()["keepalives_idle"] == "7"
        assert (await settings_of(conn))["tcp_user_timeout"] == str(TCP_USER_TIMEOUT_MS)
    finally:
        await conn.close()


def lock_holders(host_dsn: str) -> list[str]:
    """The addresses of the sessions holding an advisory lock, each once: a worker holds its
    lease lock for the session and, inside a pull, the transaction's pull lock beside it."""
    with psycopg.connect(host_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a"
            " USING (pid) WHERE l.locktype = 'advisory' AND l.granted"
        ).fetchall()
    return [str(r[0]) for r in rows]


until = functools.partial(pipeline_until, every=0.2)


@pytest.mark.skipif(
    (no_cluster() or no_partition()) is not None, reason=str(no_cluster() or no_partition())
)
async def test_a_partitioned_worker_loses_its_lock_and_a_replacement_delivers(
    tmp_path: Path,
) -> None:
    part = Partition()
    cluster: Cluster | None = None
    node_worker: subprocess.Popen[bytes] | None = None
    try:
        cluster = Cluster(listen=f"{PG_FOR_HOST},{PG_FOR_NODE}", netns=part.pg)
        port = cluster.primary.port
        host_dsn = cluster.primary.dsn(PG_FOR_HOST)
        migrate(host_dsn)
        async with MllpReceiver(host=HOST_FOR_NODE) as receiver:
            cfg = config(receiver.port)
            (tmp_path / "worker.json").write_text(json.dumps(render_worker_config(cfg)))
            node_worker = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    part.node,
                    str(Path(sys.executable).with_name("inturn")),
                    "worker",
                    "--config",
                    str(tmp_path / "worker.json"),
                    "--http-host",
                    NODE_FOR_HOST,
                    "--http-port",
                    str(NODE_HTTP_PORT),
                ],
                env={**os.environ, "INTURN_DSN": f"host={PG_FOR_NODE} port={port} user=postgres"},
                stdout=(tmp_path / "node-worker.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            await until(lambda: probe("/readyz") == 200, 60)  # worker A holds the lock
            async with await AsyncConnection.connect(host_dsn, autocommit=True) as conn:
                await queue.enqueue(
                    conn,
                    [NewItem(DEST, "adt", f"S{n:03d}", "ADT^A01", message(n)) for n in range(10)],
                )
            await receiver.wait_for(10, timeout=30)
            assert lock_holders(host_dsn) == [NODE_FOR_PG]

            # worker B, the replacement, waits on the lock from the host
            assert isinstance(cfg.sender, MllpSenderConfig)
            replacement = DestinationWorker(
                cfg, host_dsn, MllpSender(cfg.sender), PrometheusObserver()
            )
            stop = asyncio.Event()
            task = asyncio.create_task(replacement.run(stop))
            try:
                await asyncio.sleep(1.0)
                assert not replacement.state.lock_held

                part.cut()  # the node is gone, as far as Postgres can tell
                async with await AsyncConnection.connect(host_dsn, autocommit=True) as conn:
                    await queue.enqueue(
                        conn,
                        [
                            NewItem(DEST, "adt", f"S{n:03d}", "ADT^A01", message(n))
                            for n in range(10, 20)
                        ],
                    )
                # the server ends the cut-off session by itself: the lock is free
                await until(lambda: sessions_from_node(host_dsn) == 0, 120)
                # the cut-off worker's readiness turns
                await until(lambda: probe("/readyz") == 503, 120)
                # the replacement takes the lock and delivers the rest
                await until(lambda: replacement.state.lock_held, 60)
                await receiver.wait_for(20, timeout=60)
                assert lock_holders(host_dsn) == [HOST_FOR_PG]
                assert probe("/readyz") == 503
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
        ids = [p.split(b"|")[9].decode() for p in receiver.received]
        distinct = list(dict.fromkeys(ids))
        assert distinct == [f"S{n:03d}" for n in range(20)]
        assert len(ids) - len(distinct) <= 1
    finally:
        if node_worker is not None:
            node_worker.terminate()
            try:
                node_worker.wait(10)
            except subprocess.TimeoutExpired:
                node_worker.kill()
                node_worker.wait(10)
        if cluster is not None:
            cluster.close()
        part.close()


@pytest.mark.skipif(
    (no_cluster() or no_partition()) is not None, reason=str(no_cluster() or no_partition())
)
async def test_a_network_cut_of_the_database_alone_sends_nothing_twice(tmp_path: Path) -> None:
    """Issue 40, part 2: the worker's node cut off from Postgres alone (the receiver still
    reached) while it drains to a receiver that holds each ACK a moment: the delivered mark of
    the message acknowledged as the cut began is lost with the session (the server ends it by
    itself), the worker remembers the ACK, and once the network heals it writes that mark
    before it sends anything. The receiver gets every message once, in order."""
    total = 30
    part = Partition()
    cluster: Cluster | None = None
    node_worker: subprocess.Popen[bytes] | None = None
    log_path = tmp_path / "node-worker.log"
    try:
        cluster = Cluster(listen=f"{PG_FOR_HOST},{PG_FOR_NODE}", netns=part.pg)
        port = cluster.primary.port
        host_dsn = cluster.primary.dsn(PG_FOR_HOST)
        migrate(host_dsn)
        async with await AsyncConnection.connect(host_dsn, autocommit=True) as conn:
            await queue.enqueue(
                conn,
                [NewItem(DEST, "adt", f"S{n:03d}", "ADT^A01", message(n)) for n in range(total)],
            )
        async with MllpReceiver(host=HOST_FOR_NODE) as receiver:
            receiver.delay_seconds = 0.5  # a message at the receiver nearly all the time
            cfg = config(receiver.port)
            (tmp_path / "worker.json").write_text(json.dumps(render_worker_config(cfg)))
            node_worker = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    part.node,
                    str(Path(sys.executable).with_name("inturn")),
                    "worker",
                    "--config",
                    str(tmp_path / "worker.json"),
                    "--http-host",
                    NODE_FOR_HOST,
                    "--http-port",
                    str(NODE_HTTP_PORT),
                ],
                env={**os.environ, "INTURN_DSN": f"host={PG_FOR_NODE} port={port} user=postgres"},
                stdout=log_path.open("wb"),
                stderr=subprocess.STDOUT,
            )
            await receiver.wait_for(5, timeout=60)
            part.cut()  # Postgres is gone, as far as the node can tell; the receiver is not
            try:
                # the server ends the cut-off session by itself (keepalives, user timeout)
                await until(lambda: sessions_from_node(host_dsn) == 0, 120)
            finally:
                part.heal()

            def delivered() -> int:
                with psycopg.connect(host_dsn, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'"
                    ).fetchone()
                return int(row[0]) if row else 0

            await until(lambda: delivered() == total, 180)
        ids = [p.split(b"|")[9].decode() for p in receiver.received]
    finally:
        if node_worker is not None:
            node_worker.terminate()
            try:
                node_worker.wait(10)
            except subprocess.TimeoutExpired:
                node_worker.kill()
                node_worker.wait(10)
        if cluster is not None:
            cluster.close()
        part.close()
    assert ids == [f"S{n:03d}" for n in range(total)]  # once each, in order: no duplicate
    said = log_path.read_text(errors="replace")
    assert "receiver had acknowledged" in said  # the cut did lose a mark, and it was kept
