"""Fixtures shared by the integration tests: a small PKI made with the real openssl; a real
PgBouncer in each pool mode in front of the session's Postgres (a test module that asks for it
skips itself where :func:`tests.support.pgbouncer.missing` says so); a role per component."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

from inturn.worker.cli import cli
from inturn.worker.store import roles
from tests.support import pgbouncer
from tests.support.channel_log import reset_epochs


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


#: Certificates of the test PKI: file stem -> (subject CN, subjectAltName).
CERTIFICATES = {
    "server": ("server", "IP:127.0.0.1,DNS:localhost"),
    "client": ("client", "DNS:client.example"),
    "other": ("other", "DNS:other.example,URI:urn:inturn:other"),
}


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA (``ca.pem``) and, signed by it, ``server`` (for 127.0.0.1), ``client`` and
    ``other`` certificates (``NAME.pem`` / ``NAME.key``); see :data:`CERTIFICATES`."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    for name, (cn, san) in CERTIFICATES.items():
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))  # fmt: skip
    return d


@pytest.fixture(scope="module", params=pgbouncer.POOL_MODES)
def bouncer(request: pytest.FixtureRequest, dsn: str) -> Iterator[pgbouncer.Bouncer]:
    """A PgBouncer in front of the session's server, once per pool mode (``session``,
    ``transaction``), for the whole module."""
    with pgbouncer.Bouncer(dsn, request.param) as b:
        yield b


@pytest.fixture
def pooled(bouncer: pgbouncer.Bouncer, fresh_db: str) -> str:
    """The emptied session database, through :func:`bouncer`."""
    return bouncer.dsn(fresh_db)


@pytest.fixture(scope="module")
def role_dsns(dsn: str, pg_server_dsn: str) -> Iterator[dict[str, str]]:
    """Roles with a prefix of this test session's own (roles are shared by the whole server),
    created by the real CLI; ``{component: DSN connecting as its role}``. Dropped at the end."""
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    result = CliRunner().invoke(
        cli, ["migrate", "--dsn", dsn, "--create-roles", "--role-prefix", prefix]
    )
    assert result.exit_code == 0, result.output
    names = {c: roles.role_name(c, prefix) for c in roles.COMPONENTS}
    for role in names.values():
        assert f"created role {role}" in result.output
    try:
        yield {c: make_conninfo(dsn, user=role) for c, role in names.items()}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for role in names.values():
                conn.execute(f'DROP OWNED BY "{role}"')
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            for role in names.values():
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.fixture
def epochs_as_migrated(fresh_db: str) -> Iterator[None]:
    """The history's epochs as a fresh migration leaves them, before and after the test
    (``pytest.mark.usefixtures("epochs_as_migrated")`` in the history's test files)."""
    reset_epochs(fresh_db)
    yield
    reset_epochs(fresh_db)
