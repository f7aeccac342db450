"""Payload encryption for the benchmarks: a key store database beside the bench's own and a
folder with one master key, so that a benchmark can run the same case with and without
``--payload-keys`` in one run (issue 31's ``encrypted_rate_ratio``)."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from inturn.worker.crypto.masterkeys import new_key_file
from inturn.worker.store.keystore import create_schema

#: The figure's target: the encrypted rate within 10% of the plaintext one.
RATIO_TARGET = 0.9


@contextlib.contextmanager
def key_store(db: str) -> Iterator[tuple[str, str]]:
    """``(payload_keys_dir, key_dsn)``: a fresh key store database on ``db``'s server and a
    folder with master key ``k1``; both removed afterwards."""
    name = f"inturn_bench_keys_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    key_dsn = make_conninfo(db, dbname=name)
    try:
        create_schema(key_dsn)
        with tempfile.TemporaryDirectory(prefix="inturn-bench-keys-") as tmp:
            folder = Path(tmp) / "keys"
            new_key_file(folder, "k1")
            yield str(folder), key_dsn
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def ratio(encrypted: float, plain: float) -> float | None:
    """``encrypted / plain`` rounded to 3 places (None when the plain rate is 0)."""
    return round(encrypted / plain, 3) if plain else None
