"""The console's audited payload view decrypts an encrypted payload on demand, with the keys it
was started with, and refuses it in one line without them (issue 31)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from psycopg import AsyncConnection

from inturn.worker.console.server import start_console
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support import keys
from tests.support.console import AUTH, Client, message

DEST = "ward/lab"


async def view(fresh_db: str, item: int, payloads: PayloadCodec | None) -> tuple[int, object]:
    server = await start_console(
        fresh_db, host="127.0.0.1", port=0, auth=AUTH, refresh_seconds=0.5, payloads=payloads
    )
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, f"http://127.0.0.1:{server.port}", "privacy")
            return await client.post(f"/api/v1/items/{item}/payload", {"why": "ticket 9"})
    finally:
        await server.stop()


async def test_the_payload_view_decrypts_with_the_keys_and_refuses_without(
    fresh_db: str, tmp_path: Path, key_dsn: str
) -> None:
    folder = keys.master_keys(tmp_path / "keys")
    codec = await keys.codec(folder, key_dsn)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        [item] = await queue.enqueue(
            conn, [NewItem(DEST, "adt", "MSG00007", "ADT^A01", message(7))], codec
        )
    status, body = await view(fresh_db, item, codec)
    assert status == 200
    assert body["segments"][1] == "PID|1||P7^^^HOSP^MR||DOE^JOHN"  # type: ignore[index]
    status, body = await view(fresh_db, item, None)
    assert status == 400 and "DOE" not in json.dumps(body)
    assert "--payload-keys" in body["error"]["message"]  # type: ignore[index]


async def search(fresh_db: str, payloads: PayloadCodec | None) -> tuple[int, object]:
    server = await start_console(
        fresh_db, host="127.0.0.1", port=0, auth=AUTH, refresh_seconds=0.5, payloads=payloads
    )
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, f"http://127.0.0.1:{server.port}", "privacy")
            return await client.post(
                "/api/v1/search/patient", {"patientId": "P7", "why": "ticket 9"}
            )
    finally:
        await server.stop()


async def test_the_patient_search_without_keys_on_a_sealed_database_refuses(
    fresh_db: str, tmp_path: Path, key_dsn: str
) -> None:
    """A console started without --payload-keys cannot compute the blind index its sealed rows
    are indexed under: its patient search answers 400 naming --payload-keys, not total 0."""
    folder = keys.master_keys(tmp_path / "keys")
    codec = await keys.codec(folder, key_dsn)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue.enqueue(
            conn,
            [NewItem(DEST, "adt", f"MSG0000{n}", "ADT^A01", message(7)) for n in range(3)],
            codec,
        )
    status, body = await search(fresh_db, codec)
    assert (status, body["total"]) == (200, 3)  # type: ignore[index]
    status, body = await search(fresh_db, None)
    assert status == 400 and "total" not in body  # type: ignore[operator]
    error = body["error"]  # type: ignore[index]
    assert error["code"] == "payload_keys" and "--payload-keys" in error["message"]
