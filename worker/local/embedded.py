"""An embedded Postgres for ``inturn local``, the demo and benchmarks (the ``pgserver`` package).

The data directory is kept between runs, so a stopped and restarted ``inturn local`` finds its
backlog. pgserver ships its own Postgres binaries; nothing needs to be installed.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inturn.worker.errors import Conflict

log = logging.getLogger("inturn.local")


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
