"""Benchmark ingest: messages acknowledged per second over MLLP, next to pgbench's INSERT rate.

Runs ``inturn ingest`` as its own process (as in production) against a fresh database, then
drives it from this process with 1, 8 and 32 concurrent MLLP connections, each sending the
sample messages one after another (send, wait for the ACK, send the next), for one destination
and for a fan-out to five. Every message gets a unique MSH-10 so that the duplicate window does
not swallow repeats. Beside it, ``pgbench`` measures the commit rate of a plain single-row INSERT
(synchronous commit, like ingest) on the same database at the same concurrency: the ceiling
ingest is compared with.

    python bench/ingest.py [--dsn DSN] [--seconds 5] [--connections 1,8,32]

``--tiny`` (the test suite's) runs 1 s per case and 8 connections only (the figures' case).

The same 8-connection, one-destination case then runs against a second ingest started with
``--payload-keys`` (a master key folder and a key store database made for the run): every
payload sealed before it is stored. ``encrypted_rate_ratio`` is its rate over the plaintext one
(target 0.9 or more).

Without ``--dsn`` (or ``INTURN_DSN``) an embedded Postgres is started (pgserver). Prints figures
and asserts nothing; the last line is
``ingest: N msg/s at 8 connections; pgbench: M tps at 8 clients; ratio R``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

import corpus
import encryption
import psycopg
from delivery import cpu_seconds, fresh_database, postgres_server
from figures import emit, parse_args

from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.expect import answer_codes
from inturn.worker.hl7.header import parse_header
from inturn.worker.store.migrate import migrate
from tests.support.ports import free_port

HOST = "127.0.0.1"
SB, TRAILER = b"\x0b", b"\x1c\r"
CONNECTIONS = (1, 8, 32)
FANOUTS = {"one": 1, "fan5": 5}


def templates(source: corpus.Messages) -> list[tuple[bytes, bytes]]:
    """Each usable message of ``source`` split around its MSH-10: (before, after). A message
    whose MSH-15/16 ask for two answers (a CA, then an AA) or none is left out: a connection
    here reads one answer a message (reading one of two left the other for the next message,
    timed as 0 ms and counted as a message accepted)."""
    out = []
    for _, raw in source.items:
        try:
            header = parse_header(raw)
        except HeaderError:
            continue
        if len(answer_codes(header, "accept")) != 1:
            continue
        sep = header.delimiters.field.encode("latin-1")
        first_end = min(i for i in (raw.find(b"\r"), raw.find(b"\n"), len(raw)) if i >= 0)
        fields = raw[:first_end].split(sep)
        before = sep.join(fields[:9]) + sep
        after = sep + sep.join(fields[10:]) + raw[first_end:]
        out.append((before, after))
    return out


def pgbench_path() -> str:
    for candidate in (shutil.which("pgbench"), "/usr/lib/postgresql/15/bin/pgbench"):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("pgbench not found (install postgresql-client)")


@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[str]:
    """A fresh, migrated database on the given server (or an embedded one); dropped after."""
    with postgres_server(dsn) as (server, _), fresh_database(server, "ingest") as db:
        migrate(db)
        yield db


def commits(db: str) -> int:
    """Transactions committed in the bench database so far (``pg_stat_database``)."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def register(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        for channel, count in FANOUTS.items():
            for n in range(count):
                conn.execute(
                    "INSERT INTO inturn_destination (destination, namespace, name, channel)"
                    " VALUES (%s, 'bench', %s, %s)",
                    (f"bench/{channel}-{n}", f"{channel}-{n}", channel),
                )


def reset(db: str) -> None:
    """Empty the queue between runs. Ingest stays up and may be writing its own bookkeeping
    (the feeds' last-seen times) meanwhile: a lock conflict is waited out and tried again."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '2s'")
        for attempt in range(10):
            try:
                conn.execute(
                    "TRUNCATE inturn_delivery, inturn_message, inturn_received, inturn_cursor"
                    " CASCADE"
                )
                break
            except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable):
                if attempt == 9:
                    raise
                time.sleep(0.2)
        conn.execute("VACUUM ANALYZE inturn_delivery, inturn_message, inturn_received")


async def connection_loop(
    port: int,
    index: int,
    msgs: list[tuple[bytes, bytes]],
    stop_at: float,
    measure_from: float,
    latencies: list[float],
    counts: list[int],
) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    n = 0
    try:
        while time.perf_counter() < stop_at:
            before, after = msgs[(index * 7 + n) % len(msgs)]
            control_id = f"B{index}-{n}-{uuid.uuid4().hex[:8]}".encode()
            started = time.perf_counter()
            writer.write(SB + before + control_id + after + TRAILER)
            reply = await reader.readuntil(TRAILER)
            done = time.perf_counter()
            if started >= measure_from:
                code = reply[reply.find(b"MSA") + 4 : reply.find(b"MSA") + 6]
                if code in (b"AA", b"CA"):
                    counts[0] += 1
                    latencies.append(done - started)
                else:
                    counts[1] += 1
            counts[2] += 1
            n += 1
    finally:
        writer.close()


async def drive(
    port: int, connections: int, seconds: float, msgs: list[tuple[bytes, bytes]]
) -> tuple[float, float, float, int]:
    """Return (acknowledged msg/s, p50 ms, p99 ms, non-AA answers)."""
    warmup = 1.0
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds
    latencies: list[float] = []
    counts = [0, 0, 0]  # accepted while measured, not accepted while measured, all answered
    await asyncio.gather(
        *(
            connection_loop(port, i, msgs, stop_at, measure_from, latencies, counts)
            for i in range(connections)
        )
    )
    elapsed = time.perf_counter() - measure_from
    latencies.sort()
    p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000 if latencies else float("nan")
    drive.answered = counts[2]  # type: ignore[attr-defined]
    return counts[0] / elapsed, p50, p99, counts[1]


def pgbench(db: str, clients: int, seconds: float, script: Path) -> float:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_insert")
        conn.execute(
            "CREATE TABLE bench_insert (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " payload bytea NOT NULL, at timestamptz NOT NULL DEFAULT now())"
        )
    result = subprocess.run(
        [pgbench_path(), "-n", "-f", str(script), "-c", str(clients),
         "-j", str(min(clients, os.cpu_count() or 1)), "-T", str(int(seconds)), db],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    if match is None:
        raise SystemExit("pgbench printed no tps:\n" + result.stdout + result.stderr)
    return float(match.group(1))


async def wait_ready(http_port: int, process: subprocess.Popen[bytes]) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            if process.poll() is not None:
                raise SystemExit("ingest exited early")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://{HOST}:{http_port}/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise SystemExit("ingest did not become ready")


async def main_async(args: argparse.Namespace, db: str) -> None:
    source = corpus.load()
    print(source.describe(), flush=True)
    msgs = templates(source)
    register(db)
    ports = {channel: free_port() for channel in FANOUTS}
    http_port = free_port()
    command = [
        sys.executable, "-c",
        "from inturn.worker.cli.ingest import ingest_command; ingest_command()",
        "--ops", f"{HOST}:{http_port}", "--log-level", "WARNING",
        "--pool-size", str(args.pool_size),
    ]  # fmt: skip
    for channel, port in ports.items():
        command += ["--listen", f"{channel}={HOST}:{port}"]
    process = subprocess.Popen(command, env={**os.environ, "INTURN_DSN": db})
    base_command = list(command)
    rates: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    try:
        await wait_ready(http_port, process)
        print(f"{len(msgs)} sample messages; {os.cpu_count()} CPUs; {args.seconds:.0f} s per run")
        print(f"{'destinations':>12} {'connections':>11} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        print(f"{'':>12} {'':>11} {'':>9} {'':>8} {'':>8} {'ingest CPU':>11} {'messages':>9}")
        print(
            f"{'destinations':>12} {'connections':>11} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
            f" {'us/msg':>11} {'/commit':>9}"
        )
        for channel, fanout in FANOUTS.items():
            for connections in args.connections:
                reset(db)
                cpu0, commits0 = cpu_seconds(process.pid), commits(db)
                rate, p50, p99, bad = await drive(ports[channel], connections, args.seconds, msgs)
                answered = max(drive.answered, 1)  # type: ignore[attr-defined]
                cpu_us = (cpu_seconds(process.pid) - cpu0) / answered * 1e6
                await asyncio.sleep(1.1)  # the backends' statistics reach the server
                per_commit = answered / max(commits(db) - commits0, 1)
                rates[(channel, connections)] = rate
                cpu[(channel, connections)] = cpu_us
                note = f"  ({bad} not accepted)" if bad else ""
                print(
                    f"{fanout:>12} {connections:>11} {rate:>9.0f} {p50:>8.2f} {p99:>8.2f}"
                    f" {cpu_us:>11.0f} {per_commit:>9.1f}{note}"
                )
    finally:
        process.terminate()
        process.wait(timeout=30)
    sealed_rate, plain8 = await encrypted_case(args, db, base_command, ports, msgs)
    encrypted_ratio = encryption.ratio(sealed_rate, plain8)
    print(
        f"encrypted payloads (--payload-keys), 1 destination, 8 connections: {sealed_rate:.0f}"
        f" msg/s against {plain8:.0f} in clear (ratio {encrypted_ratio})"
    )

    average = sum(len(b) + len(a) + 16 for b, a in msgs) // len(msgs)
    typical = min(msgs, key=lambda m: abs(len(m[0]) + len(m[1]) + 16 - average))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "insert.sql"
        script.write_text(
            "INSERT INTO bench_insert (payload) VALUES (convert_to(repeat('x', 2048), 'UTF8'));\n"
        )
        # for context only: rows holding a real sample of about the average size
        sized = Path(tmp) / "insert-sized.sql"
        literal = (typical[0] + b"BENCH-0000000000" + typical[1]).hex()
        sized.write_text(f"INSERT INTO bench_insert (payload) VALUES ('\\x{literal}');\n")
        print(f"{'pgbench':>12} {'clients':>11} {'tps':>9}")
        tps: dict[int, float] = {}
        for clients in args.connections:
            tps[clients] = pgbench(db, clients, args.seconds, script)
            print(f"{'INSERT':>12} {clients:>11} {tps[clients]:>9.0f}")
        context = pgbench(db, 8, args.seconds, sized)
        print(
            f"{'INSERT':>12} {8:>11} {context:>9.0f}"
            f"  (a {average // 1024} KiB sample per row, for context)"
        )
    ingest8 = rates[("one", 8)]
    ratio = ingest8 / tps[8] if tps[8] else float("nan")
    print(
        f"ingest: {ingest8:.0f} msg/s at 8 connections; pgbench: {tps[8]:.0f} tps at 8 clients;"
        f" ratio {ratio:.2f}"
    )
    cpu8 = cpu[("one", 8)]
    print(
        f"ingest's own CPU at 8 connections: {cpu8:.0f} us per message, so one ingest process"
        f" (one event loop, one core) tops out near {1e6 / cpu8:,.0f} msg/s on this machine"
        " before Postgres takes any CPU"
    )
    emit(
        "ingest",
        {
            "messages": source.source,
            "ingest_msg_s_8_connections": round(ingest8, 1),
            "pgbench_tps_8_clients": round(tps[8], 1),
            "ratio_to_pgbench": None if ratio != ratio else round(ratio, 3),
            "ratio_target": 0.4,
            "ingest_cpu_us_per_message_8_connections": round(cpu8),
            "one_process_ceiling_msg_s": round(1e6 / cpu8),
            "encrypted_msg_s_8_connections": round(sealed_rate, 1),
            "encrypted_rate_ratio": encrypted_ratio,
            "encrypted_rate_ratio_target": encryption.RATIO_TARGET,
        },
    )


async def encrypted_case(
    args: argparse.Namespace,
    db: str,
    command: list[str],
    ports: dict[str, int],
    msgs: list[tuple[bytes, bytes]],
) -> tuple[float, float]:
    """The 8-connection, one-destination rate with payloads sealed (a second ingest with
    ``--payload-keys``) and in clear, alternated twice so that a machine whose speed drifts
    moves both alike: ``(encrypted, plaintext)`` msg/s, each the mean of its two runs."""
    out: list[float] = []
    with encryption.key_store(db) as (folder, key_dsn):
        for keyed in (True, False, True, False):
            http_port = free_port()
            run = [*command]
            run[run.index("--ops") + 1] = f"{HOST}:{http_port}"
            if keyed:
                run += ["--payload-keys", folder, "--key-dsn", key_dsn]
            process = subprocess.Popen(run, env={**os.environ, "INTURN_DSN": db})
            try:
                await wait_ready(http_port, process)
                reset(db)
                rate, _, _, bad = await drive(ports["one"], 8, args.seconds, msgs)
                if bad:
                    print(f"  ({bad} not accepted)")
                out.append(rate)
            finally:
                process.terminate()
                process.wait(timeout=30)
    return (out[0] + out[2]) / 2, (out[1] + out[3]) / 2


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"), help="Postgres server")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--pool-size", type=int, default=16, help="ingest's write pool size")
    parser.add_argument(
        "--connections",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=CONNECTIONS,
        help="concurrent connections (and pgbench clients), comma-separated; 8 is always run",
    )
    args = parse_args(parser, argv, {"seconds": 1.0, "connections": "8"})
    args.connections = tuple(sorted({*args.connections, 8}))
    with database(args.dsn) as db:
        asyncio.run(main_async(args, db))


if __name__ == "__main__":
    main()
