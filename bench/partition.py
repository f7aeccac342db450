"""Partition benchmark: how long a worker cut off from Postgres keeps its destination.

    .venv/bin/python bench/partition.py [--runs 3] [--messages 10]

Needs root, ``ip`` and ``nft`` and the PostgreSQL 15 binaries. Postgres runs in a network
namespace of its own, worker A (``inturn worker``) in another (the "node"), worker B (the
replacement) on the host waiting for the destination's lease (``tests/support/netpart.py``,
``tests/support/pgcluster.py``). Each run: A drains ``--messages`` messages and sits idle
holding the lease; the node is cut off from Postgres by nftables drop rules (no RST, no ICMP);
``--messages`` more are enqueued from the host. Printed per run, in seconds from the cut: the
server ending A's session (its advisory lock free), A's ``/readyz`` answering 503, B holding the
lease (after A's lease expired unrenewed: the fencing rule's takeover bound, lease lifetime plus
a standby's interval, 50 s by default), and B delivering the first message enqueued after the
cut; then the copies delivered (duplicates) and the order. Prints figures and asserts nothing
about time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from figures import emit, parse_args
from psycopg import AsyncConnection

from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.spec.config import lease_settings
from inturn.worker.spec.destination import render_worker_config
from inturn.worker.store import queue
from inturn.worker.store.connect import SESSION_LOSS_BOUND_SECONDS
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from tests.support.netpart import (
    DEST,
    HOST_FOR_NODE,
    NODE_FOR_HOST,
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


async def until(check: object, timeout: float) -> float:
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.05)
    return time.monotonic() - start


async def one_run(messages: int, folder: Path) -> dict[str, float]:
    part = Partition()
    cluster: Cluster | None = None
    node: subprocess.Popen[bytes] | None = None
    try:
        cluster = Cluster(listen=f"{PG_FOR_HOST},{PG_FOR_NODE}", netns=part.pg)
        host_dsn = cluster.primary.dsn(PG_FOR_HOST)
        migrate(host_dsn)
        async with MllpReceiver(host=HOST_FOR_NODE) as receiver:
            cfg = config(receiver.port)
            (folder / "worker.json").write_text(json.dumps(render_worker_config(cfg)))
            node = subprocess.Popen(
                [
                    *("ip", "netns", "exec", part.node),
                    str(Path(sys.executable).with_name("inturn")),
                    *("worker", "--config", str(folder / "worker.json")),
                    *("--http-host", NODE_FOR_HOST, "--http-port", str(NODE_HTTP_PORT)),
                ],
                env={
                    **os.environ,
                    "INTURN_DSN": f"host={PG_FOR_NODE} port={cluster.primary.port} user=postgres",
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await until(lambda: probe("/readyz") == 200, 60)
            async with await AsyncConnection.connect(host_dsn, autocommit=True) as conn:
                await queue.enqueue(
                    conn,
                    [
                        NewItem(DEST, "adt", f"S{n:03d}", "ADT^A01", message(n))
                        for n in range(messages)
                    ],
                )
            await receiver.wait_for(messages, timeout=30)
            assert isinstance(cfg.sender, MllpSenderConfig)
            b = DestinationWorker(cfg, host_dsn, MllpSender(cfg.sender), PrometheusObserver())
            stop = asyncio.Event()
            task = asyncio.create_task(b.run(stop))
            try:
                await asyncio.sleep(6.0)  # A has been idle a while: the quiet case
                cut = time.monotonic()
                part.cut()
                async with await AsyncConnection.connect(host_dsn, autocommit=True) as conn:
                    await queue.enqueue(
                        conn,
                        [
                            NewItem(DEST, "adt", f"S{n:03d}", "ADT^A01", message(n))
                            for n in range(messages, 2 * messages)
                        ],
                    )
                figures: dict[str, float] = {}
                pending = {
                    "session ended on the server": lambda: sessions_from_node(host_dsn) == 0,
                    "A's /readyz 503": lambda: probe("/readyz") == 503,
                    "B holds the lease": lambda: b.state.lock_held,
                    "B delivered the first new one": lambda: len(receiver.received) > messages,
                }
                async with asyncio.timeout(600):
                    while pending:
                        for name, check in list(pending.items()):
                            if check():
                                figures[name] = time.monotonic() - cut
                                del pending[name]
                        await asyncio.sleep(0.05)
                await receiver.wait_for(2 * messages, timeout=60)
                await asyncio.sleep(1.0)
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
        ids = [p.split(b"|")[9] for p in receiver.received]
        distinct = list(dict.fromkeys(ids))
        figures["duplicates"] = len(ids) - len(distinct)
        figures["in order"] = float(distinct == sorted(distinct))
        return figures
    finally:
        if node is not None:
            node.terminate()
            node.wait(20)
        if cluster is not None:
            cluster.close()
        part.close()


def _stop_on_sigterm(*_: object) -> None:
    raise SystemExit(143)  # so that the namespaces and servers are removed on the way out


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=10)
    args = parse_args(parser, argv, {"runs": 1, "messages": 3})
    reason = no_cluster() or no_partition()
    if reason:
        print(f"partition: skipped ({reason})")
        emit("partition", {"skipped": reason})
        return
    bound = lease_settings(os.environ).takeover_bound_seconds()
    print(
        f"partition: worker A cut off from Postgres; stated takeover bound {bound:g} s (lease),"
        f" session loss {SESSION_LOSS_BOUND_SECONDS} s"
    )
    runs = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as folder:
            figures = await one_run(args.messages, Path(folder))
        runs.append(figures)
        shown = ", ".join(
            f"{k} {v:.1f} s" for k, v in figures.items() if k not in ("duplicates", "in order")
        )
        print(f"   run {run}: {shown}")
        print(
            f"          duplicates {figures['duplicates']:.0f},"
            f" in order {bool(figures['in order'])}"
        )

    def worst(key: str) -> float | None:
        values = [r[key] for r in runs if key in r]
        return round(max(values), 2) if values else None

    emit(
        "partition",
        {
            "bound_s": bound,
            "session_bound_s": SESSION_LOSS_BOUND_SECONDS,
            "session_ended_s": worst("session ended on the server"),
            "readyz_503_s": worst("A's /readyz 503"),
            "replacement_locked_s": worst("B holds the lease"),
            "replacement_delivered_s": worst("B delivered the first new one"),
            "duplicates": sum(int(r["duplicates"]) for r in runs),
            "in_order": all(bool(r["in order"]) for r in runs),
        },
    )


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    asyncio.run(main())
