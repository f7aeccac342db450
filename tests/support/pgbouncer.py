"""A real PgBouncer of a test's own (Debian's ``pgbouncer``), in front of a test's Postgres.

:class:`Bouncer` starts ``pgbouncer`` on a free loopback port with a configuration that keeps
every PgBouncer default except ``pool_mode`` (``session`` or ``transaction``): only what any
deployment must say is written (where to listen, where its files go, the user list, and one
fallback database entry that forwards every database name to the backend). Authentication stays
PgBouncer's default (``auth_type = md5``): the user list holds a password of the test's own, the
clients send it, and the backend (trust, as the test servers are) never asks for one.

As root, PgBouncer runs as the ``postgres`` user (it refuses to run as root), so its folder is
that user's and a backend reached over a socket folder must let it through (the folder is made
searchable: never readable).

:func:`missing` says why a test must skip (no ``pgbouncer`` binary: ``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.ports import free_port

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
#: The password clients give PgBouncer (md5 auth, PgBouncer's default); the backend ignores it.
PASSWORD = "inturn-pgbouncer-test"
RUN_AS = "postgres"
POOL_MODES = ("session", "transaction")


def missing() -> str | None:
    """Why a PgBouncer of our own cannot run here, or None."""
    if not os.path.exists(BINARY):
        return "pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root and there is no {RUN_AS} user for pgbouncer"
    return None


class Bouncer:
    """One PgBouncer process in front of the server of ``backend_dsn``.

    Args:
        backend_dsn: a DSN of the backend (its host, or socket folder, and port are used; every
            database name is forwarded).
        pool_mode: ``session`` or ``transaction``.
        users: the user names clients log in as (each gets :data:`PASSWORD`); the backend's
            user by default.
        settings: further ``[pgbouncer]`` settings: ``bench/pooler.py`` raises
            ``max_client_conn`` for its 200 workers; one test makes a pool of one server
            connection (``default_pool_size``); the other tests keep every default.
    """

    def __init__(
        self,
        backend_dsn: str,
        pool_mode: str,
        users: tuple[str, ...] | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        if pool_mode not in POOL_MODES:
            raise ValueError(f"pool_mode must be one of {POOL_MODES}, got {pool_mode!r}")
        self.pool_mode = pool_mode
        self.settings = dict(settings or {})
        params = conninfo_to_dict(backend_dsn)
        self.backend_user = str(params.get("user") or "postgres")
        self.users = users or (self.backend_user,)
        host = str(params.get("host") or "/var/run/postgresql").split(",")[0]
        self.backend_host = host
        self.backend_port = int(str(params.get("port") or 5432).split(",")[0])
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"inturn-pgbouncer-{pool_mode}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ini(self) -> Path:
        return self.root / "pgbouncer.ini"

    @property
    def log(self) -> Path:
        return self.root / "pgbouncer.log"

    def config(self) -> str:
        """The configuration file's text: defaults everywhere but ``pool_mode``."""
        return (
            "[databases]\n"
            f"* = host={self.backend_host} port={self.backend_port}\n"
            "\n[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
            f"pool_mode = {self.pool_mode}\n"
            + "".join(f"{key} = {value}\n" for key, value in self.settings.items())
        )

    def start(self) -> Bouncer:
        """Write the configuration, start PgBouncer and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within 10 seconds (its log says why).
        """
        self.ini.write_text(self.config())
        (self.root / "userlist.txt").write_text(
            "".join(f'"{user}" "{PASSWORD}"\n' for user in self.users)
        )
        cmd = [BINARY, str(self.ini)]
        if os.geteuid() == 0:
            shutil.chown(self.root, RUN_AS, RUN_AS)
            for entry in self.root.iterdir():
                shutil.chown(entry, RUN_AS, RUN_AS)
            if self.backend_host.startswith("/"):
                folder = Path(self.backend_host)
                folder.chmod(folder.stat().st_mode | 0o011)  # searchable, not listable
            cmd = ["runuser", "-u", RUN_AS, "--", *cmd]
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.process.returncode}: {self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen within 10 s: {self.tail()}")

    def dsn(self, backend_dsn: str) -> str:
        """The DSN of ``backend_dsn``'s database (and user) through this PgBouncer; every other
        parameter of ``backend_dsn`` kept except its host, port and password."""
        params = conninfo_to_dict(backend_dsn)
        for key in ("host", "hostaddr", "port", "password"):
            params.pop(key, None)
        params.setdefault("user", self.backend_user)
        params.setdefault("dbname", "postgres")
        return make_conninfo("", host="127.0.0.1", port=self.port, password=PASSWORD, **params)

    def tail(self, lines: int = 20) -> str:
        """The end of PgBouncer's log (for failure messages)."""
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop PgBouncer (SIGTERM: it closes every connection) and remove its folder."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Bouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
