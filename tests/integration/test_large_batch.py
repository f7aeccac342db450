"""A store batch of any size is stored whole: sealed (two pipelined round trips) and in clear
(one statement), 8 MB of payloads in one ``store_batch``.

A sealed batch of about 2.4 MB once hung for ever over the embedded server's Unix socket:
psycopg's ``AsyncPipeline.sync()`` waits for answers after one flush of what it queued, and
what the socket had not taken yet stayed in the client while the server waited for it (the
store no longer syncs a pipeline by hand: the end of its block sends everything first;
tests/unit/test_layers.py). Here over the embedded server's Unix socket, as it hung,
and over the test server's connection with its send buffer cut to 64 KiB (as a slow network
would leave it; over loopback TCP, as CI's server is reached, the old code hung so at 8 MB
where the default buffers hid it below about 20 MB). Every wait is bounded."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.masterkeys import FileKeyProvider
from inturn.worker.local.embedded import start_embedded
from inturn.worker.store import ingest
from inturn.worker.store.keystore import PgKeyStore
from inturn.worker.store.migrate import migrate
from inturn.worker.store.model import Message
from tests.support import keys
from tests.support.db import database
from tests.support.ingest import to_store

pytestmark = pytest.mark.store

#: Payload bytes in the batch: above three times what hung (about 2.4 MB).
BATCH_BYTES = 8_000_000
#: One message's size: about the largest of the samples (a report with its text).
MESSAGE_BYTES = 16_000
#: The client's send buffer on the test server's connection, bytes (Linux doubles it).
SMALL_SEND_BUFFER = 65_536
#: Seconds a whole batch may take (it takes under one here).
BOUND_SECONDS = 120


def report(n: int) -> bytes:
    head = (
        f"MSH|^~\\&|LAB|HOSP|EHR|HOSP|20261206120000||ORU^R01|BIG{n:06d}|P|2.5\r"
        f"PID|1||BIG-{n % 7}^^^HOSP^MR||ZYZZYVA^Q\r"
    )
    line = f"OBX|{n}|TX|||{'report text ' * 16}\r"
    return (head + line * ((MESSAGE_BYTES - len(head)) // len(line))).encode()


def message(payload: bytes) -> Message:
    return to_store(payload, "ORU^R01")


def small_send_buffer(conn: AsyncConnection[Any]) -> None:
    """Cut the client's send buffer of ``conn``'s socket (a duplicate of its descriptor)."""
    with socket.socket(fileno=socket.dup(conn.pgconn.socket)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SEND_BUFFER)


async def store_and_check(
    dsn: str, codec: PayloadCodec | None, channel: str, small_buffer: bool
) -> None:
    """Store one batch of :data:`BATCH_BYTES` on ``channel``; every row is there, whole."""
    payloads = [report(n) for n in range(BATCH_BYTES // MESSAGE_BYTES + 2)]
    assert sum(map(len, payloads)) > BATCH_BYTES
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        if small_buffer:
            small_send_buffer(conn)
        async with asyncio.timeout(BOUND_SECONDS):
            results = await ingest.store_batch(
                conn,
                channel=channel,
                destinations=["ward/big"],
                messages=[message(p) for p in payloads],
                window_seconds=60,
                payloads=codec,
            )
    ids = [i for r in results for i in r.ids]
    assert len(ids) == len(payloads) and not any(r.duplicate for r in results)
    with psycopg.connect(dsn) as check:
        rows = check.execute(
            "SELECT id, payload FROM inturn_message WHERE id = ANY(%s) ORDER BY id", [ids]
        ).fetchall()
    assert [i for i, _ in rows] == sorted(ids)
    stored = [bytes(p) for _, p in rows]
    if codec is not None:
        assert not any(p in s for p, s in zip(payloads, stored, strict=True))
        scope = f"channel:{channel}"
        stored = [await codec.open(i, scope, s) for (i, _), s in zip(rows, stored, strict=True)]
    assert stored == payloads


async def store_both(server_dsn: str, db_dsn: str, small_buffer: bool) -> None:
    with keys.key_store(server_dsn) as key_dsn:
        folder = Path(tempfile.mkdtemp(prefix="inturn-big-keys-"))
        try:
            store = PgKeyStore(key_dsn)
            provider = FileKeyProvider(keys.master_keys(folder / "keys"))
            codec = PayloadCodec(provider, store)  # type: ignore[arg-type]
            await codec.start()
            try:
                await store_and_check(db_dsn, codec, "sealed", small_buffer)
            finally:
                await store.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    await store_and_check(db_dsn, None, "clear", small_buffer)


async def test_an_8_mb_batch_is_stored_whole_through_a_small_send_buffer(
    pg_server_dsn: str, fresh_db: str
) -> None:
    await store_both(pg_server_dsn, fresh_db, small_buffer=True)


@pytest.mark.slow  # a server of its own
async def test_an_8_mb_batch_is_stored_whole_over_the_embedded_servers_unix_socket(
    pg_home: Path,
) -> None:
    embedded = await asyncio.to_thread(start_embedded, pg_home / "d")
    try:
        assert "host=/" in embedded.dsn  # its Unix socket: it listens on no address
        with database(embedded.dsn, "inturn_big") as db_dsn:
            await asyncio.to_thread(migrate, db_dsn)
            await store_both(embedded.dsn, db_dsn, small_buffer=False)
    finally:
        await asyncio.to_thread(embedded.stop)
