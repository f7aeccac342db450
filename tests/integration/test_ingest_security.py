"""Who may send: authenticated HTTP ingest (tokens, client certificates, TLS), the operations
port, and MLLP allow-lists (client-certificate subjects, source networks), against a real
Postgres, real sockets and real TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from prometheus_client import REGISTRY

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.ingest.access import AllowList
from inturn.worker.ingest.config import IngestConfig, server_tls_context
from inturn.worker.ingest.credentials import (
    Credential,
    Credentials,
    CredentialsFile,
    new_token,
    token_digest,
)
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from tests.support.ingest import pull_all

pytestmark = pytest.mark.store

HOST = "127.0.0.1"
ADT_TOKEN = "adt-sender-token-0123456789abcdef"
LAB_TOKEN, LAB_DIGEST = new_token()


def msg(control_id: str) -> bytes:
    return (
        f"MSH|^~\\&|S|SF|R|RF|20240101||ADT^A01|{control_id}|P|2.5.1\rPID|1||SECRET-MRN\r"
    ).encode()


def stored(dsn: str) -> list[str]:
    pull_all(dsn)  # what each destination's worker pulls from the channel log
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT control_id FROM inturn_delivery ORDER BY id").fetchall()
    return [r[0] for r in rows]


def received(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM inturn_received").fetchone()
    assert row is not None
    return int(row[0])


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def register(dsn: str, *channels: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for channel in channels:
            conn.execute(
                "INSERT INTO inturn_destination (destination, namespace, name, channel)"
                " VALUES (%s, 'hospital', %s, %s)",
                (f"hospital/{channel}-out", f"{channel}-out", channel),
            )


CREDENTIALS = Credentials(
    [
        Credential("adt-sender", frozenset({"adt"}), token_sha256=token_digest(ADT_TOKEN)),
        Credential("lab-sender", frozenset({"lab"}), token_sha256=bytes.fromhex(LAB_DIGEST)),
        Credential("client-cert", frozenset({"adt"}), subject="client.example"),
    ]
)


@contextlib.asynccontextmanager
async def running(dsn: str, **overrides: Any) -> AsyncIterator[Ingest]:
    base: dict[str, Any] = {
        "http": (HOST, 0),
        "credentials": CREDENTIALS,
        "ops": (HOST, 0),
        "refresh_seconds": 0.2,
        "shutdown_grace": 2.0,
    }
    base.update(overrides)
    async with Ingest(IngestConfig(**base), dsn=dsn) as ingest:
        yield ingest


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- HTTP: 401, 403, nothing stored --------------------------------------------------------------


async def test_http_refuses_without_credential_and_for_another_channel(fresh_db: str) -> None:
    register(fresh_db, "adt", "lab")
    unauthenticated = counter("inturn_ingest_http_refused_total", reason="unauthenticated")
    forbidden = counter("inturn_ingest_http_refused_total", reason="forbidden")
    async with running(fresh_db) as ingest, aiohttp.ClientSession() as http:
        url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
        for headers in (
            {},
            bearer("not-the-token-not-the-token-xx"),
            bearer(ADT_TOKEN + "x"),
            {"Authorization": f"Basic {ADT_TOKEN}"},
            {"Authorization": "Bearer"},
        ):
            async with http.post(url, data=msg("NOPE"), headers=headers) as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"] == 'Bearer realm="inturn"'
                assert await response.text() == "unauthorized\n"
        # a valid credential for another channel: 403, even for a channel that does not exist
        for channel in ("adt", "nowhere"):
            async with http.post(
                f"http://{HOST}:{ingest.http_port}/channels/{channel}/messages",
                data=msg("WRONG"),
                headers=bearer(LAB_TOKEN),
            ) as response:
                assert response.status == 403
                assert await response.text() == "forbidden\n"
        assert stored(fresh_db) == [] and received(fresh_db) == 0
        # the right credential for the channel
        async with http.post(url, data=msg("OK-1"), headers=bearer(ADT_TOKEN)) as response:
            assert response.status == 200
            assert parse_ack(await response.read()).code == "AA"
        lab = f"http://{HOST}:{ingest.http_port}/channels/lab/messages"
        async with http.post(lab, data=msg("OK-2"), headers=bearer(LAB_TOKEN)) as response:
            assert response.status == 200
    assert stored(fresh_db) == ["OK-1", "OK-2"]
    assert counter("inturn_ingest_http_refused_total", reason="unauthenticated") == (
        unauthenticated + 5
    )
    assert counter("inturn_ingest_http_refused_total", reason="forbidden") == forbidden + 2


async def test_refusal_logs_carry_no_token_and_no_payload(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    register(fresh_db, "adt")
    caplog.set_level("DEBUG", logger="inturn")
    async with running(fresh_db) as ingest, aiohttp.ClientSession() as http:
        url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
        async with http.post(url, data=msg("X"), headers=bearer(LAB_TOKEN)) as response:
            assert response.status == 403
        async with http.post(url, data=msg("Y"), headers=bearer("guess" * 8)) as response:
            assert response.status == 401
    assert "lab-sender may not post to 'adt'" in caplog.text
    assert LAB_TOKEN not in caplog.text and "guess" not in caplog.text
    assert "SECRET-MRN" not in caplog.text


async def raw_request(port: int, head: bytes) -> bytes:
    """Send ``head`` (a request line and headers) on a new connection; the whole answer."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(head)
    await writer.drain()
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    return answer


async def test_an_unreadable_request_is_answered_and_logged_without_its_bytes(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A header or request line over aiohttp's 8,190-byte limit, or malformed, is answered 400
    with a fixed text and logged once per peer per minute, without a byte of what was sent."""
    register(fresh_db, "adt")
    caplog.set_level("DEBUG")  # every logger, aiohttp's included
    secret = "S3CR3T" + "k" * 9000  # a bearer token over the limit
    path = "/channels/adt/messages"
    heads = [
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
        "Content-Length: 0\r\n\r\n",
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
        "Content-Length: 0\r\n\r\n",
        f"POST {path}?access_token={secret} HTTP/1.1\r\nHost: x\r\n\r\n",  # request line
        f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Token: S3CR3T\x01bad\r\n\r\n",  # malformed
        f"S3CR3T {path} HTTP/1.1\r\n\r\n",  # not a method
    ]
    before = counter("inturn_http_requests_malformed_total", server="ingest-http", status="400")
    async with running(fresh_db) as ingest:
        assert ingest.http_port is not None
        answers = [await raw_request(ingest.http_port, h.encode("latin-1")) for h in heads]
    for answer in answers:
        assert answer.split(b" ", 2)[1] == b"400", answer[:200]
        assert b"S3CR3T" not in answer and b"kkkkkkkk" not in answer and b"bad" not in answer
        assert b"too long or malformed" in answer
    assert "S3CR3T" not in caplog.text and "kkkkkkkk" not in caplog.text
    assert "Traceback" not in caplog.text
    lines = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(lines) == 1 and HOST in lines[0].getMessage()  # once per peer per minute
    assert counter(
        "inturn_http_requests_malformed_total", server="ingest-http", status="400"
    ) == before + len(heads)
    assert stored(fresh_db) == [] and received(fresh_db) == 0


async def test_operations_port_is_apart_from_the_message_port(fresh_db: str) -> None:
    async with running(fresh_db) as ingest, aiohttp.ClientSession() as http:
        assert ingest.ops_port not in (None, ingest.http_port)
        for path in ("/metrics", "/healthz", "/readyz"):
            async with http.get(f"http://{HOST}:{ingest.http_port}{path}") as response:
                assert response.status in (404, 405)
            async with http.get(f"http://{HOST}:{ingest.ops_port}{path}") as response:
                assert response.status == 200
        async with http.post(
            f"http://{HOST}:{ingest.ops_port}/channels/adt/messages",
            data=msg("OPS"),
            headers=bearer(ADT_TOKEN),
        ) as response:
            assert response.status in (404, 405)
    assert stored(fresh_db) == []


def test_http_without_credentials_needs_an_explicit_insecure_flag() -> None:
    with pytest.raises(ValueError, match="--http-insecure"):
        IngestConfig(http=(HOST, 0))
    IngestConfig(http=(HOST, 0), http_insecure=True)
    with pytest.raises(ValueError, match="exclude"):
        IngestConfig(http=(HOST, 0), http_insecure=True, credentials=CREDENTIALS)


async def test_insecure_mode_says_it_is_open(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    register(fresh_db, "adt")
    caplog.set_level("INFO", logger="inturn")
    async with (
        running(fresh_db, credentials=None, http_insecure=True) as ingest,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"
        async with http.post(url, data=msg("OPEN")) as response:
            assert response.status == 200
    assert "OPEN: no authentication" in caplog.text
    assert stored(fresh_db) == ["OPEN"]


# --- HTTP over TLS, tokens and client certificates -----------------------------------------------


def client_context(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert is not None:
        context.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    return context


async def test_http_over_tls_with_tokens_and_client_certificates(fresh_db: str, pki: Path) -> None:
    register(fresh_db, "adt", "lab")
    http_ssl = server_tls_context(
        str(pki / "server.pem"),
        str(pki / "server.key"),
        str(pki / "ca.pem"),
        client_cert_required=False,
    )
    async with running(fresh_db, http_ssl=http_ssl) as ingest:
        url = f"https://{HOST}:{ingest.http_port}/channels/%s/messages"

        async def post(
            channel: str, control_id: str, cert: str | None, headers: dict[str, str]
        ) -> int:
            connector = aiohttp.TCPConnector(ssl=client_context(pki, cert))
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                http.post(url % channel, data=msg(control_id), headers=headers) as response,
            ):
                return response.status

        assert await post("adt", "T-TOKEN", None, bearer(ADT_TOKEN)) == 200
        assert await post("adt", "T-ANON", None, {}) == 401
        assert await post("adt", "T-CERT", "client", {}) == 200  # the certificate is the credential
        assert await post("lab", "T-CERT-LAB", "client", {}) == 403  # ...for adt only
        assert await post("adt", "T-OTHER", "other", {}) == 401  # signed by the CA, not listed
        # a wrong token is not rescued by a good certificate
        assert await post("adt", "T-BOTH", "client", bearer("x" * 30)) == 401
        # plain HTTP to the TLS port gets nowhere
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.post(
                    f"http://{HOST}:{ingest.http_port}/channels/adt/messages",
                    data=msg("T-PLAIN"),
                    headers=bearer(ADT_TOKEN),
                ) as response:
                    await response.read()
    assert stored(fresh_db) == ["T-TOKEN", "T-CERT"]


# --- MLLP allow-lists ----------------------------------------------------------------------------


async def exchange(port: int, payload: bytes, context: ssl.SSLContext | None = None) -> bytes:
    """Send one framed message; return the framed reply, or b"" when the server closed first."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=context)
    framer = FrameReader(1 << 20)
    try:
        writer.write(frame(payload))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        async with asyncio.timeout(10):
            while True:
                try:
                    data = await reader.read(65536)
                except (ConnectionError, ssl.SSLError):
                    return b""
                if not data:
                    return b""
                for event in framer.feed(data):
                    if isinstance(event, Frame):
                        return event.payload
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_client_certificate_allowed_on_one_channel_is_refused_on_another(
    fresh_db: str, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    register(fresh_db, "adt", "lab")
    caplog.set_level("INFO", logger="inturn")
    mllp_ssl = server_tls_context(
        str(pki / "server.pem"), str(pki / "server.key"), str(pki / "ca.pem")
    )
    listeners = [
        ListenerConfig("adt", HOST, 0, mllp_ssl, AllowList.build(subjects=["client"])),  # CN
        ListenerConfig("lab", HOST, 0, mllp_ssl, AllowList.build(subjects=["other.example"])),
    ]
    before = counter("inturn_ingest_connections_refused_total", channel="lab", reason="subject")
    async with running(fresh_db, listeners=listeners, http=None, credentials=None) as ingest:
        ports = ingest.mllp_ports
        ack = parse_ack(await exchange(ports["adt"], msg("M-ADT"), client_context(pki, "client")))
        assert ack.code == "AA"
        assert await exchange(ports["lab"], msg("M-LAB"), client_context(pki, "client")) == b""
        ack = parse_ack(await exchange(ports["lab"], msg("M-LAB2"), client_context(pki, "other")))
        assert ack.code == "AA"  # matched by its SAN
        assert await exchange(ports["adt"], msg("M-ADT2"), client_context(pki, "other")) == b""
    assert stored(fresh_db) == ["M-ADT", "M-LAB2"]
    after = counter("inturn_ingest_connections_refused_total", channel="lab", reason="subject")
    assert after == before + 1
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert refusals == [
        "channel lab: refused a connection from 127.0.0.1 (client certificate not allowed)",
        "channel adt: refused a connection from 127.0.0.1 (client certificate not allowed)",
    ]


async def test_source_address_outside_the_allowed_networks_is_refused(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    register(fresh_db, "adt", "lab")
    caplog.set_level("INFO", logger="inturn")
    listeners = [
        ListenerConfig("adt", HOST, 0, None, AllowList.build(networks=["10.20.0.0/16"])),
        ListenerConfig(
            "lab", HOST, 0, None, AllowList.build(networks=["10.0.0.0/8", "127.0.0.0/8"])
        ),
    ]
    before = counter("inturn_ingest_connections_refused_total", channel="adt", reason="network")
    async with running(fresh_db, listeners=listeners, http=None, credentials=None) as ingest:
        ports = ingest.mllp_ports
        for n in range(3):
            assert await exchange(ports["adt"], msg(f"N-ADT-{n}")) == b""
        assert parse_ack(await exchange(ports["lab"], msg("N-LAB"))).code == "AA"
    assert stored(fresh_db) == ["N-LAB"]
    assert received(fresh_db) == 1
    after = counter("inturn_ingest_connections_refused_total", channel="adt", reason="network")
    assert after == before + 3
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    # counted three times, logged once per address and minute
    assert refusals == [
        "channel adt: refused a connection from 127.0.0.1 (source address not allowed)"
    ]
    assert "SECRET-MRN" not in caplog.text


async def test_network_refusal_comes_before_the_tls_handshake(fresh_db: str, pki: Path) -> None:
    register(fresh_db, "adt")
    mllp_ssl = server_tls_context(str(pki / "server.pem"), str(pki / "server.key"))
    listeners = [ListenerConfig("adt", HOST, 0, mllp_ssl, AllowList.build(networks=["10.0.0.0/8"]))]
    async with running(fresh_db, listeners=listeners, http=None, credentials=None) as ingest:
        reader, writer = await asyncio.open_connection(HOST, ingest.mllp_ports["adt"])
        try:
            # no ClientHello sent: the server closes without waiting for one
            async with asyncio.timeout(5):
                assert await reader.read(100) == b""
        finally:
            writer.close()


def test_allowed_subjects_need_client_certificates(pki: Path) -> None:
    no_client_ca = server_tls_context(str(pki / "server.pem"), str(pki / "server.key"))
    for context in (None, no_client_ca):
        with pytest.raises(ValueError, match="client certificates"):
            ListenerConfig("adt", HOST, 0, context, AllowList.build(subjects=["client"]))


async def test_a_rotated_credentials_file_takes_effect_without_a_restart(
    fresh_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    register(fresh_db, "adt")
    caplog.set_level("INFO", logger="inturn")
    old, new = "old-token-" + "a" * 20, "new-token-" + "b" * 20
    path = tmp_path / "credentials.yaml"

    def write(*tokens: str, extra: str = "") -> None:
        entries = "".join(
            f"  - {{name: s{i}, channels: [adt], tokenSha256: {token_digest(t).hex()}}}\n"
            for i, t in enumerate(tokens)
        )
        staged = tmp_path / "staged.yaml"
        staged.write_text("credentials:\n" + entries + extra)
        staged.chmod(0o600)  # a key file: others may not read it
        staged.replace(path)  # a new inode, as a Secret update swaps a symlink

    write(old)
    source = CredentialsFile(path, interval=0)
    async with running(fresh_db, credentials=source) as ingest, aiohttp.ClientSession() as http:
        url = f"http://{HOST}:{ingest.http_port}/channels/adt/messages"

        async def status(token: str, control_id: str) -> int:
            async with http.post(url, data=msg(control_id), headers=bearer(token)) as response:
                return response.status

        assert (await status(old, "R1"), await status(new, "R2")) == (200, 401)
        write(new)  # rotation: the old token is revoked, the new one works
        assert (await status(old, "R3"), await status(new, "R4")) == (401, 200)
        write(new, extra="  - {name: broken}\n")  # an invalid version keeps the last good one
        assert (await status(old, "R5"), await status(new, "R6")) == (401, 200)
    assert stored(fresh_db) == ["R1", "R4", "R6"]
    assert "credentials reloaded" in caplog.text
    assert "credentials not reloaded, the previous ones stay in force" in caplog.text
    assert old not in caplog.text and new not in caplog.text
