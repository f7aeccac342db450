"""Benchmark fan-out: one channel feeding 1, 10, 50 and 200 destinations (issue 43).

For each count, one ``inturn ingest`` process (as in production) takes the sample messages on
one channel from 8 MLLP connections (each sends, waits for the ACK, sends the next; every
MSH-10 unique). Every fifth destination has a filter that takes a tenth of the messages (a
message type the bench gives one message in ten); the others take every message.

Samples whose MSH-15/16 ask for two answers (a CA, then an AA) or none are left out, so that
each message is answered once (the AA, or the CA of one asking for the accept level only).

1. **Held**: the receivers hold their ACKs, so no worker sends or pulls anything (each waits
   on its first head): what is measured is ingest's own cost, in ``--held-rounds`` rounds (3),
   the counts taking turns within each round; each figure is its median over the rounds, and
   a rate ratio the median of the rounds' own ratios. Printed per count: the ingest
   rate, ACK p50/p99, WAL and table bytes written per message, and CPU per message of the
   ingest process and of its Postgres backends; the rate ratios to one destination (targets
   0.8 at 10 and 0.5 at 200), and WAL at 200 over WAL at 1 (target under 3).
2. **Live**: a process of N MLLP receivers that answer at once and N workers (one per
   destination, as ``inturn local`` runs them, their statements bounded by
   ``INTURN_WORKER_STATEMENTS``: ``--worker-statements``) delivers while 20 messages a second
   arrive (spread over the 8 connections) for ``--live-seconds``: ACK p50/p99 (target p99 under
   50 ms at 200), the aggregate delivery rate (deliveries a second, every destination's, from
   the first send to the last delivery) and the CPU per delivery of everything (ingest, the
   workers' process, every Postgres process; target at 200 within 1.25 of one's). Also per
   delivery: the server's commits, WAL records and bytes, WAL writes and flushes
   (``pg_stat_database``, ``pg_stat_wal``; server-wide, so only meaningful on its own server);
   ``--statements`` loads pg_stat_statements and prints the live phase's most frequent
   statements (calls per delivery, mean ms); ``--lower-delivery`` (experiment, root) puts the
   workers' process, and with ``--lower-scope all`` their backends, below ingest in CPU
   priority (nice 19, SCHED_IDLE, or a cgroup v1 ``cpu`` group idle or of weight 2).

Runs on a Postgres server of its own (initdb in a temporary folder, ``max_connections`` room
for 200 workers, so that WAL and CPU are this benchmark's alone) unless ``--dsn`` is given;
``--tiny`` (the test suite's) uses ``$INTURN_DSN`` and 1 and 10 destinations.

    python bench/fanout.py [--seconds 5] [--held-rounds 3] [--live-seconds 10]
                           [--destinations 1,10,50,200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

import corpus
import psycopg
from delivery import cpu_seconds, fresh_database
from figures import emit, parse_args

from inturn.worker.drain.permits import PERMITS_ENV, permits_from_env
from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.expect import answer_codes
from inturn.worker.hl7.header import parse_header
from inturn.worker.store.migrate import migrate
from tests.support.ports import free_port

HOST = "127.0.0.1"
SB, TRAILER = b"\x0b", b"\x1c\r"
CONNECTIONS = 8
#: The message type one message in ten carries; the filtered destinations take only it.
TENTH = "ZZZ^Z10"
#: Every FILTERED-th destination (from the fifth) is filtered.
FILTERED = 5
LIVE_RATE = 20.0  # messages a second while the receivers answer
PG_BIN = Path("/usr/lib/postgresql/15/bin")


# --- messages ---------------------------------------------------------------------------------


def templates(source: corpus.Messages) -> list[tuple[bytes, bytes]]:
    """Each usable sample split around its MSH-10, (before, after); one in ten with MSH-9
    made :data:`TENTH` (what the filtered destinations take). Samples in enhanced mode that
    ask for no answer, or for two (a CA, then an AA: MSH-15/16), are left out: a sender here
    reads one answer a message."""
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
        if len(fields) < 12:
            continue
        if len(out) % 10 == 0:
            fields[8] = TENTH.encode()
        out.append((sep.join(fields[:9]) + sep, sep + sep.join(fields[10:]) + raw[first_end:]))
    return out


# --- the server -------------------------------------------------------------------------------


@contextlib.contextmanager
def own_server(connections: int, statements: bool = False) -> Iterator[tuple[str, Path]]:
    """A Postgres 15 server of this run's own (``max_connections`` ``connections``), its DSN
    and data directory; stopped and removed after. ``statements``: with pg_stat_statements
    loaded and WAL I/O timed (``--statements``)."""
    data = Path(tempfile.mkdtemp(prefix="inturn-fanout-pg-"))
    port = free_port()
    initdb = shutil.which("initdb") or str(PG_BIN / "initdb")
    pg_ctl = shutil.which("pg_ctl") or str(PG_BIN / "pg_ctl")
    env = {**os.environ}
    run_as: list[str] = []
    if os.geteuid() == 0:  # Postgres refuses to run as root: the nobody user runs it
        shutil.chown(data, "nobody")
        run_as = ["runuser", "-u", "nobody", "--"]
    subprocess.run(
        [*run_as, initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    options = (
        f"-p {port} -k {data} -c listen_addresses={HOST} -c max_connections={connections}"
        " -c shared_buffers=256MB -c max_wal_size=4GB"
    )
    if statements:
        options += " -c shared_preload_libraries=pg_stat_statements -c track_wal_io_timing=on"
    subprocess.run(
        [*run_as, pg_ctl, "-D", str(data), "-o", options, "-l", str(data / "log"), "-w", "start"],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    try:
        yield f"host={HOST} port={port} user=postgres dbname=postgres", data
    finally:
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True, env=env,
        )  # fmt: skip
        shutil.rmtree(data, ignore_errors=True)


def postmaster_pid(data: Path | None) -> int | None:
    if data is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        return int((data / "postmaster.pid").read_text().splitlines()[0])
    return None


def server_cpu(postmaster: int | None) -> float:
    """CPU seconds of every process of the server (its children and itself): its own server
    only; 0 on a shared one."""
    if postmaster is None:
        return 0.0
    total = cpu_seconds(postmaster)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == postmaster:
                total += cpu_seconds(int(entry.name))
    return total


def wal_lsn(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def table_bytes(db: str) -> int:
    """Heap, TOAST and index bytes of the tables ingest and the pull write."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
            " WHERE c.relkind = 'r' AND c.relname IN ('inturn_delivery', 'inturn_received',"
            " 'inturn_route', 'inturn_cursor')"
            " OR c.oid IN (SELECT inhrelid FROM pg_inherits"
            "               WHERE inhparent = 'inturn_message'::regclass)"
        ).fetchone()
    return int(row[0] or 0) if row else 0


def backend_pids(db: str, application: str | None = None) -> list[int]:
    """The pids of this database's backends but ours; with ``application``, only those whose
    application_name starts with it."""
    where = "" if application is None else " AND starts_with(application_name, %s)"
    params = () if application is None else (application,)
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()" + where,
            params,
        ).fetchall()
    return [int(r[0]) for r in rows]


def every_backend(db: str) -> list[int]:
    return backend_pids(db)


def worker_backends(db: str) -> list[int]:
    return backend_pids(db, "inturn-worker")


def backends(db: str) -> list[int]:
    return backend_pids(db, "inturn-ingest")


def register(db: str, channel: str, count: int) -> list[str]:
    names = []
    with psycopg.connect(db, autocommit=True) as conn:
        for n in range(count):
            name = f"{channel}-{n}"
            filtered = n % FILTERED == FILTERED - 1
            conn.execute(
                "INSERT INTO inturn_destination (destination, namespace, name, channel,"
                " message_types) VALUES (%s, 'bench', %s, %s, %s)",
                (f"bench/{name}", name, channel, [TENTH] if filtered else []),
            )
            names.append(f"bench/{name}")
    return names


def reset(db: str) -> None:
    """Empty the log, the queues and the window between runs (ingest stays up)."""
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
        conn.execute("CHECKPOINT")


# --- driving ingest ---------------------------------------------------------------------------


async def sender(
    port: int,
    index: int,
    msgs: list[tuple[bytes, bytes]],
    stop_at: float,
    measure_from: float,
    gap: float,
    latencies: list[float],
    counts: list[int],
) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    n = 0
    try:
        while time.perf_counter() < stop_at:
            before, after = msgs[(index * 13 + n) % len(msgs)]
            control_id = f"F{index}-{n}-{uuid.uuid4().hex[:8]}".encode()
            started = time.perf_counter()
            writer.write(SB + before + control_id + after + TRAILER)
            reply = await reader.readuntil(TRAILER)
            done = time.perf_counter()
            at = reply.find(b"MSA")
            accepted = reply[at + 4 : at + 6] in (b"AA", b"CA")
            counts[2] += 1
            counts[3] += (b"|" + TENTH.encode() + b"|") in before + b"|"
            if started >= measure_from:
                if accepted:
                    counts[0] += 1
                    latencies.append(done - started)
                else:
                    counts[1] += 1
            n += 1
            if gap:
                await asyncio.sleep(max(0.0, gap - (time.perf_counter() - started)))
    finally:
        writer.close()


async def drive(
    port: int, seconds: float, msgs: list[tuple[bytes, bytes]], rate: float | None = None
) -> dict[str, float]:
    """8 connections for ``seconds`` after a second's warm-up, as fast as answered or paced to
    ``rate`` messages a second in all: accepted msg/s, p50/p99 ms, answered, refused."""
    warmup = 1.0
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    counts = [0, 0, 0, 0]  # accepted measured, refused measured, answered, of the tenth type
    gap = CONNECTIONS / rate if rate else 0.0
    await asyncio.gather(
        *(
            sender(port, i, msgs, stop_at, measure_from, gap, latencies, counts)
            for i in range(CONNECTIONS)
        )
    )
    latencies.sort()
    return {
        "rate": counts[0] / seconds,
        "p50": statistics.median(latencies) * 1000 if latencies else float("nan"),
        "p99": latencies[max(int(len(latencies) * 0.99) - 1, 0)] * 1000
        if latencies
        else float("nan"),
        "answered": counts[2],
        "refused": counts[1],
        "tenth": counts[3],
    }


async def wait_ready(http_port: int, process: subprocess.Popen[bytes]) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            if process.poll() is not None:
                raise SystemExit("ingest exited early")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://{HOST}:{http_port}/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise SystemExit("ingest did not become ready")


# --- the workers' process ---------------------------------------------------------------------


async def serve(db: str, channel: str, names: Sequence[str]) -> None:
    """``--serve``: a receiver answering at once and a worker for each of ``names`` until
    standard input closes (what the live phase runs beside ingest)."""
    from inturn.worker.drain.runner import DestinationWorker
    from inturn.worker.senders.mllp import MllpSenderConfig
    from inturn.worker.senders.registry import make_sender
    from inturn.worker.spec.config import RetryPolicy, WorkerConfig
    from inturn.worker.testing import MllpReceiver

    stop = asyncio.Event()
    permits = permits_from_env()  # as inturn local bounds its workers' statements
    async with contextlib.AsyncExitStack() as stack:
        tasks = []
        for name in names:
            rx = await stack.enter_async_context(MllpReceiver())
            cfg = WorkerConfig(
                destination=name,
                channel=channel,
                sender=MllpSenderConfig(HOST, rx.port),
                retry=RetryPolicy(max_attempts=0),
                idle_seconds=30,
            )
            worker = DestinationWorker(cfg, db, make_sender(cfg.sender), permits=permits)
            tasks.append(asyncio.create_task(worker.run(stop)))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        stop.set()
        await asyncio.wait(tasks, timeout=30)
    if permits is not None:
        print(f"permits {permits.limit} peak {permits.peak}", file=sys.stderr, flush=True)


#: What ``--lower-delivery`` does to the delivery side's processes: ``nice`` (19),
#: ``idle`` (SCHED_IDLE), ``cgroup-idle`` and ``cgroup-weight`` (a cgroup v1 ``cpu`` group with
#: ``cpu.idle`` 1, or ``cpu.shares`` 2 against the others' 1024).
LOWER_MODES = ("none", "nice", "idle", "cgroup-idle", "cgroup-weight")
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")


def lower(pids: Sequence[int], mode: str) -> None:
    """Put ``pids`` (every thread of each) below the rest of the machine in CPU priority, by
    ``mode`` (:data:`LOWER_MODES`): an experiment of ``--lower-delivery``, root needed for
    the cgroups and for another user's processes (Postgres backends).

    Raises:
        OSError: the cgroup could not be made or written (no cgroup v1 ``cpu`` controller).
    """
    if mode.startswith("cgroup-"):
        group = CPU_CGROUPS / f"inturn-fanout-{mode}"
        group.mkdir(exist_ok=True)
        if mode == "cgroup-idle":
            (group / "cpu.idle").write_text("1")
        else:
            (group / "cpu.shares").write_text("2")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                (group / "cgroup.procs").write_text(str(pid))
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    if mode == "idle":
                        os.sched_setscheduler(int(task), os.SCHED_IDLE, os.sched_param(0))
                    else:
                        os.setpriority(os.PRIO_PROCESS, int(task), 19)


def run_delay(pids: Sequence[int]) -> float:
    """Seconds ``pids`` (and their threads) have waited runnable for a CPU
    (``/proc/PID/task/*/schedstat``, second field, ns); 0 where unreadable."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with (
                    contextlib.suppress(OSError, IndexError, ValueError),
                    open(f"/proc/{pid}/task/{task}/schedstat") as f,
                ):
                    total += int(f.read().split()[1])
    return total / 1e9


def procs_running() -> int:
    """Tasks runnable on the machine now (``/proc/stat`` procs_running; 0 where absent)."""
    with contextlib.suppress(OSError), open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return 0


async def sample_live(db: str, ingest_pids: Sequence[int], stop: asyncio.Event) -> dict[str, float]:
    """Every 20 ms until ``stop``: the machine's run queue and what ingest's backends are
    doing (``pg_stat_activity`` state and wait event), so the live ACK's wait is seen, not
    guessed. Returns the run queue's median and max and the share of each ingest-backend
    state (keys ``state:<state>/<wait event>``)."""
    queue: list[int] = []
    seen: dict[str, int] = {}
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        while not stop.is_set():
            queue.append(procs_running())
            rows = await (
                await conn.execute(
                    "SELECT state, coalesce(wait_event_type || ':' || wait_event, 'cpu')"
                    " FROM pg_stat_activity WHERE pid = ANY(%s)",
                    (list(ingest_pids),),
                )
            ).fetchall()
            for state, wait in rows:
                if state != "idle":
                    key = f"state:{state}/{wait}"
                    seen[key] = seen.get(key, 0) + 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.02)
    total = max(len(queue), 1)
    out: dict[str, float] = {
        "runq_median": statistics.median(queue) if queue else float("nan"),
        "runq_max": max(queue, default=0),
    }
    out |= {k: v / total for k, v in seen.items()}
    return out


#: The server's counters read before and after the live phase (``pg_stat_database`` of the
#: bench's database, ``pg_stat_wal``): commits, WAL records, bytes, writes and flushes.
COUNTERS = ("commits", "wal_records", "wal_bytes", "wal_writes", "wal_flushes", "wal_sync_ms")


def counters(db: str) -> dict[str, float]:
    """The server's figures of :data:`COUNTERS` now (cumulative since the server started)."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT xact_commit FROM pg_stat_database"
            "         WHERE datname = current_database()),"
            " wal_records, wal_bytes, wal_write, wal_sync, wal_sync_time FROM pg_stat_wal"
        ).fetchone()
    assert row is not None
    return dict(zip(COUNTERS, (float(v or 0) for v in row), strict=True))


def reset_statements(db: str) -> bool:
    """Start pg_stat_statements' counts afresh; False where the server has not loaded it."""
    with psycopg.connect(db, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            return False
    return True


def top_statements(db: str, per: int, limit: int = 10) -> list[str]:
    """The ``limit`` statements the server ran most often since :func:`reset_statements`, each
    as calls per delivery (of ``per`` deliveries), mean milliseconds and rows per call, and the
    statement's start (its leading comments and blanks folded)."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, total_exec_time, rows, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY calls DESC LIMIT %s",
            (limit,),
        ).fetchall()
    out = []
    for calls, total, nrows, query in rows:
        text = " ".join(
            line.strip() for line in str(query).splitlines() if not line.strip().startswith("--")
        )
        out.append(
            f"{calls / max(per, 1):6.2f}/deliv {total / max(calls, 1):6.3f} ms"
            f" {nrows / max(calls, 1):5.1f} rows  {text[:90]}"
        )
    return out


def delivered(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'"
        ).fetchone()
    return int(row[0]) if row else 0


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Front:
    """One count's ``inturn ingest`` process, listening on its own channel and port."""

    count: int
    channel: str
    names: list[str]
    port: int
    process: subprocess.Popen[bytes]


@contextlib.asynccontextmanager
async def front_door(db: str, count: int) -> AsyncIterator[Front]:
    channel = f"fan{count}"
    names = register(db, channel, count)
    port, http_port = free_port(), free_port()
    command = [
        sys.executable, "-c",
        "from inturn.worker.cli.ingest import ingest_command; ingest_command()",
        "--ops", f"{HOST}:{http_port}", "--log-level", "WARNING",
        "--listen", f"{channel}={HOST}:{port}",
    ]  # fmt: skip
    process = subprocess.Popen(command, env={**os.environ, "INTURN_DSN": db})
    try:
        await wait_ready(http_port, process)
        yield Front(count, channel, names, port, process)
    finally:
        process.terminate()
        process.wait(timeout=30)


async def held_phase(
    args: argparse.Namespace, db: str, front: Front, msgs: list[tuple[bytes, bytes]]
) -> dict[str, float]:
    """The receivers hold their ACKs (no worker exists): ingest's own rate, ACK latency, bytes
    and CPU per message."""
    reset(db)
    ours = backends(db)  # every count's ingest backends; the idle ones spend nothing
    cpu0 = cpu_seconds(front.process.pid)
    back0 = sum(cpu_seconds(p) for p in ours)
    wal0, bytes0 = wal_lsn(db), table_bytes(db)
    held = await drive(front.port, args.seconds, msgs)
    answered = max(held["answered"], 1)
    return {
        "held_rate": held["rate"],
        "held_p50": held["p50"],
        "held_p99": held["p99"],
        "ingest_cpu_us": (cpu_seconds(front.process.pid) - cpu0) / answered * 1e6,
        "backend_cpu_us": (sum(cpu_seconds(p) for p in ours) - back0) / answered * 1e6,
        "wal_bytes": (wal_lsn(db) - wal0) / answered,
        "table_bytes": (table_bytes(db) - bytes0) / answered,
    }


async def live_phase(
    args: argparse.Namespace,
    db: str,
    postmaster: int | None,
    front: Front,
    msgs: list[tuple[bytes, bytes]],
) -> dict[str, float]:
    """N workers delivering while 20 messages a second arrive."""
    count, process, names, channel = front.count, front.process, front.names, front.channel
    reset(db)
    ours = backends(db)
    out: dict[str, float] = {}
    bound = {} if args.worker_statements is None else {PERMITS_ENV: str(args.worker_statements)}
    workers = subprocess.Popen(
        [sys.executable, __file__, "--serve", channel, *names],
        env={**os.environ, "INTURN_DSN": db, **bound},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert workers.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, workers.stdout.readline)
        if line.strip() != b"ready":
            raise SystemExit("the workers' process did not start")
        if args.lower_delivery != "none":
            # experiment: the delivery side below ingest in the scheduler's eyes, as
            # separate pods' CPU requests would place it (every worker connected first)
            for _ in range(100):
                if len(worker_backends(db)) >= count:
                    break
                await asyncio.sleep(0.1)
            ranked = [workers.pid]
            if args.lower_scope == "all":
                ranked += worker_backends(db)
            lower(ranked, args.lower_delivery)
        statements = args.statements and reset_statements(db)
        server0 = counters(db)
        workers0 = cpu_seconds(workers.pid)
        before = cpu_seconds(process.pid) + cpu_seconds(workers.pid) + server_cpu(postmaster)
        started = time.perf_counter()
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_live(db, ours, stop))
        waited0 = [run_delay([process.pid]), run_delay(ours), run_delay([os.getpid()])]
        live = await drive(front.port, args.live_seconds, msgs, rate=LIVE_RATE)
        waited = [
            (run_delay(p) - w0) / max(live["answered"], 1) * 1000
            for p, w0 in zip([[process.pid], ours, [os.getpid()]], waited0, strict=True)
        ]
        stop.set()
        sampled = await sampler
        filtered = sum(1 for n in range(count) if n % FILTERED == FILTERED - 1)
        expected = live["answered"] * (count - filtered) + live["tenth"] * filtered
        deadline = time.perf_counter() + args.drain_timeout
        done = delivered(db)
        while done < expected and time.perf_counter() < deadline:
            await asyncio.sleep(0.2)
            done = delivered(db)
        elapsed = time.perf_counter() - started
        server1 = counters(db)
        per_delivery = {
            f"{k}_per_delivery": (server1[k] - server0[k]) / max(done, 1) for k in COUNTERS
        }
        if statements:
            print(f"      statements of the live phase at {count}, {done} deliveries:")
            for line in top_statements(db, done):
                print(f"        {line}")
        used = cpu_seconds(process.pid) + cpu_seconds(workers.pid) + server_cpu(postmaster) - before
        out |= (
            {
                "runq_wait_ingest_ms": waited[0],
                "runq_wait_backends_ms": waited[1],
                "runq_wait_senders_ms": waited[2],
                "workers_process_us": (cpu_seconds(workers.pid) - workers0) / max(done, 1) * 1e6,
                "live_p50": live["p50"],
                "live_p99": live["p99"],
                "deliveries": done,
                "expected": expected,
                "delivery_rate": done / elapsed,
                "cpu_per_delivery_us": used / max(done, 1) * 1e6 if postmaster else float("nan"),
            }
            | sampled
            | per_delivery
        )
    finally:
        if workers.stdin is not None:
            workers.stdin.close()
        try:
            workers.wait(timeout=60)
        except subprocess.TimeoutExpired:
            workers.kill()
    return out


def held_median(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each held figure's median over the rounds."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def nice(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or value != value else round(value, digits)


async def main_async(args: argparse.Namespace, db: str, postmaster: int | None) -> None:
    source = corpus.load()
    print(source.describe(), flush=True)
    msgs = templates(source)
    average = sum(len(b) + len(a) + 16 for b, a in msgs) / len(msgs)
    print(
        f"{len(msgs)} messages ({average / 1024:.1f} KiB on average), {CONNECTIONS} connections;"
        f" {os.cpu_count()} CPUs; held {args.seconds:g} s, live {args.live_seconds:g} s at"
        f" {LIVE_RATE:g} msg/s; every {FILTERED}th destination takes one message in ten"
    )
    bound = permits_from_env(
        {} if args.worker_statements is None else {PERMITS_ENV: str(args.worker_statements)}
    )
    print(
        "live phase's workers' process: statements at once"
        f" {bound.limit if bound else 'unbounded'} ({PERMITS_ENV})"
    )
    print(
        f"{'dests':>5} {'held msg/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'WAL B/msg':>10}"
        f" {'table B/msg':>11} {'ingest us':>9} {'backend us':>10} | {'live p50':>8}"
        f" {'p99 ms':>7} {'deliv/s':>8} {'us/deliv':>8}"
    )
    results: dict[int, dict[str, float]] = {}
    rounds: dict[int, list[dict[str, float]]] = {count: [] for count in args.destinations}
    async with contextlib.AsyncExitStack() as stack:
        fronts = {
            count: await stack.enter_async_context(front_door(db, count))
            for count in args.destinations
        }
        # The held phase in rounds, the counts in turn within each (1, 10, 50, 200, 1, 10,
        # ...): on a shared machine a rate measured for five seconds moves with the load, so
        # a ratio is taken within each round, where the counts ran a few seconds apart, and
        # the median of the rounds' ratios is the figure.
        for n in range(args.held_rounds):
            for count in args.destinations:
                rounds[count].append(await held_phase(args, db, fronts[count], msgs))
            print(
                f"  held round {n + 1}: "
                + ", ".join(f"{c} {rounds[c][-1]['held_rate']:.0f}" for c in args.destinations)
                + " msg/s",
                flush=True,
            )
        for count in args.destinations:
            results[count] = held_median(rounds[count]) | await live_phase(
                args, db, postmaster, fronts[count], msgs
            )
    for count in args.destinations:
        r = results[count]
        short = (
            ""
            if r["deliveries"] >= r["expected"]
            else f" ({r['deliveries']:.0f} of {r['expected']:.0f} delivered)"
        )
        print(
            f"{count:>5} {r['held_rate']:>10.1f} {r['held_p50']:>7.1f} {r['held_p99']:>7.1f}"
            f" {r['wal_bytes']:>10.0f} {r['table_bytes']:>11.0f} {r['ingest_cpu_us']:>9.0f}"
            f" {r['backend_cpu_us']:>10.0f} | {r['live_p50']:>8.1f} {r['live_p99']:>7.1f}"
            f" {r['delivery_rate']:>8.0f} {r['cpu_per_delivery_us']:>8.0f}{short}",
            flush=True,
        )
        states = sorted(
            ((k.removeprefix("state:"), v) for k, v in r.items() if k.startswith("state:")),
            key=lambda kv: -kv[1],
        )
        print(
            f"      live: run queue median {r['runq_median']:g} (max {r['runq_max']:g});"
            f" the workers' process (workers and receivers) {r['workers_process_us']:.0f} us"
            " a delivery; waited for a CPU a message: ingest"
            f" {r['runq_wait_ingest_ms']:.1f} ms, its backends {r['runq_wait_backends_ms']:.1f} ms,"
            f" the senders {r['runq_wait_senders_ms']:.1f} ms;"
            " ingest's backends (share of 20 ms samples): "
            + (", ".join(f"{k} {v:.2f}" for k, v in states) or "idle"),
            flush=True,
        )
        print(
            f"      live, per delivery: {r['commits_per_delivery']:.2f} commits,"
            f" {r['wal_records_per_delivery']:.1f} WAL records"
            f" ({r['wal_bytes_per_delivery']:.0f} B), {r['wal_writes_per_delivery']:.2f} WAL"
            f" writes and {r['wal_flushes_per_delivery']:.2f} flushes"
            f" ({r['wal_sync_ms_per_delivery']:.3f} ms flushing where timed)",
            flush=True,
        )
    first, last = min(results), max(results)

    def ratio(key: str, n: int) -> float | None:
        if n not in results or not results[first][key]:
            return None
        if key == "held_rate":  # the median of the rounds' own ratios
            return statistics.median(
                mine[key] / base[key] if base[key] else float("nan")
                for mine, base in zip(rounds[n], rounds[first], strict=True)
            )
        return results[n][key] / results[first][key]

    figures = {
        "messages": source.source,
        "destinations": list(results),
        "held_msg_s": {str(n): nice(r["held_rate"], 1) for n, r in results.items()},
        "held_rate_ratio_10": nice(ratio("held_rate", 10)),
        "held_rate_ratio_10_target": 0.8,
        "held_rate_ratio_200": nice(ratio("held_rate", 200)),
        "held_rate_ratio_200_target": 0.5,
        "held_ack_p99_ms": {str(n): nice(r["held_p99"], 1) for n, r in results.items()},
        "wal_bytes_per_message": {str(n): round(r["wal_bytes"]) for n, r in results.items()},
        "wal_ratio_most": nice(ratio("wal_bytes", last)),
        "wal_ratio_200_target": 3.0,
        "table_bytes_per_message": {str(n): round(r["table_bytes"]) for n, r in results.items()},
        "ingest_cpu_us_per_message": {
            str(n): round(r["ingest_cpu_us"]) for n, r in results.items()
        },
        "backend_cpu_us_per_message": {
            str(n): round(r["backend_cpu_us"]) for n, r in results.items()
        },
        "live_ack_p99_ms": {str(n): nice(r["live_p99"], 1) for n, r in results.items()},
        "live_ack_p99_200_target_ms": 50,
        "delivery_rate": {str(n): nice(r["delivery_rate"], 1) for n, r in results.items()},
        "cpu_us_per_delivery": {
            str(n): nice(r["cpu_per_delivery_us"], 0) for n, r in results.items()
        },
        "cpu_per_delivery_ratio_most": nice(ratio("cpu_per_delivery_us", last)),
        "cpu_per_delivery_ratio_200_target": 1.25,
    }

    def verdict(name: str, value: float | None, target: float, below: bool) -> None:
        if value is None:
            print(f"  {name}: not measured in this run (target {target:g})")
            return
        met = value < target if below else value >= target
        print(
            f"  {name}: {value:g} ({'under' if below else 'at least'} {target:g}):"
            f" {'met' if met else 'NOT MET'}"
        )

    print("targets (issue 43):")
    verdict("held rate at 10 / at 1", nice(ratio("held_rate", 10)), 0.8, below=False)
    verdict("held rate at 200 / at 1", nice(ratio("held_rate", 200)), 0.5, below=False)
    verdict(
        "WAL per message at 200 / at 1",
        nice(ratio("wal_bytes", 200)) if 200 in results else None,
        3.0,
        below=True,
    )
    verdict(
        "CPU per delivery at 200 / at 1 (within)",
        nice(ratio("cpu_per_delivery_us", 200)) if 200 in results else None,
        1.25,
        below=True,
    )
    verdict(
        "live ACK p99 at 200, ms",
        nice(results[200]["live_p99"], 1) if 200 in results else None,
        50.0,
        below=True,
    )
    print(
        "  one destination no slower, lanes and encryption unchanged: bench/ingest.py,"
        " bench/delivery.py, bench/lanes.py, bench/encryption.py against their yardsticks"
    )
    print(
        f"ingest at {last} destinations: {figures['held_msg_s'][str(last)]} msg/s held, ratio"
        f" {nice(ratio('held_rate', last))} to one; WAL per message ratio"
        f" {figures['wal_ratio_most']}; live ACK p99 {figures['live_ack_p99_ms'][str(last)]} ms"
    )
    emit("fanout", figures)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--serve":
        asyncio.run(serve(os.environ["INTURN_DSN"], sys.argv[2], sys.argv[3:]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=None, help="a Postgres server (default: one of its own)")
    parser.add_argument("--seconds", type=float, default=5.0, help="held seconds per count")
    parser.add_argument(
        "--held-rounds",
        type=int,
        default=3,
        help="held phases per count, the counts taking turns (the ratio: the rounds' median)",
    )
    parser.add_argument("--live-seconds", type=float, default=10.0, help="live seconds per count")
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="live drain bound, s")
    parser.add_argument(
        "--lower-delivery",
        choices=LOWER_MODES,
        default="none",
        help="experiment: the live phase's delivery side below ingest in CPU priority"
        " (nice 19, SCHED_IDLE, or a cgroup v1 cpu group idle or of weight 2; root)",
    )
    parser.add_argument(
        "--lower-scope",
        choices=("process", "all"),
        default="all",
        help="what --lower-delivery lowers: the workers' process, or it and their backends",
    )
    parser.add_argument(
        "--worker-statements",
        type=int,
        default=None,
        help="the live phase's bound on worker statements at once (INTURN_WORKER_STATEMENTS;"
        " 0: none; default: inturn local's, half the CPUs)",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="load pg_stat_statements in its own server and print the live phase's statements",
    )
    parser.add_argument(
        "--destinations",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 10, 50, 200],
        help="destination counts, comma-separated",
    )
    args = parse_args(
        parser,
        argv,
        {
            "seconds": 1.0,
            "held_rounds": 1,
            "live_seconds": 1.0,
            "drain_timeout": 30.0,
            "destinations": [1, 10],
        },
    )
    if args.tiny and args.dsn is None:
        args.dsn = os.environ.get("INTURN_DSN")
    if args.dsn:
        with fresh_database(args.dsn, "fanout") as db:
            migrate(db)
            asyncio.run(main_async(args, db, None))
        return
    with (
        own_server(max(args.destinations) * 3 + 60, args.statements) as (server, data),
        fresh_database(server, "fanout") as db,
    ):
        migrate(db)
        asyncio.run(main_async(args, db, postmaster_pid(data)))


if __name__ == "__main__":
    main()
