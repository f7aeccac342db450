"""Payload encryption in tests: a key store database of its own and a folder of master keys."""

from __future__ import annotations

import contextlib
import secrets
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


def files_not_here(dsn: str) -> str | None:
    """Why the server's files cannot be read from this process, or None where they can.

    A server elsewhere (``INTURN_TEST_DSN`` naming another machine, or a data folder this user
    cannot read) is the one reason to skip a test of what lies on disk; a file that goes while it
    is read is a failure of that test, never a skip.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        data = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    try:
        (data / "PG_VERSION").read_bytes()
        next((data / "pg_wal").iterdir(), None)
    except OSError as exc:
        return f"the server's files are not readable here: {exc}"
    return None


def relation_bytes(dsn: str, table: str) -> bytes:
    """The heap and TOAST files of ``table`` as they lie on disk (after a checkpoint).

    Raises:
        OSError: the server's files are not on this machine or not readable
            (:func:`files_not_here` tells beforehand).
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


@contextlib.contextmanager
def wal_kept(dsn: str) -> Iterator[str]:
    """The WAL the server writes from now on, kept until the block ends.

    Yields the insert position (an LSN, for :func:`wal_bytes`). A temporary physical replication
    slot, reserved at once, keeps the server from removing or recycling a segment of it at a
    checkpoint (one such, renamed while :func:`wal_bytes` read the folder, would be a file gone);
    the slot goes with its session when the block ends. Needs ``wal_level`` replica or above.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        slot = f"inturn_wal_kept_{secrets.token_hex(6)}"  # a slot's name is the server's
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (slot,))
        yield str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]


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
