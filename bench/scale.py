"""Benchmark what many destinations and a large table cost on one Postgres.

Five parts, each printing its figures:

1. **Idle workers**: N ``inturn worker`` processes (as the operator runs them: ``--config`` with a
   rendered configuration), each holding its destination's lock with nothing queued. Over a
   window longer than the safety poll: database transactions a second (``pg_stat_database`` of
   the bench database, less this script's own), CPU (``/proc/<pid>/stat``) and RSS per worker.
2. **One drain**: one worker drains 20,000 queued sample messages into an MLLP receiver; its
   rate and its RSS once drained.
3. **Ten drains at once**: 10 workers, 10 receivers, the same messages split between them,
   against one destination alone with the same number per destination: aggregate and
   per-destination rates, and where the time went (CPU seconds of the workers and of the
   Postgres backends per message, commits and WAL bytes per message).
4. **Ingest fan-out**: ``inturn ingest`` with 8 MLLP connections sending the samples, to one
   destination and to five; beside it pgbench's single-row INSERT of a sample-sized row at 8
   clients.
5. **Lookups at a million rows**: N pending rows of about 2 KB over 100 destinations, filled by
   SQL with their identifier index keys; ``inturn queue list --control-id``, ``--patient-id``,
   ``queue erase --patient-id --dry-run`` and ``queue depth`` as an operator runs them
   (subprocess wall time).

    python bench/scale.py [--dsn DSN] [--rows 1000000] [--idle-workers 20] [--skip PART ...]

Without ``--dsn`` (or ``INTURN_DSN``) an embedded Postgres is started (pgserver). Messages come
from ``INTURN_SAMPLES`` or ``../shared/samples/hl7``, else the demo's made-up ones
(``bench/corpus.py``). Asserts nothing; the last line is
``scale: idle tx/s per worker X; idle CPU per worker Y%; worker RSS Z MiB; fan-out-5 ratio R``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import corpus  # noqa: E402
import delivery  # noqa: E402  (the sibling benchmark's helpers)
import ingest as ingest_bench  # noqa: E402
from delivery import cpu_seconds  # noqa: E402
from figures import emit, parse_args  # noqa: E402

from inturn.worker.hl7.pid import lookup_key  # noqa: E402
from inturn.worker.senders.mllp import MllpSenderConfig  # noqa: E402
from inturn.worker.spec.config import RetryPolicy, WorkerConfig, to_dict  # noqa: E402
from inturn.worker.store import queue, reads  # noqa: E402
from inturn.worker.store.migrate import migrate  # noqa: E402
from inturn.worker.store.model import NewItem  # noqa: E402
from inturn.worker.testing import MllpReceiver  # noqa: E402

INTURN = Path(sys.executable).with_name("inturn")
PARTS = ("idle", "drain", "parallel", "ingest", "lookup")


# --- processes --------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Current resident set of process ``pid``, MiB."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def private_mib(pid: int) -> float:
    """Private anonymous memory of process ``pid`` (a Postgres backend), MiB."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def write_config(directory: Path, name: str, port: int, idle_seconds: int = 60) -> Path:
    """A rendered worker configuration, as the operator puts it in the worker's ConfigMap."""
    cfg = WorkerConfig(
        destination=f"bench/{name}",
        channel="bench",
        sender=MllpSenderConfig("127.0.0.1", port),
        retry=RetryPolicy(max_attempts=0),
        idle_seconds=idle_seconds,
    )
    path = directory / f"{name}.json"
    path.write_text(
        json.dumps({"apiVersion": "inturn.dev/v1alpha1", "kind": "WorkerConfig"} | to_dict(cfg))
    )
    return path


def start_worker(config: Path, dsn: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(INTURN), "worker", "--config", str(config), "--http-host", "127.0.0.1",
         "--http-port", "0", "--log-level", "WARNING"],
        env={**os.environ, "INTURN_DSN": dsn},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # never read: a pipe would stall a worker that logs a lot
    )  # fmt: skip


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def locks_held(conn: AsyncConnection[Any], count: int, timeout: float = 120) -> None:
    """Wait until ``count`` worker sessions hold their advisory locks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        row = await cur.fetchone()
        if row and row[0] >= count:
            return
        await asyncio.sleep(0.5)
    raise SystemExit(f"workers did not take their {count} locks in {timeout:.0f}s")


async def transactions(conn: AsyncConnection[Any]) -> int:
    """Committed + rolled back transactions of this database so far (after a stats flush)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database"
        " WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def backend_pids(conn: AsyncConnection[Any]) -> list[int]:
    """Every Postgres process: our database's backends and the server's own (walwriter...)."""
    cur = await conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() OR backend_type <> 'client backend'"
    )
    return [int(r[0]) for r in await cur.fetchall()]


# --- 1. idle ----------------------------------------------------------------------------------


async def worker_statements(conn: AsyncConnection[Any]) -> dict[int, Any]:
    """``{backend pid: query_start}`` of this database's worker sessions."""
    cur = await conn.execute(
        "SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'inturn-worker%%'"
    )
    return {int(r[0]): r[1] for r in await cur.fetchall()}


async def idle(dsn: str, workers: int, window: float) -> tuple[float, float, float]:
    """Return (statements/s per worker, CPU % of a core per worker, RSS MiB per worker).

    Each autocommit statement of a worker is one transaction. They are counted from the
    sessions' ``query_start`` sampled five times a second (an idle worker's statements are a
    minute apart), not from the database's transaction counter: on a shared server that counter
    also counts the reconnections of workers whose sessions someone else terminates, which are
    reported separately.
    """
    with tempfile.TemporaryDirectory(prefix="inturn-scale-") as tmp:
        configs = [write_config(Path(tmp), f"idle-{i:03d}", 9) for i in range(workers)]
        procs = [start_worker(c, dsn) for c in configs]
        try:
            async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
                await locks_held(conn, workers)
                await asyncio.sleep(5)  # past start-up: the first head queries, the first wait
                first = await worker_statements(conn)
                seen = {pid: {start} for pid, start in first.items()}
                cpu0, t0 = [cpu_seconds(p.pid) for p in procs], time.monotonic()
                while time.monotonic() - t0 < window:
                    await asyncio.sleep(0.2)
                    for pid, start in (await worker_statements(conn)).items():
                        seen.setdefault(pid, set()).add(start)
                cpu1, t1 = [cpu_seconds(p.pid) for p in procs], time.monotonic()
                last = await worker_statements(conn)
            elapsed = t1 - t0
            kept = [pid for pid in first if pid in last]
            statements = sum(len(seen[pid]) - 1 for pid in kept)
            tx_rate = statements / elapsed / max(len(kept), 1)
            reconnected = len(set(seen) - set(first))
            cpu = sum(b - a for a, b in zip(cpu0, cpu1, strict=True)) / elapsed / workers * 100
            rss = sum(rss_mib(p.pid) for p in procs) / workers
            backend = sum(private_mib(p) for p in last) / max(len(last), 1)
        finally:
            stop(procs)
    print(f"idle: {workers} workers over {elapsed:.0f} s (safety poll 60 s)")
    print(
        f"  transactions/s per worker      {tx_rate:.4f}  (target <= 0.05; {len(kept)} sessions"
        f" kept, {reconnected} reconnections after a session was terminated from outside)"
    )
    print(f"  CPU per worker                 {cpu:.4f}% of a core  (target <= 0.05%)")
    print(f"  RSS per worker                 {rss:.1f} MiB")
    print(f"  Postgres backend per worker    {backend:.1f} MiB private (RssAnon)")
    return tx_rate, cpu, rss


# --- 2 and 3. drains --------------------------------------------------------------------------


def messages(templates: Sequence[delivery.Template], name: str, count: int) -> list[NewItem]:
    out = []
    for n in range(count):
        t = templates[n % len(templates)]
        cid = f"{name[:6]}{n:08d}"
        out.append(
            NewItem(f"bench/{name}", "bench", cid, t.message_type, t.head + cid.encode() + t.tail)
        )
    return out


async def drains(
    dsn: str, templates: Sequence[delivery.Template], names: Sequence[str], per_destination: int
) -> dict[str, Any]:
    """Queue ``per_destination`` messages for each of ``names``, start one worker per name, time
    until every queue is empty. Returns rates, RSS after the drain and where the time went."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE inturn_delivery CASCADE")
        for name in names:
            items = messages(templates, name, per_destination)
            for i in range(0, len(items), 500):
                await queue.enqueue(conn, items[i : i + 500])
        await conn.execute("VACUUM ANALYZE inturn_delivery")
        await delivery.checkpoint(conn)
        receivers = [MllpReceiver() for _ in names]
        for rx in receivers:
            await rx.__aenter__()
            rx.received = delivery.TimedList()
        with tempfile.TemporaryDirectory(prefix="inturn-scale-") as tmp:
            configs = [
                write_config(Path(tmp), n, rx.port) for n, rx in zip(names, receivers, strict=True)
            ]
            started = time.perf_counter()
            procs = [start_worker(c, dsn) for c in configs]
            try:
                # Measured from the first delivery: worker start-up (imports, connect) excluded.
                while not any(rx.received for rx in receivers):
                    if time.perf_counter() - started > 120:
                        raise SystemExit("no worker delivered anything in 120 s")
                    await asyncio.sleep(0.005)
                tx0 = await transactions(conn)
                wal0 = await delivery.wal_counters(conn)
                pg = await backend_pids(conn)
                pg_cpu0 = sum(cpu_seconds(p) for p in pg)
                worker_cpu0 = sum(cpu_seconds(p.pid) for p in procs)
                while any(len(rx.received) < per_destination for rx in receivers):
                    if time.perf_counter() - started > 900:
                        raise SystemExit("drain did not finish in 900 s")
                    await asyncio.sleep(0.02)
                while await reads.pending_destinations(conn):  # the last delivered marks
                    await asyncio.sleep(0.02)
                worker_cpu = sum(cpu_seconds(p.pid) for p in procs) - worker_cpu0
                rss = [rss_mib(p.pid) for p in procs]
                pg_now = set(pg) | set(await backend_pids(conn))
                pg_cpu = sum(cpu_seconds(p) for p in pg_now) - pg_cpu0
            finally:
                stop(procs)
                for rx in receivers:
                    await rx.__aexit__(None, None, None)
            await asyncio.sleep(1.0)  # backends report their statistics on exit
            wal = delivery.delta(await delivery.wal_counters(conn), wal0)
            tx = await transactions(conn) - tx0
    times = [rx.received.times for rx in receivers]  # type: ignore[attr-defined]
    first = min(t[0] for t in times)
    last = max(t[-1] for t in times)
    total = per_destination * len(names)
    rates = sorted((len(t) - 1) / (t[-1] - t[0]) for t in times)
    return {
        "aggregate": (total - 1) / (last - first),
        "rates": rates,
        "rss": rss,
        "worker_cpu_ms": worker_cpu / total * 1000,
        "pg_cpu_ms": pg_cpu / total * 1000,
        "commits": tx / total,
        "wal_bytes": wal.get("wal_bytes", 0.0) / total,
        "wal_syncs": wal.get("wal_sync", 0.0) / total,
        "seconds": last - first,
    }


def describe(label: str, r: dict[str, Any]) -> None:
    rates = r["rates"]
    print(
        f"  {label:<26} {r['aggregate']:>7.0f} msg/s aggregate; per destination"
        f" {min(rates):.0f}-{max(rates):.0f} msg/s ({r['seconds']:.1f} s)"
    )
    print(
        f"  {'':<26} per message: worker CPU {r['worker_cpu_ms']:.2f} ms, Postgres CPU"
        f" {r['pg_cpu_ms']:.2f} ms, {r['commits']:.2f} commits, {r['wal_bytes']:.0f} WAL bytes,"
        f" {r['wal_syncs']:.3f} WAL syncs"
    )


# --- 4. ingest --------------------------------------------------------------------------------


#: Module prefixes of the ingest process, grouped for the profile.
PROFILE_GROUPS = (
    ("waiting for I/O (epoll)", ("'poll' of 'select.epoll'",)),
    ("HL7 parsing and identifier keys", ("worker/hl7/", "openssl_sha256", "sha256")),
    ("psycopg (statements, adaptation)", ("psycopg/", "psycopg_pool/", "psycopg_binary")),
    ("ingest (MLLP framing, ACKs, batching)", ("worker/ingest/",)),
    ("asyncio and sockets", ("asyncio/", "selectors", "socket")),
    ("logging and metrics", ("logging/", "prometheus_client/")),
)


def profile_groups(path: Path) -> list[tuple[str, float]]:
    """Own (tottime) seconds of the profiled ingest process per group of modules."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    groups = {name: 0.0 for name, _ in PROFILE_GROUPS} | {"other": 0.0}
    for (filename, _, function), (_, _, tottime, _, _) in stats.items():
        where = filename if filename != "~" else function
        if "cProfile" in where or "profile" in function:
            continue
        for name, prefixes in PROFILE_GROUPS:
            if any(p in where for p in prefixes):
                groups[name] += tottime
                break
        else:
            groups["other"] += tottime
    return sorted(groups.items(), key=lambda kv: -kv[1])


async def ingest_run(
    db: str, seconds: float, msgs: list[tuple[bytes, bytes]], profile: Path | None = None
) -> dict[str, dict[str, float]]:
    """Run ``inturn ingest`` and drive each channel with 8 connections; per channel: msg/s, and
    per message the ingest process's CPU, the Postgres CPU, transactions and WAL bytes."""
    ports = {channel: ingest_bench.free_port() for channel in ingest_bench.FANOUTS}
    http_port = ingest_bench.free_port()
    prefix = [sys.executable, "-P", "-m", "cProfile", "-o", str(profile)] if profile else []
    command = [*prefix, str(INTURN), "ingest", "--ops", f"127.0.0.1:{http_port}"]
    command += ["--log-level", "WARNING"]
    for channel, port in ports.items():
        command += ["--listen", f"{channel}=127.0.0.1:{port}"]
    process = subprocess.Popen(command, env={**os.environ, "INTURN_DSN": db})
    out: dict[str, dict[str, float]] = {}
    try:
        await ingest_bench.wait_ready(http_port, process)
        async with await AsyncConnection.connect(db, autocommit=True) as conn:
            for channel in ingest_bench.FANOUTS:
                ingest_bench.reset(db)
                pg = await backend_pids(conn)
                cpu0 = cpu_seconds(process.pid), sum(cpu_seconds(p) for p in pg)
                tx0, wal0 = await transactions(conn), await delivery.wal_counters(conn)
                rate, _, _, _ = await ingest_bench.drive(ports[channel], 8, seconds, msgs)
                await asyncio.sleep(1.1)  # the backends' statistics reach the server
                n = rate * (seconds + 1.0)  # the warm-up second is sent too
                tx = await transactions(conn) - tx0
                wal = delivery.delta(await delivery.wal_counters(conn), wal0)
                out[channel] = {
                    "rate": rate,
                    "ingest_cpu_ms": (cpu_seconds(process.pid) - cpu0[0]) / n * 1000,
                    "pg_cpu_ms": (sum(cpu_seconds(p) for p in pg) - cpu0[1]) / n * 1000,
                    "tx": tx / n,
                    "wal_bytes": wal.get("wal_bytes", 0.0) / n,
                }
    finally:
        process.terminate()
        process.wait(timeout=60)
    return out


async def fan_out(
    db: str, source: corpus.Messages, seconds: float, profile: bool
) -> tuple[float, float, float]:
    """Return (one-destination msg/s, fan-out-5 msg/s, pgbench sample-sized INSERT tps), 8 each."""
    msgs = ingest_bench.templates(source)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE inturn_destination CASCADE")
    ingest_bench.register(db)
    runs = await ingest_run(db, seconds, msgs)
    rates = {channel: r["rate"] for channel, r in runs.items()}
    average = sum(len(b) + len(a) + 16 for b, a in msgs) // len(msgs)
    typical = min(msgs, key=lambda m: abs(len(m[0]) + len(m[1]) + 16 - average))
    with tempfile.TemporaryDirectory() as tmp:
        sized = Path(tmp) / "insert-sized.sql"
        literal = (typical[0] + b"BENCH-0000000000" + typical[1]).hex()
        sized.write_text(f"INSERT INTO bench_insert (payload) VALUES ('\\x{literal}');\n")
        tps = ingest_bench.pgbench(db, 8, seconds, sized)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_insert")
    print(
        f"ingest: 8 MLLP connections, {seconds:.0f} s each,"
        f" samples of {average // 1024} KiB on average"
    )
    print(f"  one destination                {rates['one']:.0f} msg/s")
    print(
        f"  fan-out to 5                   {rates['fan5']:.0f} msg/s"
        f"  (ratio {rates['fan5'] / rates['one']:.2f}, target >= 0.80)"
    )
    print(
        f"  pgbench INSERT, sample-sized   {tps:.0f} tps at 8 clients"
        f"  (ingest/pgbench {rates['one'] / tps:.2f}, target >= 0.40)"
    )
    for channel, r in runs.items():
        print(
            f"  per message, {channel:<5}            ingest CPU {r['ingest_cpu_ms']:.2f} ms,"
            f" Postgres CPU {r['pg_cpu_ms']:.2f} ms, {r['tx']:.2f} transactions,"
            f" {r['wal_bytes']:.0f} WAL bytes"
        )
    if profile:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ingest.prof"
            await ingest_run(db, seconds, msgs, profile=path)
            groups = profile_groups(path)
        total = sum(t for _, t in groups) or 1.0
        print("  ingest process profile (cProfile, own time over both channels):")
        for name, t in groups:
            print(f"    {name:<36} {t:6.2f} s  {t / total:5.1%}")
    return rates["one"], rates["fan5"], tps


# --- 5. lookups -------------------------------------------------------------------------------

FILL_SQL = """
WITH blocks AS MATERIALIZED (
    SELECT array_agg(md5(j::text) ORDER BY j) AS b FROM generate_series(1, 1100) AS j
)
INSERT INTO inturn_delivery
       (destination, channel, control_id, message_type, payload, size, patient_keys)
SELECT 'bench/lookup-' || (g %% 100), 'bench', 'CTL' || g, 'ADT^A01', p.payload,
       length(p.payload),
       ARRAY[substr(encode(sha256(convert_to('PAT' || (g %% 250000), 'UTF8')), 'hex'), 1, 32),
             substr(encode(sha256(convert_to('PAT' || (g %% 250000), 'UTF8') || '\\x00'::bytea
                                  || convert_to('HOSP', 'UTF8')), 'hex'), 1, 32)]
  FROM generate_series(%(first)s::int, %(last)s::int) AS g, blocks
 CROSS JOIN LATERAL (
       SELECT convert_to('MSH|^~\\&|A|B|C|D|20260101||ADT^A01|CTL' || g || '|P|2.5' || chr(13)
              || 'PID|1||PAT' || (g %% 250000) || '^^^HOSP^MR||DOE^JOHN' || chr(13)
              || 'NTE|1||' || array_to_string(blocks.b[g %% 1000 + 1 : g %% 1000 + 58], '')
              || chr(13), 'UTF8') AS payload) AS p
"""


def fill(db: str, rows: int) -> float:
    """``rows`` pending rows of about 2 KB over 100 destinations, 4 rows per patient."""
    began = time.perf_counter()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE inturn_delivery CASCADE")
        step = 100_000
        for first in range(1, rows + 1, step):
            conn.execute(FILL_SQL.encode(), {"first": first, "last": min(first + step - 1, rows)})
        conn.execute("VACUUM ANALYZE inturn_delivery")
    return time.perf_counter() - began


def timed_cli(db: str, *args: str) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(
        [str(INTURN), *args, "--dsn", db], capture_output=True, text=True, timeout=900, check=False
    )
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"inturn {' '.join(args)} failed: {done.stderr.strip()}")
    return took, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


async def lookups(db: str, rows: int) -> dict[str, float]:
    took = fill(db, rows)
    with psycopg.connect(db) as conn:
        size = conn.execute("SELECT pg_total_relation_size('inturn_delivery')").fetchone()
        assert size is not None
    print(
        f"lookups: {rows:,} pending rows over 100 destinations,"
        f" {size[0] / 2**30:.2f} GiB (filled in {took:.0f} s)"
    )
    # CTL<g> is row g; PAT7 is named by rows 7, 250007, ...: 4 rows at a million
    patient = "PAT7"
    assert lookup_key(patient)  # the CLI computes the same key the fill did
    figures = {}
    queries = await query_times(db, f"CTL{rows // 2}", patient)
    for label, args in (
        ("queue list --control-id", ("queue", "list", "--control-id", f"CTL{rows // 2}")),
        (
            "queue list --patient-id",
            ("queue", "list", "--patient-id", patient, "--authority", "HOSP", "--why", "bench"),
        ),
        (
            "queue erase --patient-id --dry-run",
            (
                "queue",
                "erase",
                "--patient-id",
                patient,
                "--who",
                "bench",
                "--why",
                "b",
                "--dry-run",
            ),
        ),
        ("queue depth", ("queue", "depth")),
    ):
        seconds, last = timed_cli(db, *args)
        figures[label] = seconds
        print(
            f"  {label:<36} {seconds:6.2f} s as a command; its query {queries[label]:7.1f} ms"
            f"   ({last})"
        )
    return figures


async def query_times(db: str, control_id: str, patient: str) -> dict[str, float]:
    """Milliseconds of each lookup's queries alone (second run: the plan is cached)."""
    from inturn.worker.store import identifiers

    async with await AsyncConnection.connect(db, autocommit=True) as conn:
        calls = {
            "queue list --control-id": lambda: reads.list_items(conn, control_id=control_id),
            "queue list --patient-id": lambda: reads.list_items(
                conn, patient_key=lookup_key(patient, "HOSP")
            ),
            "queue erase --patient-id --dry-run": lambda: identifiers.find_patient(conn, patient),
            "queue depth": lambda: reads.depth(conn),
        }
        out = {}
        for label, call in calls.items():
            await call()
            began = time.perf_counter()
            await call()
            out[label] = (time.perf_counter() - began) * 1000
        return out


# --- main -------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace, server: str) -> None:
    skip = set(args.skip)
    tx_rate = cpu = rss = ratio = float("nan")
    with delivery.fresh_database(server, "scale") as db:
        migrate(db)
        if "idle" not in skip:
            tx_rate, cpu, _ = await idle(db, args.idle_workers, args.idle_window)
        source = corpus.load()
        print(source.describe(), flush=True)
        templates, _ = delivery.load_templates(source)
        if not templates:
            raise SystemExit(f"no usable messages: {source.where}")
        if "drain" not in skip:
            one = await drains(db, templates, ["drain"], args.drain)
            rss = one["rss"][0]
            print(
                f"one drain of {args.drain:,} sample messages"
                f" ({sum(t.size for t in templates) // len(templates) // 1024} KiB on average)"
            )
            describe("1 destination", one)
            print(f"  worker RSS after the drain     {rss:.1f} MiB  (target <= 40)")
        if "parallel" not in skip:
            per = args.per_destination
            alone = await drains(db, templates, ["alone"], per)
            many = await drains(db, templates, [f"par-{i:02d}" for i in range(10)], per)
            print(f"ten drains at once: {per:,} messages per destination")
            describe("1 destination alone", alone)
            describe("10 destinations at once", many)
            print(f"  aggregate / alone              {many['aggregate'] / alone['aggregate']:.2f}")
        if "ingest" not in skip:
            one_rate, fan5, _ = await fan_out(db, source, args.ingest_seconds, args.profile)
            ratio = fan5 / one_rate
        if "lookup" not in skip:
            await lookups(db, args.rows)
    print(
        f"scale: idle tx/s per worker {tx_rate:.4f}; idle CPU per worker {cpu:.4f}%;"
        f" worker RSS {rss:.1f} MiB; fan-out-5 ratio {ratio:.2f}"
    )

    def num(x: float, digits: int) -> float | None:
        return None if x != x else round(x, digits)  # NaN: the part was left out

    emit(
        "scale",
        {
            "messages": source.source,
            "idle_tx_per_s_per_worker": num(tx_rate, 4),
            "idle_cpu_percent_per_worker": num(cpu, 4),
            "worker_rss_mib": num(rss, 1),
            "worker_rss_target_mib": 40,
            "fan_out_5_ratio": num(ratio, 2),
        },
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"), help="Postgres server")
    parser.add_argument("--idle-workers", type=int, default=20)
    parser.add_argument("--idle-window", type=float, default=130.0, help="seconds (> 2 polls)")
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--per-destination", type=int, default=2_000)
    parser.add_argument("--ingest-seconds", type=float, default=8.0)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--profile", action="store_true", help="profile ingest (a third run)")
    parser.add_argument("--skip", nargs="*", default=[], choices=PARTS)
    args = parse_args(
        parser,
        argv,
        {
            "idle_workers": 2,
            "idle_window": 2.0,
            "drain": 200,
            "per_destination": 30,
            "ingest_seconds": 1.0,
            "rows": 2000,
        },
    )
    with delivery.postgres_server(args.dsn) as (server, _):
        asyncio.run(main_async(args, server))


if __name__ == "__main__":
    main()
