"""CPU instructions of a drain, counted with callgrind: the worker process and its Postgres
backends, per message delivered (bench/retention.py ``--instructions``).

CPU seconds read from ``/proc`` move by a quarter and more on this shared two-core machine
from one minute to the next, and no hardware counter is exposed to ``perf`` here; instructions
counted by ``valgrind --tool=callgrind`` do not depend on the load. The backends are counted on
a Postgres cluster of this module's own (:class:`Cluster`, in a temporary directory, from the
``postgres`` binaries of ``pg_config --bindir`` or the embedded ``pgserver``'s): it is filled
at full speed, then restarted under callgrind, whose forked backends each write their count when
they exit. The worker process runs under callgrind too, instrumented only between the first
message's arrival and the queue found empty (``callgrind_control``). Each figure is the
difference of two drains of different sizes in the same database, divided by the difference
of their sizes: what a worker and its backends do once (start-up, the first pull, the
shutdown) cancels out.

Needs ``valgrind`` and ``callgrind_control`` on the PATH; when running as root, a system user
to run Postgres as (``postgres``, else ``pgserver``, which ``pgserver`` itself creates).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

import delivery
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo

from inturn.worker.cli.worker import load_one
from inturn.worker.drain.main import RUNTIME_ENV, runtime_settings
from inturn.worker.store.migrate import migrate
from tests.support.ports import free_port

#: what each counted drain runs under; --collect-atstart: a backend is counted whole (its
#: start-up and exit cancel out in the difference of two drains)
CALLGRIND = ("valgrind", "-q", "--tool=callgrind", "--error-limit=no")
#: The worker's runtime (what ``inturn worker`` execs once its configuration is validated),
#: its depth gauge made quiet. The gauge is one query every 5 s while anything is pending,
#: whatever the rate: two in a 3,000-message drain at full speed, but callgrind makes a drain
#: fifty times longer and so the gauge fifty times more frequent per message; and its query
#: reads each log partition, so a count that kept it would charge a time-driven query's
#: partitions to each message. Its first query, at start, still runs (both drains, cancelled).
RUNTIME = (
    "import os; import inturn.worker.drain.idle as idle; idle.DEPTH_EVERY_SECONDS = 1e9;"
    " os.environ[{env!r}] = {settings!r};"
    " from inturn.worker.drain.main import main; main()"
)
READY_SECONDS = 600.0  # a cluster under callgrind starts in tens of seconds
EXIT_SECONDS = 120.0  # a backend under callgrind writes its count when it exits


def missing() -> str | None:
    """Why instructions cannot be counted here (None: they can)."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            return f"no {tool} on the PATH"
    if bindir() is None:
        return "no postgres binaries (pg_config --bindir, pgserver)"
    return None


def bindir() -> Path | None:
    """The directory of ``initdb`` and ``postgres``: the system's, else pgserver's."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=30
        )
        path = Path(found.stdout.strip())
        if (path / "postgres").exists() and (path / "initdb").exists():
            return path
    with contextlib.suppress(ImportError):
        import pgserver

        path = Path(pgserver.__file__).parent / "pginstall" / "bin"
        if (path / "postgres").exists():
            return path
    return None


def callgrind_total(path: Path) -> int:
    """The instructions a callgrind output file counts (its ``summary:`` or ``totals:``)."""
    text = path.read_text(errors="replace")
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


class Cluster:
    """A Postgres cluster of our own in ``directory``, started plain or under callgrind.

    The settings that matter to a drain are the system server's here (shared_buffers 160 MB,
    autovacuum off, fsync on).
    """

    def __init__(self, directory: Path, pg_bin: Path) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.counts = directory / "callgrind"
        self.pg_bin = pg_bin
        self.port = free_port()
        self.user = self._os_user()
        self.process: subprocess.Popen[bytes] | None = None
        #: pg_stat_statements is there to load: each counted drain's statements are counted
        self.statements = (pg_bin.parent / "lib" / "pg_stat_statements.so").exists()

    @staticmethod
    def _os_user() -> str | None:
        """Postgres refuses to run as root: then the system user ``postgres``, else
        ``pgserver`` (made as pgserver makes it)."""
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "pgserver"):
            with contextlib.suppress(KeyError):
                pwd.getpwnam(name)
                return name
        subprocess.run(["useradd", "-s", "/bin/bash", "pgserver"], check=True, timeout=60)
        return "pgserver"

    def _run(self, argv: Sequence[str]) -> None:
        subprocess.run(list(argv), check=True, capture_output=True, timeout=600, user=self.user)

    def init(self) -> None:
        self.directory.chmod(0o777)
        self.counts.mkdir(mode=0o777)
        self.counts.chmod(0o777)
        self._run(
            [str(self.pg_bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.directory}'\n"
                "shared_buffers = 160MB\nmax_wal_size = 1GB\nautovacuum = off\n"
                f"shared_preload_libraries = '{'pg_stat_statements' if self.statements else ''}'\n"
            )

    def dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname)

    def start(self, *, counted: bool) -> None:
        argv = [str(self.pg_bin / "postgres"), "-D", str(self.data)]
        if counted:
            argv = [*CALLGRIND, f"--callgrind-out-file={self.counts}/pg.%p", *argv]
        log = (self.directory / ("counted.log" if counted else "plain.log")).open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, user=self.user)
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [str(self.pg_bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                timeout=60,
                check=False,
            )
            if ready.returncode == 0:
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited: see {self.directory}")
            time.sleep(0.5)
        raise RuntimeError(f"postgres not ready in {READY_SECONDS:.0f}s")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(2)  # SIGINT: fast shutdown
        try:
            self.process.wait(timeout=EXIT_SECONDS * 2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=60)
        self.process = None

    async def backend_total(self, pids: Sequence[int]) -> int:
        """The instructions of the backends ``pids`` once each has exited and written its
        count (0 for one that wrote none within :data:`EXIT_SECONDS`)."""
        total = 0
        deadline = time.monotonic() + EXIT_SECONDS
        for pid in pids:
            path = self.counts / f"pg.{pid}"
            while time.monotonic() < deadline:
                if path.exists() and not _alive(pid) and callgrind_total(path) > 0:
                    break
                await asyncio.sleep(0.2)
            if path.exists():
                total += callgrind_total(path)
        return total


def counted_so_far(said: str) -> int:
    """The instructions ``callgrind_control -e`` says a run has counted (its threads summed)."""
    return sum(
        int(m.group(1).replace(",", ""))
        for m in re.finditer(r"^\s*Th\s+\d+\s+([\d,]+)", said, re.M)
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """A :class:`Cluster`, initialised (not started), removed afterwards."""
    pg_bin = bindir()
    if pg_bin is None:
        raise RuntimeError("no postgres binaries")
    directory = Path(tempfile.mkdtemp(prefix="inturn-bench-counted-"))
    made = Cluster(directory, pg_bin)
    try:
        made.init()
        yield made
    finally:
        made.stop()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Counted:
    """The instructions of one drain: the worker's from its first arrival (``before`` messages
    had arrived when the count started) to the queue found empty, its backends' whole."""

    messages: int
    delivered: int = 0
    before: int = 0  # messages that had arrived when the worker's count started
    duplicated: int = 0
    #: calls of each statement run in the database during the drain (pg_stat_statements; the
    #: benchmark's own polls included), by the statement's first line
    statements: dict[str, int] = field(default_factory=dict)
    worker: int = 0
    backends: int = 0
    backend_pids: list[int] = field(default_factory=list)


async def _callgrind_control(*args: str) -> str:
    """Run ``callgrind_control args``; its output (an error says "not detected")."""
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return out.decode(errors="replace")


#: statements of the benchmark's own in a drain's database: its poll (queue.blocked) and its
#: readings of the statistics
BENCH_STATEMENTS = ("SELECT EXISTS ( SELECT $1 FROM inturn_delivery WHERE", "pg_stat_")


def _worker_calls(statements: dict[str, int]) -> int:
    return sum(n for q, n in statements.items() if not any(mark in q for mark in BENCH_STATEMENTS))


async def _statements(dsn: str) -> dict[str, int]:
    """Calls of each statement since the reset, by its first line (a name comment)."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT calls, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        calls: dict[str, int] = {}
        for n, query in await cur.fetchall():
            first = " ".join(str(query).split())[:90]
            calls[first] = calls.get(first, 0) + int(n)
        return calls


async def _client_backends(dsn: str) -> list[int]:
    """The worker's backends in ``dsn`` (its application names start with inturn)."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND starts_with(application_name, 'inturn')"
            " AND NOT starts_with(application_name, 'inturn-bench')"
        )
        return [int(pid) for (pid,) in await cur.fetchall()]


async def counted_drain(
    server: Cluster,
    dsn: str,
    templates: Sequence[delivery.Template],
    count: int,
    run: str,
    cap: float,
) -> Counted:
    """Queue ``count`` messages (run label ``run``: their MSH-10s) in ``dsn`` and drain them by
    a worker under callgrind, on ``server`` restarted under callgrind."""
    counted = Counted(count)
    items = delivery.build_messages(templates, run, count)
    await delivery.enqueue_all(dsn, items)
    if server.statements:
        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("SELECT pg_stat_statements_reset()")
    result = delivery.Result(f"counted-{run}", count)

    async def first_arrival(pid: int, arrived: Callable[[], int]) -> None:
        await _callgrind_control("--instr=on", str(pid))
        counted.before = arrived()  # delivered before the count started: not counted

    async def drained(pid: int) -> None:
        # read while still instrumented (switched off, callgrind tells nothing), then off
        counted.worker = counted_so_far(await _callgrind_control("-e", str(pid)))
        await _callgrind_control("--instr=off", str(pid))
        counted.backend_pids = await _client_backends(dsn)
        # stopped at once: a worker under callgrind shuts down for seconds, polling its idle
        # queue meanwhile, statements its backend would count and a drain without it does not
        # run; its backend exits (and writes its count) when the connection drops
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    with tempfile.TemporaryDirectory(prefix="inturn-bench-") as tmp:

        def command(port: int) -> list[str]:
            manifest = delivery.write_manifest(Path(tmp), port)
            # the runtime inturn worker would exec, with its settings, the depth gauge quiet
            settings = runtime_settings(
                load_one(manifest, None), dsn, "127.0.0.1", 0, "WARNING", False
            )
            return [
                *CALLGRIND,
                "--instr-atstart=no",
                "--callgrind-out-file=/dev/null",  # read with callgrind_control -e
                *(sys.executable, "-P", "-c", RUNTIME.format(env=RUNTIME_ENV, settings=settings)),
            ]

        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["INTURN_DSN"] = dsn
        await delivery.drain(
            result,
            command,
            env,
            dsn,
            delivery.inturn_pending,
            [i.control_id for i in items],
            cap,
            first_arrival=first_arrival,
            drained=drained,
        )
    counted.delivered = result.check.delivered
    counted.duplicated = result.check.duplicated
    if server.statements:
        counted.statements = await _statements(dsn)
    counted.backends = await server.backend_total(counted.backend_pids)
    return counted


@dataclass
class PerMessage:
    """Instructions per message delivered: the worker process and its backends, from the
    difference of two drains (``small`` and ``large``)."""

    small: Counted
    large: Counted

    @property
    def worker(self) -> float:
        # counted from the first arrival on: the messages that arrived after the count started
        n = (self.large.delivered - self.large.before) - (self.small.delivered - self.small.before)
        return (self.large.worker - self.small.worker) / n if n > 0 else 0.0

    @property
    def backends(self) -> float:
        n = self.large.delivered - self.small.delivered
        return (self.large.backends - self.small.backends) / n if n > 0 else 0.0

    @property
    def statements(self) -> float:
        """The worker's statements per message (the benchmark's own polls and readings of
        pg_stat_* left out; 0 without pg_stat_statements)."""
        n = self.large.delivered - self.small.delivered
        small, large = _worker_calls(self.small.statements), _worker_calls(self.large.statements)
        return (large - small) / n if n > 0 and small and large else 0.0

    @property
    def complete(self) -> bool:
        return (
            self.small.delivered == self.small.messages
            and self.large.delivered == self.large.messages
            and min(self.small.worker, self.large.worker) > 0
            and min(self.small.backends, self.large.backends) > 0
        )


async def per_message(
    server: Cluster,
    dsn: str,
    templates: Sequence[delivery.Template],
    sizes: tuple[int, int],
    label: str,
    cap: float,
) -> PerMessage:
    """Two counted drains of ``sizes`` messages in ``dsn``, the smaller first."""
    small = await counted_drain(server, dsn, templates, sizes[0], f"{label}S", cap)
    large = await counted_drain(server, dsn, templates, sizes[1], f"{label}L", cap)
    return PerMessage(small, large)


async def compare(
    templates: Sequence[delivery.Template],
    fill: Callable[[str], Awaitable[Any]],
    sizes: tuple[int, int],
    cap: float,
) -> dict[str, PerMessage]:
    """Instructions per message in a database with an empty history and in one ``fill(dsn)``
    filled, both on a cluster of our own: filled at full speed, drained under callgrind."""
    results: dict[str, PerMessage] = {}
    with cluster() as server:
        server.start(counted=False)
        dsns = {}
        async with await AsyncConnection.connect(server.dsn(), autocommit=True) as conn:
            for name in ("empty", "history"):
                await conn.execute(f"CREATE DATABASE counted_{name}")  # our own names
                dsns[name] = server.dsn(f"counted_{name}")
        for dsn in dsns.values():
            migrate(dsn)
            if server.statements:
                async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await fill(dsns["history"])
        server.stop()
        server.start(counted=True)
        try:
            for name, dsn in dsns.items():
                results[name] = await per_message(
                    server, dsn, templates, sizes, name[0].upper(), cap
                )
        finally:
            server.stop()
    return results
