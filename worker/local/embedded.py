"""An embedded Postgres for ``inturn local``, the demo and benchmarks (the ``pgserver`` package).

The data directory is kept between runs, so a stopped and restarted ``inturn local`` finds its
backlog. pgserver ships its own Postgres binaries; nothing needs to be installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import pwd
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inturn.worker.errors import Conflict

log = logging.getLogger("inturn.local")

#: Seconds between two looks at the embedded Postgres (a file read and a signal 0).
WATCH_SECONDS = 1.0
#: Restarts tried in a row when it stopped unasked, before ``inturn local`` gives up.
RESTART_TRIES = 3
#: Seconds before the second try (doubling before each later one).
RESTART_PAUSE_SECONDS = 2.0


@dataclass
class EmbeddedPostgres:
    """A running embedded server.

    Attributes:
        dsn: a libpq URI reaching it over its Unix socket.
        data_dir: where its files live.
    """

    dsn: str
    data_dir: Path
    _server: Any

    def stop(self) -> int | None:
        """Stop the server; its data stays in :attr:`data_dir`.

        Returns None once it has stopped, or the pid of a server still running (pgserver leaves
        a server up while another process still uses it).
        """
        self._server.cleanup()
        return running_pid(self.data_dir)

    def alive(self) -> bool:
        """Whether its postmaster runs (``postmaster.pid`` names a live process)."""
        return running_pid(self.data_dir) is not None

    def restart(self) -> str:
        """Start the server again on its data directory after it stopped unasked (killed,
        crashed); blocking (run it in a thread). Returns the DSN it answers on (normally
        :attr:`dsn`: the same socket folder).

        Raises:
            RuntimeError: it did not start (the first line of pgserver's reason), e.g. while
                the killed server's backends still hold its shared memory; try again later.
        """
        server = self._server
        chatty = logging.getLogger("pgserver")  # it logs the whole server log on a failure
        level = chatty.level
        chatty.setLevel(logging.CRITICAL)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with server._lock:  # pgserver's own inter-process lock around a start
                    server.ensure_postgres_running()
            return str(server.get_uri())
        except Exception as exc:  # pgserver raises plain exceptions, CalledProcessError, ...
            why = (
                server_said(self.data_dir)
                or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            )
            raise RuntimeError(
                f"embedded Postgres in {self.data_dir} did not start: {why}"
            ) from None
        finally:
            chatty.setLevel(level)

    def fit_connections(self, wanted: int) -> tuple[int, int]:
        """Make the server's ``max_connections`` at least ``wanted``: when it is lower, set it
        with ``ALTER SYSTEM`` (``postgresql.auto.conf`` in the data folder, so later runs keep
        it) and restart the server (the setting takes effect only at a server start). Blocking;
        call before anything else connects. Returns ``(before, now)``.

        Raises:
            RuntimeError: the restart failed (the server's ``FATAL`` line: not enough shared
                memory or semaphores for that many); the setting is taken back and the server
                started as it was.
        """
        from inturn.worker.store.capacity import raise_max_connections

        before = raise_max_connections(self.dsn, wanted)
        if before >= wanted:
            return before, before
        try:
            self._pg_ctl_restart()
        except RuntimeError as exc:
            why = str(exc)
            auto = self.data_dir / "postgresql.auto.conf"
            with contextlib.suppress(OSError):
                kept = [
                    line
                    for line in auto.read_text().splitlines()
                    if not line.strip().startswith("max_connections")
                ]
                auto.write_text("\n".join(kept) + "\n")
            self.restart()
            raise RuntimeError(
                f"the embedded Postgres did not start with max_connections {wanted}: {why};"
                f" it runs again with {before}"
            ) from None
        return before, wanted

    def _pg_ctl_restart(self) -> None:
        """``pg_ctl restart`` (fast: nothing but this process is connected yet), with the
        options the server was started with (``postmaster.opts``)."""
        import pgserver

        pg_ctl: Any = vars(pgserver)["pg_ctl"]  # made at import (create_command_function)

        server = self._server
        try:
            with server._lock:
                pg_ctl(
                    ["-w", "-t", "60", "-m", "fast", "-l", str(self.data_dir / "log"), "restart"],
                    pgdata=self.data_dir,
                    user=server.system_user,
                    timeout=90,
                )
                server.ensure_postgres_running()  # its idea of the postmaster, renewed
        except Exception as exc:  # pgserver raises CalledProcessError, TimeoutExpired, ...
            why = (
                server_said(self.data_dir)
                or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            )
            raise RuntimeError(why) from None

    async def keep_running(
        self,
        stop: asyncio.Event,
        *,
        every: float = WATCH_SECONDS,
        tries: int = RESTART_TRIES,
        pause: float = RESTART_PAUSE_SECONDS,
    ) -> str | None:
        """Watch the server until ``stop`` is set, restarting it when it stops unasked.

        Looks every ``every`` seconds (``postmaster.pid`` and a signal 0: no connection). A
        server found gone is started again, at most ``tries`` times in a row ``pause``, then
        twice as long, seconds apart, each try logged; a later outage gets its tries afresh.
        When every try failed, or the server came back on another address, ``stop`` is set and
        the reason returned (the caller exits non-zero, so that a supervisor restarts it whole);
        None when stopped by the caller.
        """
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            if stop.is_set() or self.alive():
                continue
            log.error(
                "embedded Postgres in %s is not running (killed or crashed): ingest answers AE"
                " and the workers wait until it is back; restarting it",
                self.data_dir,
            )
            problem = await self._restart(stop, tries, pause)
            if problem is not None:
                stop.set()
                return problem
        return None

    async def _restart(self, stop: asyncio.Event, tries: int, pause: float) -> str | None:
        """Up to ``tries`` restarts; None once one worked (or stopped meanwhile), else why not."""
        last = ""
        for attempt in range(1, tries + 1):
            if stop.is_set():
                return None
            try:
                dsn = await asyncio.to_thread(self.restart)
            except RuntimeError as exc:
                last = str(exc)
                log.error("embedded Postgres restart %d of %d failed: %s", attempt, tries, last)
                if attempt < tries:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), pause * 2 ** (attempt - 1))
                continue
            if dsn != self.dsn:
                return (
                    "the embedded Postgres came back on another address; stop and start"
                    " inturn local again"
                )
            log.warning(
                "embedded Postgres restarted (try %d of %d): ingest and the workers reconnect"
                " on their own",
                attempt,
                tries,
            )
            return None
        return f"the embedded Postgres could not be restarted ({tries} tries): {last}"


def server_said(pgdata: Path) -> str | None:
    """The server's last ``FATAL`` or ``PANIC`` line in its log (``<pgdata>/log``, pgserver's
    ``pg_ctl -l``), without its time stamp: why it did not start; None when there is none."""
    try:
        with (pgdata / "log").open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            tail = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        for level in ("FATAL:", "PANIC:"):
            if level in line:
                return level + line.split(level, 1)[1].rstrip()
    return None


def running_pid(pgdata: Path) -> int | None:
    """The pid of the live postmaster of ``pgdata`` (from its ``postmaster.pid``), or None."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


class DataDirInUse(Conflict):
    """Another ``inturn local`` runs on this data directory (the message names its pid)."""


class DataDirLock:
    """An exclusive lock of a data directory for one ``inturn local``: a second one would
    share the first one's embedded Postgres and its destination registry.

    It is an ``flock`` on ``<data dir>/inturn-local.lock`` holding the owner's pid; the kernel
    releases it when the process ends, however it ends, so a crash leaves nothing to clean up.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Take the lock of ``data_dir`` (created if missing).

        Raises:
            DataDirInUse: another process holds it.
        """
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / "inturn-local.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(
                f"{data_dir} is in use by another inturn local (pid {holder}): stop it, or give"
                " this one a --data-dir of its own"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        """Let go of the lock (idempotent)."""
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def forget_dead_handles(pgdata: Path) -> list[int]:
    """Drop the pids of processes that no longer run from pgserver's handle list of ``pgdata``.

    pgserver stops the server when the last process using it lets go, counting users in
    ``<pgdata>/.handle_pids.json``. A process killed with SIGKILL never lets go, so its pid
    stays there and no later run would ever stop the server. Call this while holding the data
    directory's lock, before starting the server.

    Returns:
        The pids dropped (empty when the list was clean or absent).
    """
    path = pgdata / ".handle_pids.json"
    try:
        pids = [int(pid) for pid in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []
    alive = [pid for pid in pids if _runs(pid)]
    dead = [pid for pid in pids if pid not in alive]
    if dead:
        path.write_text(json.dumps(alive))
    return dead


def _runs(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal check
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


#: The system user pgserver runs the server as when started by root (pgserver's own choice).
SERVER_USER = "pgserver"


def ensure_server_user(lock_dir: Path | None = None, user: str = SERVER_USER) -> None:
    """Make sure the system user the embedded server runs as exists, one process at a time.

    Run as root, pgserver starts Postgres as the system user ``pgserver`` and creates it with
    ``useradd`` when it is missing; two processes starting a server at once on a machine that
    never had it (the test suite's xdist workers, two ``inturn local`` runs) both ran
    ``useradd``, and one data folder was handed to a uid that no longer existed by the time
    ``initdb`` ran (``could not access directory``). Here the check and the creation happen
    under an exclusive ``flock`` on ``<lock_dir>/inturn-pgserver-user.lock`` (the system's
    temporary folder by default), so the user is made once and every later process finds it.
    Nothing happens when not root. ``user`` names another user (the tests race on one of their
    own).

    Raises:
        RuntimeError: ``useradd`` failed (its first line of error).
    """
    if os.geteuid() != 0:
        return
    folder = lock_dir if lock_dir is not None else Path(tempfile.gettempdir())
    with open(folder / "inturn-pgserver-user.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(user)
            return
        except KeyError:
            pass
        made = subprocess.run(
            ["useradd", "-s", "/bin/bash", user],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if made.returncode != 0:
            reason = (made.stderr.strip().splitlines() or ["no message"])[0]
            raise RuntimeError(f"could not create the system user {user}: {reason}")


def start_embedded(data_dir: Path) -> EmbeddedPostgres:
    """Start (or re-attach to) the embedded Postgres whose data lives in ``data_dir``/pg.

    Raises:
        RuntimeError: the server could not start, or pgserver (the ``local`` extra) is not
            installed (the message says why).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
        try:
            from pgserver import get_server  # type: ignore[attr-defined]
        except ModuleNotFoundError:
            raise RuntimeError(
                "the embedded Postgres needs the local extra (pip install 'inturn[local]');"
                " or pass --dsn"
            ) from None

    pgdata = (data_dir / "pg").resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    ensure_server_user()
    dead = forget_dead_handles(pgdata)
    if dead:
        log.warning(
            "embedded Postgres in %s was left running by a process that was killed (pid %s);"
            " this run takes it over and stops it on the way out",
            pgdata,
            ", ".join(map(str, dead)),
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions with the server's log
        raise RuntimeError(f"embedded Postgres in {pgdata} did not start: {exc}") from exc
    return EmbeddedPostgres(dsn=server.get_uri(), data_dir=pgdata, _server=server)
