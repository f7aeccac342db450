"""Payload encryption in tests: a key store database of its own and a folder of master keys."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.masterkeys import FileKeyProvider, new_key_file
from inturn.worker.store.keystore import PgKeyStore, create_schema


@contextlib.contextmanager
def database(server_dsn: str, prefix: str = "inturn_keys") -> Iterator[str]:
    """A fresh, empty database on ``server_dsn`` (dropped afterwards); yields its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def key_store(server_dsn: str) -> Iterator[str]:
    """A key store database with its tables; yields its DSN."""
    with database(server_dsn) as dsn:
        create_schema(dsn)
        yield dsn


def master_keys(folder: Path, *ids: str) -> Path:
    """``folder`` with a fresh master key file per ID (``k1`` when none is named)."""
    for key_id in ids or ("k1",):
        new_key_file(folder, key_id)
    return folder


async def codec(keys: Path, key_dsn: str, **options: int) -> PayloadCodec:
    """A started codec on ``keys`` and the key store at ``key_dsn``."""
    made = PayloadCodec(FileKeyProvider(keys), PgKeyStore(key_dsn), **options)  # type: ignore[arg-type]
    await made.start()
    return made


def pg_tool(name: str) -> str:
    """The path of a Postgres client program (``pg_dump``, ``pg_restore``, ``psql``): the
    embedded server's own when pgserver is installed (it matches that server, and a newer
    client reads older servers), else the one on PATH."""
    try:
        import pgserver

        own = Path(pgserver.__file__).parent / "pginstall" / "bin" / name
        if own.exists():
            return str(own)
    except ImportError:
        pass
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed")
    return found


def dump(dsn: str) -> bytes:
    """``pg_dump`` of the database at ``dsn``, plain SQL (what a stolen backup holds)."""
    return subprocess.run(
        [pg_tool("pg_dump"), "--no-owner", "--no-privileges", "-d", dsn],
        check=True,
        capture_output=True,
        timeout=120,
    ).stdout


def restore(sql_text: bytes, dsn: str) -> None:
    """Load a plain ``pg_dump`` into the (empty) database at ``dsn`` with ``psql``."""
    subprocess.run(
        [pg_tool("psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
        input=sql_text,
        check=True,
        capture_output=True,
        timeout=120,
    )
