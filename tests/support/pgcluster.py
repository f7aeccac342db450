"""Postgres servers of a test's own: a primary, a streaming standby made from it with
pg_basebackup, promotion, and optionally a network namespace to run in (for partitions).

Needs root (the servers run as the ``postgres`` user through ``runuser``) and the PostgreSQL 15
binaries; :func:`missing` says why a test must skip where they are absent. Everything listens
on addresses this machine owns (loopback, or a veth address inside a namespace the test made).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ports import free_port as free_port

BIN = Path(os.environ.get("INTURN_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "postgres"


def missing() -> str | None:
    """Why servers of our own cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (servers run as the postgres user)"
    if not (BIN / "pg_ctl").exists():
        return f"no PostgreSQL binaries in {BIN}"
    if shutil.which("runuser") is None:
        return "no runuser"
    try:
        import pwd

        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER} user"
    return None


def _run(args: list[str], netns: str | None = None, check: bool = True) -> str:
    cmd = ["runuser", "-u", USER, "--", *args]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


@dataclass
class Server:
    """One Postgres server: its data folder, address and port."""

    data: Path
    port: int
    listen: str = "127.0.0.1"
    netns: str | None = None
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def socket_dir(self) -> Path:
        return self.data.parent / f"sock-{self.port}"

    def dsn(self, host: str | None = None, dbname: str = "postgres") -> str:
        return (
            f"host={host or self.listen.split(',')[0]} port={self.port} user={USER} dbname={dbname}"
        )

    def start(self) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        shutil.chown(self.socket_dir, USER, USER)
        opts = [
            f"-c listen_addresses='{self.listen}'",
            f"-c port={self.port}",
            f"-c unix_socket_directories='{self.socket_dir}'",
            *(f"-c {k}='{v}'" for k, v in self.settings.items()),
        ]
        _run(
            [
                str(BIN / "pg_ctl"),
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data),
                "-l",
                str(self.data.parent / f"log-{self.port}.txt"),
                "-o",
                " ".join(opts),
            ],
            self.netns,
        )

    def stop(self, mode: str = "fast") -> None:
        _run(
            [str(BIN / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.data)], self.netns, False
        )

    def promote(self) -> None:
        _run([str(BIN / "pg_ctl"), "promote", "-w", "-D", str(self.data)], self.netns)


def base_backup(server: Server, folder: Path) -> None:
    """A base backup of ``server`` into ``folder`` (``pg_basebackup``, WAL streamed with it): a
    server started on that folder is the database as it was at the backup."""
    _run(
        [
            str(BIN / "pg_basebackup"),
            *("-D", str(folder), "-h", str(server.socket_dir), "-p", str(server.port)),
            *("-U", USER, "-X", "stream", "--no-sync"),
        ],
        server.netns,
    )


class Cluster:
    """A primary and, after :meth:`add_standby`, a streaming standby of it (synchronous when
    asked), under one temporary folder; :meth:`close` stops both and removes everything."""

    def __init__(self, listen: str = "127.0.0.1", netns: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="inturn-cluster-"))
        os.chmod(self.root, 0o755)
        shutil.chown(self.root, USER, USER)
        self.servers: list[Server] = []
        data = self.root / "primary"
        _run([str(BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync"])
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 0.0.0.0/0 trust\nhost all all 0.0.0.0/0 trust\n")
        self.primary = Server(
            data,
            free_port(),
            listen,
            netns,
            {"wal_level": "replica", "max_wal_senders": "4", "fsync": "off"},
        )
        self.servers.append(self.primary)
        self.primary.start()

    def add_standby(self, synchronous: bool = True) -> Server:
        """Make a standby with pg_basebackup (``-R`` writes its primary_conninfo), start it and,
        when ``synchronous``, make the primary wait for it at every commit."""
        data = self.root / "standby"
        _run(
            [
                str(BIN / "pg_basebackup"),
                "-D",
                str(data),
                "-h",
                str(self.primary.socket_dir),
                "-p",
                str(self.primary.port),
                "-U",
                USER,
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "-d",
                f"application_name=standby port={self.primary.port}",
            ],
            self.primary.netns,
        )
        standby = Server(
            data, free_port(), self.primary.listen, self.primary.netns, {"fsync": "off"}
        )
        self.servers.append(standby)
        standby.start()
        if synchronous:
            self.sql(self.primary, "ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            self.sql(self.primary, "SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while (
                self.sql(
                    self.primary,
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                ).strip()
                != "1"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby never became synchronous")
                time.sleep(0.1)
        return standby

    def sql(self, server: Server, query: str) -> str:
        """Run ``query`` with psql over the server's socket; its unaligned output."""
        return _run(
            [
                str(BIN / "psql"),
                "-h",
                str(server.socket_dir),
                "-p",
                str(server.port),
                "-U",
                USER,
                "-d",
                "postgres",
                "-At",
                "-c",
                query,
            ],
            server.netns,
        )

    def set_system(self, name: str, value: str | None) -> None:
        """``ALTER SYSTEM SET name = value`` (``RESET`` for None) on the primary, reloaded, and
        taken: a new session shows the value, and the sessions already open have had time to
        take the reload signal too (they do at their next statement, once signalled)."""
        change = f"RESET {name}" if value is None else f"SET {name} = '{value}'"
        self.sql(self.primary, f"ALTER SYSTEM {change}")
        self.sql(self.primary, "SELECT pg_reload_conf()")
        wanted = self.sql(self.primary, f"SELECT boot_val FROM pg_settings WHERE name = '{name}'")
        wanted = wanted.strip() if value is None else value
        deadline = time.monotonic() + 10
        while self.sql(self.primary, f"SHOW {name}").strip() != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} never became {wanted!r}")
            time.sleep(0.05)
        time.sleep(0.3)

    def close(self) -> None:
        for server in self.servers:
            server.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
