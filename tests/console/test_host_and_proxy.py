"""The console's front doors over real HTTP.

DNS rebinding: a page of another site whose name now points at the console's address makes
the browser send requests with that name in ``Host``. The console answers them 421 and nothing
else, with tokens and in the open loopback mode of ``inturn local``. And a trusted proxy's
identity header sent more than once is refused (401)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import psycopg
import pytest
from multidict import CIMultiDict

from inturn.worker.console.auth import AuthConfig, Identity, parse_auth
from inturn.worker.console.names import ServerNames
from inturn.worker.console.server import ConsoleServer, start_console
from inturn.worker.store import reads
from tests.support.console import AUTH, TOKENS, enqueue, register

DEST = "ward/lab"
OPEN = AuthConfig(loopback=Identity("local", frozenset({"viewer", "operator", "privacy"})))


@pytest.fixture(params=["tokens", "open"])
async def served(request: pytest.FixtureRequest, fresh_db: str) -> AsyncIterator[Any]:
    """A console on 127.0.0.1 with bearer tokens, or open to every loopback caller; yields
    ``(server, headers that authenticate)``."""
    auth = AUTH if request.param == "tokens" else OPEN
    server = await start_console(fresh_db, host="127.0.0.1", port=0, auth=auth)
    headers = {"Authorization": f"Bearer {TOKENS['privacy'][1]}"} if auth is AUTH else {}
    try:
        yield server, headers
    finally:
        await server.stop()


async def test_a_foreign_host_gets_421_and_nothing_else(
    fresh_db: str, served: tuple[ConsoleServer, dict[str, str]]
) -> None:
    server, headers = served
    await register(fresh_db, DEST)
    [item] = await enqueue(fresh_db, DEST, [1])
    base = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/api/v1/me", headers=headers) as r:
            assert r.status == 200
            token = (await r.json())["csrfToken"]
        for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.nip.io"):
            foreign = headers | {"Host": host}
            for path in ("/api/v1/me", "/", f"/api/v1/items/{item}", "/events"):
                async with session.get(base + path, headers=foreign) as r:
                    text = await r.text()
                    assert r.status == 421, (host, path)
                    assert token not in text and "MSG00001" not in text
            changes = foreign | {"X-CSRF-Token": token, "Origin": f"http://{host}"}
            for path in (f"/api/v1/items/{item}/payload", f"/api/v1/items/{item}/skip"):
                async with session.post(base + path, json={"why": "x"}, headers=changes) as r:
                    assert r.status == 421
                    assert "DOE^JOHN" not in await r.text()
        # the console's own name with a foreign Origin: refused as a cross-site change
        cross = headers | {"X-CSRF-Token": token, "Origin": f"http://evil.example:{server.port}"}
        async with session.post(
            base + f"/api/v1/items/{item}/skip", json={"why": "x"}, headers=cross
        ) as r:
            assert r.status == 403
        async with session.get(base + "/healthz", headers={"Host": "10.0.0.7:8080"}) as r:
            assert r.status == 200  # probes name the pod's address; nothing to read there
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        shown = await reads.get_item(conn, item)
        audit = await reads.audit_log(conn)
    assert shown is not None and shown.state == "pending" and audit == []


async def test_the_names_it_serves_under_are_its_own(fresh_db: str) -> None:
    names = ServerNames.parse(["console.hospital.example"])
    server = await start_console(fresh_db, host="127.0.0.1", port=0, auth=AUTH, server_names=names)
    headers = {"Authorization": f"Bearer {TOKENS['operator'][1]}"}
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/api/v1/me", headers=headers) as r:
                assert r.status == 421  # 127.0.0.1 is not one of its names now
            named = headers | {"Host": "console.hospital.example"}
            async with session.get(base + "/api/v1/me", headers=named) as r:
                assert r.status == 200
                token = (await r.json())["csrfToken"]
            await register(fresh_db, DEST)
            [item] = await enqueue(fresh_db, DEST, [1])
            change = named | {"X-CSRF-Token": token, "Origin": "https://console.hospital.example"}
            async with session.post(
                base + f"/api/v1/items/{item}/skip", json={"why": "ok"}, headers=change
            ) as r:
                assert r.status == 200, await r.text()
    finally:
        await server.stop()


async def test_several_identity_headers_from_the_trusted_proxy_get_401(fresh_db: str) -> None:
    """The proxy (here: anything on 127.0.0.1) passes the user's name; a client that sends its
    own X-Forwarded-User through a proxy that appends rather than replaces is refused."""
    proxied = parse_auth({"proxy": {"trustedAddresses": ["127.0.0.1/32"]}})
    server = await start_console(fresh_db, host="127.0.0.1", port=0, auth=proxied)
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as session:
            one = CIMultiDict([("X-Forwarded-User", "jane")])
            async with session.get(base + "/api/v1/me", headers=one) as r:
                assert r.status == 200 and (await r.json())["name"] == "jane"
            for pairs in (
                [("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "jane")],
                [
                    ("X-Forwarded-User", "jane"),
                    ("X-Forwarded-Groups", "a"),
                    ("X-Forwarded-Groups", "b"),
                ],
            ):
                async with session.get(base + "/api/v1/me", headers=CIMultiDict(pairs)) as r:
                    assert r.status == 401
                    assert "jane" not in await r.text() and "mallory" not in await r.text()
    finally:
        await server.stop()


async def test_an_oversized_or_doubled_header_is_refused_without_an_echo(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    server = await start_console(fresh_db, host="127.0.0.1", port=0, auth=AUTH)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        secret = "S3CR3T" + "k" * 9000
        head = f"GET /api/v1/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {secret}"
        writer.write(f"{head}\r\n\r\n".encode())
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        # two Host headers (the console's own name and a foreign one): refused by the parser
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /api/v1/me HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n")
        async with asyncio.timeout(10):
            twice = await reader.read()
        writer.close()
    finally:
        await server.stop()
    assert answer.split(b" ", 2)[1] == b"400"
    assert b"S3CR3T" not in answer and "S3CR3T" not in caplog.text
    assert twice.split(b" ", 2)[1] == b"400" and b"evil" not in twice
