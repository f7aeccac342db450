"""Lanes benchmark: a backlog drained with ``spec.lanes.count`` 1 and 8, per-key order checked.

    .venv/bin/python bench/lanes.py [--dsn DSN] [--messages 10000] [--patients 1000]

A backlog of ``--messages`` ADT messages over ``--patients`` patients (each message names one
patient drawn at random, seeded), with an A40 merge every ``--merge-every`` messages in the
merging runs (the surviving patient in PID-3, the retired one in MRG-1: the patient of the
message just before it, so that every merge must wait for a message in flight), is enqueued in a
fresh database; then one ``inturn worker -f <manifest>`` process drains it into a local MLLP
receiver that answers each message after ``--delay`` seconds (20 ms), on each of its connections
independently, and accepts at most 8 connections at once (a ninth is closed unanswered).

Runs: ``count 1`` (the single stream, over the first ``--baseline-messages`` of the backlog:
one message per round trip, so its rate does not depend on the backlog's length, and a merge
costs it what any message costs), ``count 8`` without merges, ``count 8`` with merges. A rate is
messages over the seconds from the first arrival at the receiver to the queue being empty.

The receiver applies a message when it answers AA, in whatever order its connections finish:
``per_key_reorders`` counts, over every patient key, the arrivals of a message before an
arrival of an earlier message of that key (0 is the promise; a merge is in both of its
patients' sequences, so one that overtook either would count); ``duplicated`` counts arrivals
beyond the first of a message. Prints figures and asserts nothing about time; the last line is
the JSON of ``bench/figures.py``. The database is ``--dsn`` / ``INTURN_DSN`` (a server: the
benchmark creates and drops its own databases), else an embedded Postgres (``pgserver``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delivery import fresh_database, postgres_server, store_in_log
from figures import emit, parse_args
from psycopg import AsyncConnection

from inturn.worker.hl7.pid import index_keys
from inturn.worker.store import queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver

INTURN = Path(sys.executable).with_name("inturn")
NAMESPACE, NAME = "bench", "lanes"
DESTINATION = f"{NAMESPACE}/{NAME}"
#: Rows per enqueue transaction.
ENQUEUE_BATCH = 500
#: Connections the receiver accepts at once.
RECEIVER_CONNECTIONS = 8


def adt(n: int, patient: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261201080000||ADT^A08|L{n:07d}|P|2.5\r"
        f"EVN|A08|20261201080000\r"
        f"PID|1||P{patient:05d}^^^HOSP^MR||DOE^JANE||19800101|F\r"
        f"PV1|1|I|WARD^{n % 40}^1\r"
    ).encode()


def merge(n: int, survivor: int, retired: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261201080000||ADT^A40|L{n:07d}|P|2.5\r"
        f"EVN|A40|20261201080000\r"
        f"PID|1||P{survivor:05d}^^^HOSP^MR||DOE^JANE||19800101|F\r"
        f"MRG|P{retired:05d}^^^HOSP^MR\r"
    ).encode()


def backlog(count: int, patients: int, merge_every: int) -> list[NewItem]:
    """The messages, in enqueue order (a merge every ``merge_every``; 0: none)."""
    pick = random.Random(30)
    items = []
    previous = 0
    for n in range(count):
        patient = pick.randrange(patients)
        if merge_every and n % merge_every == merge_every - 1 and patient != previous:
            payload, kind = merge(n, patient, previous), "ADT^A40"
        else:
            payload, kind = adt(n, patient), "ADT^A08"
        items.append(NewItem(DESTINATION, "adt", f"L{n:07d}", kind, payload))
        previous = patient
    return items


class Receiver(MllpReceiver):
    """Answers each message after ``delay`` seconds, each connection on its own; applies a
    message when it answers (AA); accepts at most :data:`RECEIVER_CONNECTIONS` at once."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay_seconds = delay
        self.applied: list[str] = []
        self.first_at: float | None = None
        self.open = 0
        self.refused = 0

    def answer(self, payload: bytes) -> bytes:
        if self.first_at is None:
            self.first_at = time.perf_counter()
        self.applied.append(payload.split(b"|", 10)[9].decode())
        return super().answer(payload)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= RECEIVER_CONNECTIONS:
            self.refused += 1
            writer.transport.abort()
            return
        self.open += 1
        try:
            await super()._handle(reader, writer)
        finally:
            self.open -= 1


@dataclass
class Run:
    label: str
    lanes: int
    messages: int
    seconds: float = 0.0
    reorders: int = 0
    duplicated: int = 0
    capped: bool = False

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def check(items: Sequence[NewItem], applied: Sequence[str]) -> tuple[int, int]:
    """``(per_key_reorders, duplicated)`` of the receiver's applied order."""
    order = {item.control_id: i for i, item in enumerate(items)}
    keys = {item.control_id: index_keys(item.payload) for item in items}
    newest: dict[str, int] = {}
    reorders = 0
    for cid in applied:
        position = order[cid]
        for key in keys[cid]:
            if newest.get(key, -1) > position:
                reorders += 1
            newest[key] = max(newest.get(key, -1), position)
    return reorders, len(applied) - len(set(applied))


def manifest(directory: Path, port: int, lanes: int) -> Path:
    path = directory / "destination.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        f"metadata: {{name: {NAME}, namespace: {NAMESPACE}}}\n"
        "spec:\n"
        "  channel: adt\n"
        f"  sender: {{mllp: {{host: 127.0.0.1, port: {port}}}}}\n"
        "  retry: {maxAttempts: 0}\n"
        "  idleSeconds: 1\n"
        f"  lanes: {{count: {lanes}}}\n"
    )
    return path


async def drain(server_dsn: str, run: Run, items: Sequence[NewItem], args: Any) -> None:
    """Enqueue ``items``, drain them with ``run.lanes`` lanes, and time it."""
    with fresh_database(server_dsn, "lanes") as dsn, tempfile.TemporaryDirectory() as tmp:
        migrate(dsn)
        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            if args.store == "log":  # as ingest stores them: the worker pulls them
                await store_in_log(conn, items)
            else:
                for i in range(0, len(items), ENQUEUE_BATCH):
                    await queue.enqueue(conn, items[i : i + ENQUEUE_BATCH])
        async with (
            Receiver(args.delay) as rx,
            await AsyncConnection.connect(dsn, autocommit=True) as conn,
        ):
            path = manifest(Path(tmp), rx.port, run.lanes)
            env = {**os.environ, "INTURN_DSN": dsn}
            log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
            proc = await asyncio.create_subprocess_exec(
                *(str(INTURN), "worker", "-f", str(path)),
                *("--http-host", "127.0.0.1", "--http-port", "0", "--log-level", "WARNING"),
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
            deadline = time.perf_counter() + args.cap
            try:
                while time.perf_counter() < deadline:
                    if len(set(rx.applied)) >= len(items) and not await queue.blocked(
                        conn, DESTINATION
                    ):
                        break
                    if proc.returncode is not None:
                        break
                    await asyncio.sleep(0.02)
                else:
                    run.capped = True
                end = time.perf_counter()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                log.seek(0)
                tail = log.read().decode(errors="replace").strip()[-1500:]
                log.close()
            if proc.returncode not in (0, -signal.SIGTERM) or run.capped:
                print(f"  ({run.label}: worker exit {proc.returncode}:)\n{tail}", file=sys.stderr)
            if rx.first_at is not None:
                run.seconds = end - rx.first_at
            run.messages = len(set(rx.applied))
            run.reorders, run.duplicated = check(items, rx.applied)
            if rx.refused:
                print(f"  ({run.label}: the receiver closed {rx.refused} extra connection(s))")


async def main_async(args: argparse.Namespace) -> int:
    with postgres_server(args.dsn or os.environ.get("INTURN_DSN")) as (server, _):
        plain = backlog(args.messages, args.patients, 0)
        merged = backlog(args.messages, args.patients, args.merge_every)
        runs = [
            (Run("count 1", 1, args.baseline_messages), merged[: args.baseline_messages]),
            (Run("count 8", 8, args.messages), plain),
            (Run("count 8, merges", 8, args.messages), merged),
        ]
        print(
            f"lanes: {args.messages:,} messages over {args.patients:,} patients, a merge every"
            f" {args.merge_every} in the merging runs; receiver answers after"
            f" {args.delay * 1000:.0f} ms, at most {RECEIVER_CONNECTIONS} connections"
        )
        for run, items in runs:
            await drain(server, run, items, args)
            print(
                f"  {run.label:<16} {run.messages:>7,} messages in {run.seconds:7.1f}s:"
                f" {run.rate:8.1f}/s, {run.reorders} per-key reorder(s),"
                f" {run.duplicated} duplicate(s){' (capped)' if run.capped else ''}"
            )
    base, eight, merging = (r for r, _ in runs)

    def speedup(run: Run) -> float | None:
        return round(run.rate / base.rate, 2) if base.rate and run.rate else None

    print(
        f"  speedup with 8 lanes: {speedup(eight)}x (target 6x); with merges: {speedup(merging)}x"
        " (target 5x)"
    )
    emit(
        "lanes",
        {
            "messages": args.messages,
            "patients": args.patients,
            "merge_every": args.merge_every,
            "receiver_delay_ms": round(args.delay * 1000, 1),
            "rate_1_lane": round(base.rate, 1),
            "rate_8_lanes": round(eight.rate, 1),
            "rate_8_lanes_with_merges": round(merging.rate, 1),
            "speedup_8_lanes": speedup(eight),
            "speedup_8_lanes_with_merges": speedup(merging),
            "per_key_reorders": sum(r.reorders for r, _ in runs),
            "duplicated": sum(r.duplicated for r, _ in runs),
        },
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="a Postgres server (default INTURN_DSN, else embedded)")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--patients", type=int, default=1_000)
    parser.add_argument("--merge-every", type=int, default=100)
    parser.add_argument(
        "--baseline-messages",
        type=int,
        default=2_000,
        help="messages of the count 1 run (its rate is per message; default 2,000)",
    )
    parser.add_argument("--delay", type=float, default=0.02, help="receiver's answer, seconds")
    parser.add_argument(
        "--store",
        choices=["log", "rows"],
        default="log",
        help="messages stored once in the channel log as ingest stores them (default; the"
        " worker pulls them), or as rows holding their own payload (before issue 43)",
    )
    parser.add_argument("--cap", type=float, default=300.0, help="longest drain, seconds")
    args = parse_args(
        parser,
        argv,
        {"messages": 200, "patients": 20, "merge_every": 10, "baseline_messages": 40,
         "delay": 0.005, "cap": 60.0},
    )  # fmt: skip
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
