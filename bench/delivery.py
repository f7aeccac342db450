"""Delivery benchmark: one destination, one worker, a receiver that ACKs at once.

    .venv/bin/python bench/delivery.py [--dsn DSN] [--messages 20000] [--rounds 1]

Prints figures and asserts nothing about time. Every run is on the same Postgres server, each
in a fresh database of its own, against a ``MllpReceiver`` in this process:

* ``delivery``: N messages (the sizes of the samples in ``../shared/samples/hl7``, each with a
  unique MSH-10, terminators normalised as ingest stores them) are stored first (not timed as
  delivery): once each in the channel's log as ingest stores them (``--store log``, the
  default: the worker pulls them into slim rows and reads each payload from the log), or with
  ``--store rows`` as rows of ``inturn_delivery`` holding their own payload (``queue.enqueue``,
  the layout before issue 43); then one ``inturn worker -f <manifest>`` process drains them
  through the real ``MllpSender``. The rate is N over the time from the first message's
  arrival at the receiver to the queue being empty (so the worker's process start-up is left
  out; the pulls are in it).
* ``floor`` and ``floor-after``: the yardstick, the simplest correct loop
  (:func:`floor_worker_main`), drains the same messages before and after each ``delivery``:
  the head query with its keyset bound, the message written on a plain asyncio stream and its
  AA read back, the delivered mark committed synchronously, on inturn's own table, always on
  rows holding their own payload (the fixed reference: the layout the target was set on).
  The ratio is taken pair by pair (``--rounds`` pairs; the median is reported).
* ``floor-round4``: the yardstick of round 4, once, for comparison: its head query had no
  lower bound (each scan stepped over the dead entries every delivered row leaves in the
  partial head index until a vacuum) and it sent with inturn's ``MllpSender``.
  ``--yardstick-parts`` adds the two loops that take one of those two corrections each.
* ``large-table``: the same after 1,000,000 finished rows (state ``delivered``) were put in the
  table, half for the same destination and half for 99 others, then ``VACUUM ANALYZE``.
* ``traced``: as ``delivery``, with OpenTelemetry traces on in the worker
  (``OTEL_TRACES_EXPORTER=otlp``, OTLP/HTTP to a sink in this process that reads and drops each
  export): one ``inturn.attempt`` and one ``inturn.delivered`` span per message. ``delivery`` is
  the same worker with tracing off (every ``OTEL_*`` variable removed), so the two rates say
  what tracing costs when on; what its hooks cost when off is printed in nanoseconds per message.
* ``procrastinate``: the same messages as Procrastinate jobs of one task, deferred with
  ``lock=<destination>`` (one at a time, in id order), drained by one worker process
  (``run_worker_async(concurrency=1, wait=False)``) whose task sends each payload with the same
  ``MllpSender``, one connection kept across jobs.
* ``encrypted``: as ``delivery``, with payloads sealed at enqueue (a key store database and a
  master key folder made for the run) and the worker started with ``--payload-keys``: it opens
  each envelope right before the send, keys cached after the first message of each patient.
  ``encrypted_rate_ratio`` is its rate over ``delivery``'s (:func:`run_encrypted`; target 0.9).
* ``scoped``: as ``delivery``, with the worker logged in as its destination's own login
  (``inturn migrate --create-roles`` with a prefix of the run's own, then
  ``inturn_worker_login`` as the operator makes it with ``--worker-logins per-destination``), so
  that every statement it runs meets the worker role's row policies (docs/explanation/security.md
  "One login per destination"). ``scoped_rate_ratio`` is its rate over ``delivery``'s: what the
  database's per-destination check costs the delivered mark and the head query.
* ``catch-up`` and ``catch-up-floor``: a larger backlog drained by inturn and by the yardstick
  against a receiver that waits before each ACK.

A new case is one more entry in ``main_async``'s ``runs`` (a label and a coroutine that returns
a :class:`Result`) and its figures in ``figures``.

CPU per message (user + system, after the first arrival) is printed beside each rate: the
draining process's own, its Postgres backend's (read from ``/proc``, so only for a server on
this host) and this process's (the receiver's); and the transactions committed per message.
Per-message latency is the time between consecutive message arrivals at the receiver, which
answers each one at once: one full delivery cycle (head query, send, ACK, delivered mark).
Peak RSS is the worker process's own ``VmHWM``. The receiver counts lost, duplicated and
out-of-order messages by MSH-10. Each drain is capped (``--cap``, 75 s) so that the whole run
stays within a few minutes; a capped run says so and its rate counts what arrived.

The database is ``--dsn`` / ``INTURN_DSN`` (a server; the benchmark creates and drops its own
databases there), else an embedded Postgres started with ``pgserver`` in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import corpus
import encryption
import psycopg
from figures import emit, parse_args
from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.store import ingest, logins, queue
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import Message, NewItem
from inturn.worker.store.roles_apply import apply_roles
from inturn.worker.testing import MllpReceiver

BENCH_DIR = Path(__file__).resolve().parent
INTURN = Path(sys.executable).with_name("inturn")
NAMESPACE, NAME = "bench", "delivery"
DESTINATION = f"{NAMESPACE}/{NAME}"
CHANNEL = "bench"
#: Rows per enqueue transaction (and per Procrastinate batch defer), and messages per store
#: into the channel log (``--store log``; sealed too: test_large_batch.py stores 8 MB at once).
ENQUEUE_BATCH = 500
#: Finished rows put in the table before the large-table run.
LARGE_TABLE_ROWS = 1_000_000
#: Longest drain of one run, seconds: the whole benchmark stays within about 5 minutes.
CAP_SECONDS = 75.0
#: Wait after the worker exits before reading the server's WAL counters.
STATS_SETTLE_SECONDS = 1.0
#: Seconds between two "is the queue empty yet" polls.
POLL_SECONDS = 0.01


# --- messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A sample split around its MSH-10, so that a message is ``head + control_id + tail``."""

    name: str
    head: bytes
    tail: bytes
    message_type: str
    size: int  # the sample's own size, bytes


def load_templates(source: corpus.Messages) -> tuple[list[Template], list[str]]:
    """The usable messages of ``source``, sorted by name, and the names of those skipped (with
    why)."""
    templates: list[Template] = []
    skipped: list[str] = []
    for name, data in source.items:
        try:
            header = parse_header(data)
        except HeaderError as exc:
            skipped.append(f"{name} ({exc})")
            continue
        if b"\x1c" in data or b"\x00" in data:
            skipped.append(f"{name} (contains 0x1C or NUL)")
            continue
        text = data.decode("latin-1")
        start = text.find("MSH")
        end = min(
            (i for i in (text.find("\r", start), text.find("\n", start)) if i >= 0), default=-1
        )
        segment = text[start:] if end < 0 else text[start:end]
        sep = segment[3]
        fields = segment.split(sep)
        if len(fields) < 10:
            skipped.append(f"{name} (no MSH-10)")
            continue
        offset = start + len(sep.join(fields[:9])) + 1
        old = fields[9]
        head, tail = data[:offset], data[offset + len(old) :]
        templates.append(Template(name, head, tail, header.message_type.type_key, len(data)))
    return templates, skipped


def control_id(run: str, n: int) -> str:
    """A unique MSH-10 whose order is the enqueue order."""
    return f"{run}{n:08d}"


def build_messages(templates: Sequence[Template], run: str, count: int) -> list[NewItem]:
    """``count`` messages cycling through the templates, each with its own MSH-10."""
    items = []
    for n in range(count):
        t = templates[n % len(templates)]
        cid = control_id(run, n)
        payload = normalise_terminators(t.head + cid.encode() + t.tail)  # as ingest stores it
        items.append(NewItem(DESTINATION, CHANNEL, cid, t.message_type, payload))
    return items


# --- the receiver side ---------------------------------------------------------------------


class TimedList(list[bytes]):
    """The receiver's ``received`` list, stamping each arrival with ``time.perf_counter()``."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: bytes) -> None:
        self.times.append(time.perf_counter())
        super().append(item)


@dataclass
class Check:
    """What the receiver saw against what was enqueued."""

    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    foreign: int = 0
    delivered: int = 0  # distinct enqueued messages received
    undelivered: int = 0  # still queued when a capped run was stopped (not lost)


def check_order(received: Sequence[bytes], expected: Sequence[str], *, complete: bool) -> Check:
    """Count lost, duplicated and out-of-order messages by MSH-10.

    A message is out of order when it arrives (for the first time) after one enqueued later.
    ``complete`` says the queue was seen empty: every message missing is lost. Otherwise (a
    capped run) only those enqueued before the last one received count as lost.
    """
    rank = {cid: i for i, cid in enumerate(expected)}
    seen: set[str] = set()
    result = Check()
    highest = -1
    for payload in received:
        cid = parse_header(payload).control_id.strip()
        if cid not in rank:
            result.foreign += 1
            continue
        if cid in seen:
            result.duplicated += 1
            continue
        seen.add(cid)
        if rank[cid] < highest:
            result.out_of_order += 1
        highest = max(highest, rank[cid])
    result.delivered = len(seen)
    span = len(expected) if complete else highest + 1
    result.lost = span - sum(1 for cid in seen if rank[cid] < span)
    result.undelivered = len(expected) - span
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Result:
    """One run's figures."""

    label: str
    messages: int
    seconds: float = 0.0  # first arrival at the receiver -> queue empty (or the cap)
    startup_seconds: float = 0.0  # worker process start -> first arrival
    enqueue_seconds: float = 0.0
    times: list[float] = field(default_factory=list)  # arrival times at the receiver
    check: Check = field(default_factory=Check)
    peak_rss_kib: int = 0
    capped: bool = False
    wal: dict[str, float] = field(default_factory=dict)
    plan: str = ""
    cpu_us: float = 0.0  # the worker process's CPU (user + system) per message, microseconds
    backend_cpu_us: float = 0.0  # its Postgres backends' CPU per message (a local server only)
    receiver_cpu_us: float = 0.0  # this process's CPU per message: the receiver and the polls
    commits: float = 0.0  # transactions committed in the run's database per message
    # the machine's CPUs busy during the drain (first arrival to the queue empty, all processes,
    # read from /proc/stat), in cores; the drain's own (worker, its backends, the receiver) apart
    machine_cores: float = 0.0
    own_cores: float = 0.0

    @property
    def rate(self) -> float:
        """Distinct messages delivered per second."""
        return self.check.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def gaps(self) -> list[float]:
        """Seconds between consecutive arrivals at the receiver."""
        return [b - a for a, b in itertools.pairwise(self.times)]

    def _rate_between(self, lo: float, hi: float) -> float:
        """Arrival rate over the slice ``lo``..``hi`` (fractions) of the arrivals."""
        n = len(self.times)
        i, j = int(lo * (n - 1)), int(hi * (n - 1))
        span = self.times[j] - self.times[i]
        return (j - i) / span if span > 0 else 0.0

    def lines(self) -> Iterator[str]:
        gaps = self.gaps
        p50, p99 = percentile(gaps, 0.50), percentile(gaps, 0.99)
        c = self.check
        note = f"  (CAPPED: stopped with {c.undelivered} still queued)" if self.capped else ""
        cpu = f" (CPU per message {self.cpu_us:,.0f} us)" if self.cpu_us else ""
        yield (
            f"{self.label}: {c.delivered} of {self.messages} messages in {self.seconds:.2f}s"
            f" = {self.rate:,.0f} msg/s{cpu}{note}"
        )
        if len(self.times) > 10:
            yield (
                f"  arrival rate over the first 10% {self._rate_between(0, 0.1):,.0f} msg/s,"
                f" middle {self._rate_between(0.45, 0.55):,.0f}, last 10%"
                f" {self._rate_between(0.9, 1):,.0f}"
            )
        yield (
            f"  per message (gap between consecutive arrivals at the receiver):"
            f" p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms,"
            f" max {max(gaps, default=0) * 1e3:.1f} ms"
        )
        if self.cpu_us:
            yield (
                f"  CPU per message (user + system, after the first): loop {self.cpu_us:.0f} us,"
                f" its Postgres backend {self.backend_cpu_us:.0f} us, the receiver's process"
                f" {self.receiver_cpu_us:.0f} us; commits per message {self.commits:.2f}"
            )
        if self.machine_cores:
            yield (
                f"  the machine's CPUs during the drain: {self.machine_cores:.2f} of"
                f" {os.cpu_count()} cores busy, the drain's own processes {self.own_cores:.2f},"
                f" everything else (the move beside it, Postgres' background, other users)"
                f" {max(0.0, self.machine_cores - self.own_cores):.2f}"
            )
        yield (
            f"  worker peak RSS (VmHWM) {self.peak_rss_kib / 1024:.1f} MiB;"
            f" start-up to first arrival {self.startup_seconds:.2f}s;"
            f" enqueue {self.messages / max(self.enqueue_seconds, 1e-9):,.0f} msg/s (not timed)"
        )
        yield (
            f"  receiver: lost {c.lost}, duplicated {c.duplicated}, out-of-order {c.out_of_order}"
            + (f", foreign {c.foreign}" if c.foreign else "")
        )
        if self.wal and c.delivered:
            per = {k: v / c.delivered for k, v in self.wal.items()}
            yield "  WAL per message: " + ", ".join(f"{k} {v:,.2f}" for k, v in per.items())
        if self.plan:
            yield f"  head query plan at start: {self.plan}"


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when gone)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    return 0.0


def machine_busy_seconds() -> float:
    """CPU seconds every CPU of this machine has spent busy since boot (``/proc/stat``; 0 when
    unreadable): user, nice, system, irq, softirq and steal."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / CLK_TCK
    return 0.0


def vm_hwm_kib(pid: int) -> int:
    """The peak resident set of process ``pid`` in KiB (0 when unreadable)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


# --- the database --------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server(dsn: str | None) -> Iterator[tuple[str, Path | None]]:
    """The server DSN to use, and the data directory when it is an embedded server."""
    if dsn:
        yield dsn, None
        return
    import pgserver

    data = Path(tempfile.mkdtemp(prefix="inturn-bench-pg-"))
    server = pgserver.get_server(data, cleanup_mode="delete")  # type: ignore[attr-defined]
    try:
        yield server.get_uri(), data
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def fresh_database(server_dsn: str, label: str) -> Iterator[str]:
    """A database of our own on the server, dropped afterwards."""
    name = f"inturn_bench_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_settings(server_dsn: str) -> list[str]:
    names = [
        "server_version",
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
        "commit_delay",
        "shared_buffers",
        "max_wal_size",
        "full_page_writes",
    ]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s) ORDER BY name",
            (names,),
        )
        return [f"{n}={s}{u or ''}" for n, s, u in cur.fetchall()]


async def checkpoint(conn: AsyncConnection[Any]) -> None:
    """Flush dirty buffers before timing, so a checkpoint of the load does not land in it."""
    with contextlib.suppress(psycopg.Error):
        await conn.execute("CHECKPOINT")


async def wal_counters(conn: AsyncConnection[Any]) -> dict[str, float]:
    """Server-wide WAL counters from ``pg_stat_wal`` (empty when unavailable)."""
    with contextlib.suppress(psycopg.Error):
        cur = await conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, wal_sync FROM pg_stat_wal"
        )
        row = await cur.fetchone()
        if row:
            names = ("wal_records", "wal_fpi", "wal_bytes", "wal_sync")
            return dict(zip(names, map(float, row), strict=True))
    return {}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


async def fill_finished(dsn: str, rows: int) -> float:
    """Put ``rows`` finished rows in the table (half for our destination), VACUUM ANALYZE."""
    t0 = time.perf_counter()
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            """
            INSERT INTO inturn_delivery
                (destination, channel, control_id, message_type, payload, size, state, attempts,
                 enqueued_at, next_attempt, last_attempt, finished_at)
            SELECT CASE WHEN g %% 2 = 0 THEN %(dest)s ELSE %(other)s || (g %% 99) END,
                   %(channel)s, 'OLD' || g, 'ADT^A01', %(payload)s, 256, 'delivered', 1,
                   now() - interval '2 hours', now() - interval '2 hours',
                   now() - interval '1 hour', now() - interval '1 hour'
              FROM generate_series(1, %(rows)s) AS g
            """,
            {
                "dest": DESTINATION,
                "other": f"{NAMESPACE}/other-",
                "channel": CHANNEL,
                "payload": b"x" * 256,
                "rows": rows,
            },
        )
        await conn.execute("VACUUM ANALYZE inturn_delivery")
    return time.perf_counter() - t0


async def enqueue_all(
    dsn: str,
    items: Sequence[NewItem],
    keys: tuple[str, str] | None = None,
    *,
    log: bool = False,
) -> float:
    """Enqueue ``items`` in batches; return the seconds it took. Then analyse and checkpoint.
    With ``keys`` (``(payload_keys_dir, key_dsn)``), each payload is sealed for its row.

    ``log``: store each message once in its channel's log, as ingest does since issue 43
    (:func:`inturn.worker.store.ingest.store_batch`, duplicate window off), for the worker to
    pull into slim rows and read through ``inturn_log_payload``; else each as a row of
    ``inturn_delivery`` holding its own payload (the layout before the channel log, which the
    yardstick drains: the fixed reference)."""
    codec = None
    if keys is not None:
        from inturn.worker.operations.payload_keys import open_codec

        codec = await open_codec(*keys)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        if log:
            await store_in_log(conn, items, codec)
        else:
            for i in range(0, len(items), ENQUEUE_BATCH):
                await queue.enqueue(conn, items[i : i + ENQUEUE_BATCH], codec)
        took = time.perf_counter() - t0
        await conn.execute("VACUUM ANALYZE inturn_delivery")
        await conn.execute("VACUUM ANALYZE inturn_message")
        await checkpoint(conn)
    return took


async def store_in_log(
    conn: AsyncConnection[Any], items: Sequence[NewItem], codec: PayloadCodec | None = None
) -> None:
    """Store ``items`` once each in their channel's log, as ingest stores what it receives
    (:func:`inturn.worker.store.ingest.store_batch`, the duplicate window off), each routed to
    its own destination, :data:`ENQUEUE_BATCH` a transaction; sealed when ``codec`` seals.
    ``conn``: autocommit, outside a transaction.

    Raises:
        ValueError: the items of one batch name more than one channel.
    """
    routes = ingest.RouteSets()
    for i in range(0, len(items), ENQUEUE_BATCH):
        batch = items[i : i + ENQUEUE_BATCH]
        channels = {it.channel for it in batch}
        if len(channels) != 1:
            raise ValueError(f"one channel a batch, not {sorted(channels)}")
        await ingest.store_batch(
            conn,
            channel=batch[0].channel,
            route_sets=[[it.destination] for it in batch],
            messages=[
                Message(it.control_id, it.message_type, it.payload, sha256(it.payload).digest())
                for it in batch
            ],
            window_seconds=0.0,
            payloads=codec,
            cache=routes,
        )


async def head_plan(conn: AsyncConnection[Any]) -> str:
    """The access path the planner picks for the head query now (its scan node)."""
    params = {"destination": DESTINATION, "after": 0, "holder": "bench", "epoch": 0, "renew": True}
    cur = await conn.execute("EXPLAIN " + queue.Q["head"], params)
    lines = [str(r[0]).strip() for r in await cur.fetchall()]
    scans = [
        line.removeprefix("->  ") for line in lines if "Scan" in line and "inturn_delivery" in line
    ]
    return (scans[0] if scans else lines[0]).split("  (cost")[0]


# --- draining, measured --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def receiver(ack_delay: float = 0.0) -> AsyncIterator[tuple[MllpReceiver, TimedList]]:
    """A local MLLP receiver stamping arrivals; it sleeps ``ack_delay`` seconds before each ACK
    (a receiver that takes its time to commit, as in the catch-up runs)."""
    async with MllpReceiver() as rx:
        rx.delay_seconds = ack_delay
        timed = TimedList()
        rx.received = timed
        yield rx, timed


#: The ``application_name`` of a connection a benchmark runs beside the drain (bench/retention.py's
#: maintenance): :class:`BackendCpu` leaves its backend out of the drain's CPU.
BESIDE_APPLICATION = "inturn-bench-beside"


class BackendCpu:
    """The CPU the run's Postgres backends spend, read from ``/proc`` (a server on this host).

    :meth:`start` (at the first arrival) finds the client backends of the run's database other
    than the benchmark's own connection and those named :data:`BESIDE_APPLICATION`, and reads
    their CPU; :meth:`sample` reads it again (a
    backend's last reading is kept after it exits); :meth:`ended` takes the final figure a
    child reported for its own backend just before it closed. :meth:`commits` counts the
    transactions committed in the database since :meth:`start`, the benchmark's own polls
    left out. Readings are 0 for a server on another host.
    """

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.polls = 0
        self.commits_at_start = 0.0

    async def _query(self, sql: str) -> list[tuple[Any, ...]]:
        self.polls += 1
        cur = await self.conn.execute(sql)  # type: ignore[arg-type]
        return await cur.fetchall()

    async def start(self) -> None:
        rows = await self._query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            f" AND application_name <> '{BESIDE_APPLICATION}'"
        )
        self.first = {int(pid): cpu_seconds(int(pid)) for (pid,) in rows}
        self.last = dict(self.first)
        self.commits_at_start = await self._xact_commit()
        self.polls = 0

    async def sample(self) -> None:
        for pid in self.first:
            now = cpu_seconds(pid)
            if now > 0:
                self.last[pid] = now

    def ended(self, report: dict[str, Any]) -> None:
        pid = int(report["pid"])
        if pid in self.first:
            self.last[pid] = max(self.last[pid], float(report["cpu_seconds"]))

    def used(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.first)

    async def _xact_commit(self) -> float:
        # pg_stat_database as of this transaction: a new snapshot each time
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = await self._query(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return float(rows[0][0]) if rows else 0.0

    async def commits(self) -> float:
        """Commits since :meth:`start` by the others (call after the stats have settled)."""
        if not self.first:
            return 0.0
        polls = self.polls + 3  # the WAL counters' query, this one and its snapshot reset
        return max(0.0, await self._xact_commit() - self.commits_at_start - polls)


async def drain(
    result: Result,
    command: Callable[[int], list[str]],
    env: dict[str, str],
    dsn: str,
    pending: Callable[[AsyncConnection[Any]], Awaitable[bool]],
    expected: Sequence[str],
    cap: float,
    ack_delay: float = 0.0,
    first_arrival: Callable[[int, Callable[[], int]], Awaitable[None]] | None = None,
    drained: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Start the worker process ``command(receiver_port)`` against a fresh receiver (answering
    after ``ack_delay`` seconds) and time it until the queue is empty (``pending`` turns False)
    or ``cap`` seconds have passed. ``first_arrival(pid, arrived)`` is awaited when the first
    message arrives (the worker's process id; ``arrived()``: how many have arrived so far),
    ``drained(pid)`` once the queue is empty, before the worker is stopped
    (bench/instructions.py counts the worker's instructions between the two)."""
    async with (
        receiver(ack_delay) as (rx, timed),
        await AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        env = {**env, "BENCH_MLLP_HOST": "127.0.0.1", "BENCH_MLLP_PORT": str(rx.port)}
        cmd = command(rx.port)
        before = await wal_counters(conn)
        t_start = time.perf_counter()
        # Its log goes to a file: a pipe read only at the end would stall a worker that logs
        # more than the pipe holds (a long run of failures). Standard output is one line.
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=errors
        )
        deadline = t_start + cap
        complete = False
        cpu_at_first: list[float] = []
        backends = BackendCpu(conn)

        async def first_arrival_cpu() -> None:
            # the worker's CPU seconds when the first message arrives: its start-up left out
            while not timed:
                await asyncio.sleep(0.002)
            if first_arrival is not None:
                await first_arrival(proc.pid, lambda: len(timed))
            cpu_at_first.append(cpu_seconds(proc.pid))
            cpu_at_first.append(time.process_time())
            cpu_at_first.append(machine_busy_seconds())
            await backends.start()

        async def polled(check: Callable[[AsyncConnection[Any]], Awaitable[bool]]) -> bool:
            backends.polls += 1  # one transaction of this process's own in the database
            return await check(conn)

        sampler = asyncio.create_task(first_arrival_cpu())
        cpu_at_end = 0.0
        try:
            while time.perf_counter() < deadline:
                if len(timed) >= len(expected) and not await polled(pending):
                    complete = True
                    if drained is not None:
                        await drained(proc.pid)
                    break
                if proc.returncode is not None and not await polled(pending):
                    complete = True
                    break
                if cpu_at_first:
                    await backends.sample()
                with contextlib.suppress(TimeoutError):
                    if len(timed) < len(expected):
                        await rx.wait_for(len(expected), timeout=min(0.5, cap))
                    else:
                        await asyncio.sleep(POLL_SECONDS)
            t_end = time.perf_counter()
            result.peak_rss_kib = vm_hwm_kib(proc.pid)
            cpu_at_end = cpu_seconds(proc.pid)
            receiver_cpu = time.process_time() - (cpu_at_first[1] if cpu_at_first else 0.0)
            machine_cpu = machine_busy_seconds() - (cpu_at_first[2] if cpu_at_first else 0.0)
            await backends.sample()
        finally:
            sampler.cancel()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
            except TimeoutError:
                proc.kill()
                out, _ = await proc.communicate()
            errors.seek(0)
            err = errors.read()
            errors.close()
        # Backends report their WAL statistics at exit (at most once a second before that).
        await asyncio.sleep(STATS_SETTLE_SECONDS)
        result.wal = delta(await wal_counters(conn), before)
        commits = await backends.commits()
        for line in out.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                result.peak_rss_kib = max(result.peak_rss_kib, int(json.loads(line)["vm_hwm_kib"]))
            with contextlib.suppress(ValueError, KeyError, TypeError):
                cpu_at_end = max(cpu_at_end, float(json.loads(line)["cpu_seconds"]))
            with contextlib.suppress(ValueError, KeyError, TypeError):
                backends.ended(json.loads(line)["backend"])
        result.capped = not complete
        tail = err.decode(errors="replace").strip()[-1500:]
        if tail and (result.capped or proc.returncode not in (0, -signal.SIGTERM)):
            print(f"  ({result.label}: worker exit {proc.returncode}:)\n{tail}", file=sys.stderr)
        result.times = list(timed.times)
        if timed.times:
            result.startup_seconds = timed.times[0] - t_start
            result.seconds = t_end - timed.times[0]
        result.check = check_order(list(timed), expected, complete=complete)
        if cpu_at_first and cpu_at_end > cpu_at_first[0] and result.check.delivered > 1:
            per = 1e6 / (result.check.delivered - 1)
            result.cpu_us = (cpu_at_end - cpu_at_first[0]) * per
            result.backend_cpu_us = backends.used() * per
            result.receiver_cpu_us = receiver_cpu * per
            result.commits = commits / (result.check.delivered - 1)
            if result.seconds > 0:
                result.machine_cores = machine_cpu / result.seconds
                result.own_cores = (
                    cpu_at_end - cpu_at_first[0] + backends.used() + receiver_cpu
                ) / result.seconds


# --- the inturn runs -----------------------------------------------------------------------


def write_manifest(directory: Path, port: int) -> Path:
    path = directory / "destination.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        f"metadata: {{name: {NAME}, namespace: {NAMESPACE}}}\n"
        "spec:\n"
        f"  channel: {CHANNEL}\n"
        f"  sender: {{mllp: {{host: 127.0.0.1, port: {port}}}}}\n"
        "  retry: {maxAttempts: 0}\n"
        "  idleSeconds: 1\n"
    )
    return path


@contextlib.contextmanager
def dropped_roles(server_dsn: str, prefix: str | None) -> Iterator[None]:
    """Drop every role named ``prefix...`` when the block ends (roles are the server's, not the
    run's database's: enter this before the database, so that it is dropped first)."""
    try:
        yield
    finally:
        if prefix is not None:
            with psycopg.connect(server_dsn, autocommit=True) as conn:
                names = conn.execute(
                    "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)"
                    " ORDER BY length(rolname) DESC",
                    (prefix,),
                ).fetchall()
                for (name,) in names:
                    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


async def worker_login(dsn: str, prefix: str) -> dict[str, str]:
    """The component roles (prefix ``prefix``) and the destination's own worker login, made as
    the operator makes them; the worker's environment for it (``INTURN_DB_USER`` and
    ``INTURN_DB_PASSWORD``). Checks that the login is scoped to the destination."""
    apply_roles(dsn, prefix)
    password = uuid.uuid4().hex
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        login = await logins.ensure_login(conn, DESTINATION, password)
    async with await AsyncConnection.connect(
        make_conninfo(dsn, user=login, password=password), autocommit=True
    ) as conn:
        scope = await (await conn.execute("SELECT inturn_worker_destination()")).fetchone()
    if scope != (DESTINATION,):
        raise RuntimeError(f"the login {login} is scoped to {scope}, not {DESTINATION}")
    return {"INTURN_DB_USER": login, "INTURN_DB_PASSWORD": password}


async def inturn_pending(conn: AsyncConnection[Any]) -> bool:
    return await queue.blocked(conn, DESTINATION)


async def run_inturn(
    server_dsn: str,
    label: str,
    templates: Sequence[Template],
    count: int,
    cap: float,
    prefill: int = 0,
    ack_delay: float = 0.0,
    yardstick: str | None = None,
    traced: bool = False,
    keys: tuple[str, str] | None = None,
    prepare: Callable[[str], Awaitable[None]] | None = None,
    after: Callable[[str, Result], Awaitable[None]] | None = None,
    scoped: bool = False,
    log: bool = False,
) -> Result:
    """One drain of ``count`` messages by ``inturn worker`` (or, with ``yardstick`` naming one
    of :data:`YARDSTICKS`, by that loop of :func:`floor_worker_main`) in a fresh database.
    ``prepare(dsn)`` runs once it is migrated, before the messages are queued (another
    benchmark's fill, e.g. ``bench/retention.py``'s history); ``after(dsn, result)`` once they
    are delivered, before the database is dropped. ``scoped``: the worker logs in as the
    destination's own login (:func:`worker_login`). ``log``: the messages are stored in the
    channel log as ingest stores them (:func:`enqueue_all`), for inturn's worker to pull."""
    result = Result(label, count)
    items = build_messages(templates, "L" if prefill else "D", count)
    prefix = f"bench{uuid.uuid4().hex[:8]}_" if scoped else None
    with (
        dropped_roles(server_dsn, prefix),
        fresh_database(server_dsn, label.replace("-", "_")) as dsn,
        tempfile.TemporaryDirectory(prefix="inturn-bench-") as tmp,
    ):
        migrate(dsn)
        login = await worker_login(dsn, prefix) if prefix is not None else {}
        if prefill:
            took = await fill_finished(dsn, prefill)
            print(f"  ({label}: {prefill:,} finished rows inserted and vacuumed in {took:.1f}s)")
        if prepare is not None:
            await prepare(dsn)
        await drain_in(
            result, dsn, items, cap, tmp, ack_delay, yardstick, traced, keys, login, log=log
        )
        if after is not None:
            await after(dsn, result)
    return result


async def drain_in(
    result: Result,
    dsn: str,
    items: Sequence[NewItem],
    cap: float,
    tmp: str,
    ack_delay: float = 0.0,
    yardstick: str | None = None,
    traced: bool = False,
    keys: tuple[str, str] | None = None,
    login: dict[str, str] | None = None,
    *,
    log: bool = False,
) -> None:
    """Queue ``items`` in the migrated database ``dsn`` and time their drain by ``inturn
    worker`` (or a :data:`YARDSTICKS` loop) into ``result``; ``tmp``: a folder for its manifest.
    :func:`run_inturn`'s drain, also run again in the same database (bench/retention.py drains
    the database with history more than once); ``log`` as there."""
    result.enqueue_seconds = await enqueue_all(dsn, items, keys, log=log)
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        result.plan = await head_plan(conn)

    def command(port: int) -> list[str]:
        if yardstick is not None:
            return [
                *(sys.executable, str(Path(__file__).resolve())),
                *("--floor-worker", dsn, "--yardstick", yardstick),
            ]
        manifest = write_manifest(Path(tmp), port)
        return [
            *(str(INTURN), "worker", "-f", str(manifest)),
            *("--http-host", "127.0.0.1", "--http-port", "0", "--log-level", "WARNING"),
            *(("--payload-keys", keys[0], "--key-dsn", keys[1]) if keys else ()),
        ]

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["INTURN_DSN"] = dsn
    env.update(login or {})
    expected = [i.control_id for i in items]
    async with contextlib.AsyncExitStack() as stack:
        if traced:
            port = await stack.enter_async_context(otlp_sink())
            env["OTEL_TRACES_EXPORTER"] = "otlp"
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        await drain(result, command, env, dsn, inturn_pending, expected, cap, ack_delay)


def hooks_off_ns(rounds: int = 200_000) -> float:
    """Nanoseconds the worker's tracing hooks take per delivered message when tracing is off
    (attempt started, attempt ended, delivered; inturn.worker.tracing), in this process."""
    from inturn.worker import tracing

    assert not tracing.enabled()
    started = time.perf_counter_ns()
    for _ in range(rounds):
        attempt = tracing.attempt_started("bench/delivery", 1, "X", None, 1, "mllp x:1")
        tracing.attempt_ended(attempt, None)
        tracing.finished(attempt, "delivered", 1)
    return (time.perf_counter_ns() - started) / rounds


@contextlib.asynccontextmanager
async def otlp_sink() -> AsyncIterator[int]:
    """An OTLP/HTTP endpoint (``POST /v1/traces``) that reads each export and drops it; its
    port."""
    from aiohttp import web

    async def export(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


# --- the yardsticks ------------------------------------------------------------------------

#: The corrected yardstick's head: the oldest pending row above the id finished last (a keyset
#: bound, as the worker's head query has), so that the scan starts there instead of stepping
#: over the dead entries every delivered row leaves in the partial head index until a vacuum.
FLOOR_HEAD = (
    "SELECT id, control_id, payload FROM inturn_delivery"
    " WHERE destination = %s AND state = 'pending' AND id > %s ORDER BY id LIMIT 1"
)
#: Round 4's yardstick head, without a lower bound (kept for one round, to show the change).
ROUND4_HEAD = (
    "SELECT id, control_id, payload FROM inturn_delivery"
    " WHERE destination = %s AND state = 'pending' ORDER BY id LIMIT 1"
)
#: Both yardsticks' mark, committed synchronously (autocommit, ``synchronous_commit = on``).
FLOOR_MARK = (
    "UPDATE inturn_delivery SET state = 'delivered', finished_at = clock_timestamp() WHERE id = %s"
)


@dataclass(frozen=True)
class Yardstick:
    """One shape of the simplest correct loop (:func:`floor_worker_main`).

    Attributes:
        keyset: the head query has the keyset bound (``id > the id finished last``).
        stream: the message goes on a plain asyncio stream (write one block, read one block,
            check its MSA) instead of inturn's ``MllpSender``.
    """

    keyset: bool
    stream: bool


#: The yardsticks by name: ``corrected`` is the floor the worker is held to; ``round4`` is the
#: one the performance page used until issue 33; the other two take one change each, so that
#: a run with ``--yardstick-parts`` says which of the two changes moved the rate.
YARDSTICKS = {
    "corrected": Yardstick(keyset=True, stream=True),
    "round4": Yardstick(keyset=False, stream=False),
    "keyset-only": Yardstick(keyset=True, stream=False),
    "stream-only": Yardstick(keyset=False, stream=True),
}


class StreamLink:
    """The yardstick's MLLP: one plain asyncio connection, one block written and one read.

    It checks what correctness needs of an answer (HL7 v2.5 chapter 2, the MSA segment): MSA-1
    is AA and MSA-2 the message's MSH-10. No framing tolerance, no matching of late answers, no
    reconnect: the benchmark's receiver answers every message at once on one connection.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> StreamLink:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def send(self, payload: bytes, control_id: str) -> None:
        """Write ``payload`` as one block and wait for its AA.

        Raises:
            RuntimeError: the answer is not an AA naming ``control_id``.
        """
        self.writer.write(b"\x0b" + payload + b"\x1c\r")
        await self.writer.drain()
        answer = await self.reader.readuntil(b"\x1c\r")
        at = answer.find(b"\rMSA")
        if at < 0:
            raise RuntimeError(f"no MSA in the answer to {control_id!r}")
        segment = answer[at + 1 :].split(b"\r", 1)[0]
        fields = segment.split(segment[3:4])
        if fields[1:3] != [b"AA", control_id.encode()]:
            raise RuntimeError(f"answer {segment[:80]!r} to {control_id!r}")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def floor_worker_main(conninfo: str, shape: Yardstick) -> None:
    """The yardstick (a child process, like the worker): the simplest correct loop.

    Take the head, send it, mark it delivered with a synchronous commit, repeat until the queue
    is empty; on inturn's own table (every index its migrations create), against the same
    receiver in the benchmark's process. No lock, no LISTEN, no backoff, no metrics, no
    logging: what is left is the floor of the design's cost per message (two round trips, one
    commit flush, one MLLP exchange), which inturn's worker is measured against. ``shape``
    picks the head query (with or without its keyset bound) and the sender (a plain stream or
    inturn's ``MllpSender``); see :data:`YARDSTICKS`.
    """
    host, port = os.environ["BENCH_MLLP_HOST"], int(os.environ["BENCH_MLLP_PORT"])
    link = await StreamLink.open(host, port) if shape.stream else None
    sender = MllpSender(MllpSenderConfig(host, port))
    after = 0
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("SET synchronous_commit = on")
        while True:
            if shape.keyset:
                cur = await conn.execute(FLOOR_HEAD, (DESTINATION, after))
            else:
                cur = await conn.execute(ROUND4_HEAD, (DESTINATION,))
            row = await cur.fetchone()
            if row is None:
                break
            after, cid, payload = row
            if link is not None:
                await link.send(payload, cid)
            else:
                await sender.send(bytes(payload))
            await conn.execute(FLOOR_MARK, (after,))
        backend = conn.info.backend_pid
        backend_cpu = cpu_seconds(backend)  # its last reading, for the benchmark's figures
    await sender.close()
    if link is not None:
        await link.close()
    report = {
        "vm_hwm_kib": vm_hwm_kib(os.getpid()),
        "cpu_seconds": time.process_time(),
        "backend": {"pid": backend, "cpu_seconds": backend_cpu},
    }
    print(json.dumps(report), flush=True)


# --- the Procrastinate run -----------------------------------------------------------------


def make_procrastinate_app(conninfo: str) -> tuple[Any, Any]:
    """A Procrastinate app with one task, ``deliver(payload)``, sending over MLLP.

    The task keeps one ``MllpSender`` (one connection) across jobs, like inturn's worker.
    """
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    sender: list[MllpSender] = []

    @app.task(name="deliver")
    async def deliver(payload: str) -> None:
        if not sender:
            host = os.environ["BENCH_MLLP_HOST"]
            port = int(os.environ["BENCH_MLLP_PORT"])
            sender.append(MllpSender(MllpSenderConfig(host, port)))
        await sender[0].send(payload.encode("latin-1"))

    return app, deliver


async def procrastinate_worker_main(conninfo: str) -> None:
    """The child process: one worker, concurrency 1, until it has caught up with the queue."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app, _ = make_procrastinate_app(conninfo)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=1, wait=False, install_signal_handlers=False, name="bench"
        )
    print(json.dumps({"vm_hwm_kib": vm_hwm_kib(os.getpid())}), flush=True)


async def procrastinate_pending(conn: AsyncConnection[Any]) -> bool:
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def run_procrastinate(
    server_dsn: str, templates: Sequence[Template], count: int, cap: float
) -> Result:
    result = Result("procrastinate", count)
    items = build_messages(templates, "P", count)
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    with fresh_database(server_dsn, "procrastinate") as dsn:
        app, deliver = make_procrastinate_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            deferrer = deliver.configure(lock=DESTINATION)
            t0 = time.perf_counter()
            for i in range(0, count, ENQUEUE_BATCH):
                batch = items[i : i + ENQUEUE_BATCH]
                await deferrer.batch_defer_async(
                    *({"payload": item.payload.decode("latin-1")} for item in batch)
                )
            result.enqueue_seconds = time.perf_counter() - t0
        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("VACUUM ANALYZE procrastinate_jobs")
            await checkpoint(conn)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--procrastinate-worker", dsn]
        await drain(
            result,
            lambda _port: cmd,
            dict(os.environ),
            dsn,
            procrastinate_pending,
            [i.control_id for i in items],
            cap,
        )
    return result


# --- main ----------------------------------------------------------------------------------


def fsync_probe(data_dir: Path | None) -> str | None:
    """``pg_test_fsync``'s one-8kB-write fdatasync figure on the data volume, if available."""
    tool = shutil.which("pg_test_fsync")
    with contextlib.suppress(ImportError):
        import pgserver

        candidate = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_test_fsync"
        if candidate.exists():
            tool = str(candidate)
    if tool is None:
        return None
    target = (data_dir or Path(tempfile.gettempdir())) / "fsync.test"
    try:
        out = subprocess.run(
            [tool, "-s", "1", "-f", str(target)], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        with contextlib.suppress(OSError):
            target.unlink()
    for line in out.splitlines():
        if "fdatasync" in line and "ops/sec" in line:
            return " ".join(line.split())
    return None


def round_label(kind: str, n: int) -> str:
    """``delivery``, ``delivery-2``, ...: the label of ``kind``'s run in round ``n``."""
    return kind if n == 1 else f"{kind}-{n}"


def left_out(label: str, args: argparse.Namespace) -> bool:
    """Whether ``--skip`` (or ``--catchup-messages 0``) leaves the run ``label`` out."""
    if label.startswith("catch-up"):
        return "catch-up" in args.skip or not args.catchup_messages
    if label == "floor-round4":
        return "floor" in args.skip or "round4" in args.skip
    if label.startswith("floor"):
        return "floor" in args.skip
    return label.split("-")[0] in args.skip or label in args.skip


@dataclass(frozen=True)
class Pair:
    """One of inturn's drains and the yardstick drains either side of it."""

    label: str
    worker: Result
    floors: tuple[Result, ...]

    @property
    def floor_rate(self) -> float:
        return statistics.mean(f.rate for f in self.floors)

    @property
    def floor_cpu_us(self) -> float:
        return statistics.mean(f.cpu_us for f in self.floors)

    @property
    def ratio(self) -> float:
        return self.worker.rate / self.floor_rate if self.floor_rate else 0.0


def yardstick_pairs(results: dict[str, Result], rounds: int) -> list[Pair]:
    """Each round's ``delivery`` with the yardstick runs before and after it."""
    pairs = []
    for n in range(1, rounds + 1):
        worker = results.get(round_label("delivery", n))
        after = "floor-after" if n == rounds else round_label("floor", n + 1)
        floors = tuple(
            results[k] for k in (round_label("floor", n), after) if k in results and results[k].rate
        )
        if worker is not None and floors:
            pairs.append(Pair(round_label("delivery", n), worker, floors))
    return pairs


async def run_encrypted(
    server_dsn: str, templates: Sequence[Template], count: int, cap: float, *, log: bool = False
) -> Result:
    """The ``delivery`` case with payloads encrypted at rest (issue 31): sealed at enqueue,
    opened by the worker (``--payload-keys``) right before each send. ``log``: as
    :func:`run_inturn`'s."""
    with encryption.key_store(server_dsn) as keys:
        return await run_inturn(server_dsn, "encrypted", templates, count, cap, keys=keys, log=log)


async def main_async(args: argparse.Namespace) -> int:
    source = corpus.load(args.samples)
    templates, skipped = load_templates(source)
    if not templates:
        print(f"no usable messages: {source.where}", file=sys.stderr)
        return 2
    sizes = [t.size for t in templates]
    print(source.describe())
    print(
        f"messages: {len(templates)} used (sizes {min(sizes)}..{max(sizes)} B,"
        f" mean {statistics.mean(sizes):,.0f} B); skipped {len(skipped)}"
        + (f": {', '.join(skipped)}" if skipped else "")
    )
    from importlib.metadata import version

    print(
        f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]};"
        f" psycopg {psycopg.__version__}; procrastinate {version('procrastinate')}"
    )
    with postgres_server(args.dsn) as (server_dsn, data_dir):
        where = "embedded pgserver" if data_dir else "given server"
        params = conninfo_to_dict(server_dsn)
        print(
            f"postgres ({where}, host {params.get('host', 'default')}):",
            *server_settings(server_dsn),
        )
        if args.fsync_test:
            print(f"pg_test_fsync (data volume): {fsync_probe(data_dir) or 'not available'}")
        ack_delay = args.ack_delay_ms / 1000

        def inturn_run(label: str, **kw: Any) -> Callable[[], Awaitable[Result]]:
            messages = args.catchup_messages if label.startswith("catch-up") else args.messages
            cap = args.catchup_cap if label.startswith("catch-up") else args.cap
            if "yardstick" not in kw:  # the yardstick drains rows of the layout before the log
                kw["log"] = args.store == "log"
            return lambda: run_inturn(server_dsn, label, templates, messages, cap, **kw)

        # The yardstick runs before and after each of inturn's drains (--rounds of them), so
        # that a machine whose speed drifts during the benchmark moves both sides of each
        # ratio alike; the ratio is taken pair by pair and its median reported.
        runs: dict[str, Callable[[], Awaitable[Result]]] = {}
        for n in range(1, args.rounds + 1):
            runs[round_label("floor", n)] = inturn_run(
                round_label("floor", n), yardstick="corrected"
            )
            runs[round_label("delivery", n)] = inturn_run(round_label("delivery", n))
            if n == 1:  # beside the first delivery, so that both meet the same machine
                runs["encrypted"] = lambda: run_encrypted(
                    server_dsn, templates, args.messages, args.cap, log=args.store == "log"
                )
                runs["scoped"] = inturn_run("scoped", scoped=True)
        runs["floor-after"] = inturn_run("floor-after", yardstick="corrected")
        # Round 4's yardstick, once, so that the correction shows in the figures (issue 33).
        runs["floor-round4"] = inturn_run("floor-round4", yardstick="round4")
        if args.yardstick_parts:
            for name in ("keyset-only", "stream-only"):
                runs[f"floor-{name}"] = inturn_run(f"floor-{name}", yardstick=name)
        runs |= {
            "traced": inturn_run("traced", traced=True),
            "procrastinate": lambda: run_procrastinate(
                server_dsn, templates, args.messages, args.cap
            ),
            "large-table": inturn_run("large-table", prefill=args.large_rows),
            "catch-up-floor": inturn_run(
                "catch-up-floor", yardstick="corrected", ack_delay=ack_delay
            ),
            "catch-up": inturn_run("catch-up", ack_delay=ack_delay),
        }
        results: dict[str, Result] = {}
        for label, run in runs.items():
            if left_out(label, args):
                continue
            results[label] = await run()
            for line in results[label].lines():
                print(line, flush=True)

    def rate(label: str) -> float | None:
        return round(results[label].rate, 1) if label in results else None

    def cpu(label: str) -> float | None:
        return round(results[label].cpu_us) if label in results and results[label].cpu_us else None

    inturn_runs = [
        r
        for k, r in results.items()
        if k.startswith(("delivery", "encrypted", "scoped", "large-table", "catch-up"))
    ]
    lost = sum(r.check.lost for r in inturn_runs)
    dup = sum(r.check.duplicated for r in inturn_runs)
    ooo = sum(r.check.out_of_order for r in inturn_runs)
    pairs = yardstick_pairs(results, args.rounds)
    ratio = statistics.median(p.ratio for p in pairs) if pairs else None
    delivery_rate = statistics.median(p.worker.rate for p in pairs) if pairs else None
    floor_rate = statistics.median(p.floor_rate for p in pairs) if pairs else None
    worker_cpu = statistics.median(p.worker.cpu_us for p in pairs) if pairs else None
    floor_cpu = statistics.median(p.floor_cpu_us for p in pairs) if pairs else None
    catchup = None
    if "catch-up" in results and "catch-up-floor" in results and results["catch-up"].seconds:
        # time per message, so that a capped run compares like with like
        per = {k: results[k].seconds / max(results[k].check.delivered, 1) for k in results}
        catchup = per["catch-up"] / per["catch-up-floor"]
    if "delivery" in results and "large-table" in results and results["delivery"].rate:
        loss = 1 - results["large-table"].rate / results["delivery"].rate
        print(f"large-table rate vs delivery: {-loss:+.1%}")
    hooks_ns = hooks_off_ns()
    print(f"tracing hooks when off: {hooks_ns:.0f} ns per delivered message")
    traced = None
    if "delivery" in results and "encrypted" in results and results["delivery"].rate:
        sealed = results["encrypted"].rate / results["delivery"].rate
        print(f"encrypted payloads (--payload-keys) vs delivery in clear: {sealed - 1:+.1%}")
    scoped = None
    if "delivery" in results and "scoped" in results and results["delivery"].rate:
        scoped = results["scoped"].rate / results["delivery"].rate
        print(f"the destination's own login (row policies) vs the shared one: {scoped - 1:+.1%}")
    if "delivery" in results and "traced" in results and results["delivery"].rate:
        traced = results["traced"].rate / results["delivery"].rate
        print(f"traced rate vs delivery (tracing off): {traced - 1:+.1%}")
    if "delivery" in results and "procrastinate" in results and results["procrastinate"].rate:
        times = results["delivery"].rate / results["procrastinate"].rate
        print(f"delivery vs procrastinate: {times:.2f}x")
    for p in pairs:
        print(
            f"  pair {p.label}: worker {p.worker.rate:,.0f} msg/s ({p.worker.cpu_us:,.0f} us CPU"
            f" per message) against the yardstick's {p.floor_rate:,.0f} msg/s"
            f" ({p.floor_cpu_us:,.0f} us): {p.ratio:.3f}"
        )
    if ratio is not None:
        print(
            f"delivery vs the simplest correct loop: {ratio:.3f} of its rate"
            f" ({delivery_rate:,.0f} vs {floor_rate:,.0f} msg/s; CPU per message {worker_cpu:,.0f}"
            f" vs {floor_cpu:,.0f} us; target 0.90)"
        )
    old_ratio = None
    if "floor-round4" in results and results["floor-round4"].rate and delivery_rate:
        old_ratio = delivery_rate / results["floor-round4"].rate
        print(
            f"round 4's yardstick (no keyset bound, inturn's MllpSender):"
            f" {results['floor-round4'].rate:,.0f} msg/s; the worker at {old_ratio:.2f} of it"
        )
    if catchup is not None:
        print(
            f"catch-up ({args.catchup_messages:,} messages, receiver answering after"
            f" {args.ack_delay_ms:g} ms): {catchup:.3f} of the simplest loop's time (target 1.10)"
        )

    def rounded(value: float | None, digits: int = 1) -> float | None:
        return None if value is None else round(value, digits)

    figures = {
        "messages": source.source,
        "delivery_msg_s": rounded(delivery_rate),
        "floor_msg_s": rounded(floor_rate),
        "ratio_to_floor": rounded(ratio, 3),
        "ratio_target": 0.9,
        "pair_ratios": [round(p.ratio, 3) for p in pairs],
        "worker_cpu_us_per_message": rounded(worker_cpu, 0),
        "floor_cpu_us_per_message": rounded(floor_cpu, 0),
        "round4_floor_msg_s": rate("floor-round4"),
        "round4_floor_cpu_us_per_message": cpu("floor-round4"),
        "ratio_to_round4_floor": rounded(old_ratio, 3),
        "keyset_only_floor_msg_s": rate("floor-keyset-only"),
        "stream_only_floor_msg_s": rate("floor-stream-only"),
        "catchup_messages": args.catchup_messages,
        "catchup_time_ratio": rounded(catchup, 3),
        "catchup_target": 1.1,
        "procrastinate_msg_s": rate("procrastinate"),
        "encrypted_msg_s": rate("encrypted"),
        "encrypted_rate_ratio": (
            rounded(results["encrypted"].rate / results["delivery"].rate, 3)
            if "encrypted" in results and "delivery" in results and results["delivery"].rate
            else None
        ),
        "encrypted_rate_ratio_target": encryption.RATIO_TARGET,
        "scoped_msg_s": rate("scoped"),
        "scoped_rate_ratio": rounded(scoped, 3),
        "traced_msg_s": rate("traced"),
        "traced_rate_ratio": rounded(traced, 3),
        "tracing_off_ns_per_message": round(hooks_ns),
        "large_table_msg_s": rate("large-table"),
        "worker_peak_rss_mib": (
            round(results["delivery"].peak_rss_kib / 1024, 1) if "delivery" in results else None
        ),
        "lost": lost,
        "duplicated": dup,
        "out_of_order": ooo,
    }
    emit("delivery", figures)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"), help="Postgres server DSN")
    parser.add_argument("--messages", type=int, default=20000, help="messages per run")
    parser.add_argument(
        "--samples",
        type=Path,
        default=None,
        help="directory of *.hl7 (default $INTURN_SAMPLES or ../shared/samples/hl7; without"
        " them, the demo's made-up messages)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="drains of inturn's worker, each between two of the yardstick's (pair ratios)",
    )
    parser.add_argument(
        "--large-rows", type=int, default=LARGE_TABLE_ROWS, help="finished rows for large-table"
    )
    parser.add_argument(
        "--cap", type=float, default=CAP_SECONDS, help="longest drain per run, seconds"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=[
            "floor",
            "round4",
            "delivery",
            "encrypted",
            "scoped",
            "traced",
            "procrastinate",
            "large-table",
            "catch-up",
        ],
        help="leave a run out (repeatable; floor leaves out every yardstick run, round4 the"
        " round-4 yardstick's)",
    )
    parser.add_argument(
        "--catchup-messages",
        type=int,
        default=100_000,
        help="backlog of the catch-up runs (0 leaves them out)",
    )
    parser.add_argument(
        "--catchup-cap", type=float, default=1200.0, help="longest catch-up drain, seconds"
    )
    parser.add_argument(
        "--ack-delay-ms",
        type=float,
        default=5.0,
        help="the catch-up receiver's wait before each ACK, milliseconds",
    )
    parser.add_argument(
        "--store",
        choices=["log", "rows"],
        default="log",
        help="how inturn's drains find their messages: stored once in the channel log, as"
        " ingest stores them (default; the worker pulls them), or as rows holding their own"
        " payload (the layout before issue 43). The yardstick always drains such rows",
    )
    parser.add_argument("--floor-worker", metavar="CONNINFO", help=argparse.SUPPRESS)
    parser.add_argument(
        "--yardstick", choices=sorted(YARDSTICKS), default="corrected", help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--yardstick-parts",
        action="store_true",
        help="also run the two yardsticks that take one of the corrections each",
    )
    parser.add_argument(
        "--fsync-test", action="store_true", help="also run pg_test_fsync on the data volume"
    )
    parser.add_argument("--procrastinate-worker", metavar="CONNINFO", help=argparse.SUPPRESS)
    args = parse_args(
        parser,
        argv,
        {"messages": 150, "large_rows": 2000, "cap": 30.0, "catchup_messages": 60},
    )
    if args.procrastinate_worker:
        asyncio.run(procrastinate_worker_main(args.procrastinate_worker))
        return 0
    if args.floor_worker:
        asyncio.run(floor_worker_main(args.floor_worker, YARDSTICKS[args.yardstick]))
        return 0
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
