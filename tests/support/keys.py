"""Payload encryption in tests: a key store database of its own and a folder of master keys."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.masterkeys import FileKeyProvider, new_key_file
from inturn.worker.store.keystore import PgKeyStore, create_schema
from tests.support.db import database


@contextlib.contextmanager
def key_store(server_dsn: str) -> Iterator[str]:
    """A key store database with its tables; yields its DSN."""
    with database(server_dsn, "inturn_keys") as dsn:
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


def relation_bytes(dsn: str, table: str) -> bytes:
    """The heap and TOAST files of ``table`` as they lie on disk (after a checkpoint).

    Raises:
        OSError: the server's files are not on this machine or not readable.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        data = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        files = conn.execute(
            "SELECT pg_relation_filepath(c.oid), pg_relation_filepath(c.reltoastrelid)"
            " FROM pg_class c WHERE c.relname = %s",
            (table,),
        ).fetchone()
    assert files is not None
    return b"".join((data / f).read_bytes() for f in files if f)


def wal_position(dsn: str) -> str:
    """The server's current WAL insert position (an LSN, for :func:`wal_bytes`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]


def wal_bytes(dsn: str, since: str) -> bytes:
    """The WAL segment files the server wrote from LSN ``since`` to now, as they lie on disk.

    Raises:
        OSError: the server's files are not on this machine or not readable.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_switch_wal()")
        data = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        first, last = conn.execute(
            "SELECT pg_walfile_name(%s::pg_lsn), pg_walfile_name(pg_current_wal_insert_lsn())",
            (since,),
        ).fetchone()  # type: ignore[misc]
    names = sorted(p.name for p in (data / "pg_wal").iterdir() if len(p.name) == 24)
    chosen = [n for n in names if first <= n <= last]
    return b"".join((data / "pg_wal" / n).read_bytes() for n in chosen)
