"""``inturn ingest`` as a process: TLS with client certificates, HTTP readiness, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys
from pathlib import Path

import aiohttp
import psycopg
import pytest

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.ingest.credentials import new_token
from tests.support.local import exchange
from tests.support.ports import free_port

pytestmark = pytest.mark.store

HOST = "127.0.0.1"
MESSAGE = b"MSH|^~\\&|S|SF|R|RF|20240101||ADT^A01|TLS-1|P|2.5.1\rPID|1||1\r"


async def send_tls(port: int, context: ssl.SSLContext, payload: bytes) -> bytes:
    reply = await exchange(port, payload, ssl=context, timeout=10)
    if reply is None:
        raise EOFError("closed")
    return reply


async def test_ingest_command_with_mutual_tls(fresh_db: str, pki: Path, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES ('hospital/adt-out', 'hospital', 'adt-out', 'adt')"
        )
    token, digest = new_token()
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(
        "credentials:\n"
        f"  - {{name: his, channels: [adt], tokenSha256: {digest}}}\n"
        "  - {name: lab, channels: [lab], clientCertificate: client.example}\n"
    )
    credentials.chmod(0o600)  # a key file: others may not read it
    mllp_port, ops_port, http_port = free_port(), free_port(), free_port()
    command = [
        sys.executable, "-c",
        "from inturn.worker.cli.ingest import ingest_command; ingest_command()",
        "--listen", f"adt={HOST}:{mllp_port}", "--ops", f"{HOST}:{ops_port}",
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"),
        "--http", f"{HOST}:{http_port}", "--http-credentials", str(credentials),
        "--allow-subject", "adt=client.example",
        "--max-frame-bytes", "1M", "--refresh", "0.5",
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *command,
        env={"INTURN_DSN": fresh_db, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://{HOST}:{ops_port}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            else:
                pytest.fail("ingest did not become ready")

        client = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        client.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
        ack = parse_ack(await send_tls(mllp_port, client, MESSAGE))
        assert (ack.code, ack.control_id) == ("AA", "TLS-1")

        anonymous = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):
            await send_tls(mllp_port, anonymous, MESSAGE.replace(b"TLS-1", b"TLS-2"))
        other = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        other.load_cert_chain(str(pki / "other.pem"), str(pki / "other.key"))
        with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):  # not an allowed subject
            await send_tls(mllp_port, other, MESSAGE.replace(b"TLS-1", b"TLS-3"))

        # HTTP over TLS: a token for adt; no client certificate needed, none refused
        url = f"https://{HOST}:{http_port}/channels/%s/messages"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=anonymous)) as http:
            headers = {"Authorization": f"Bearer {token}"}
            http_message = MESSAGE.replace(b"TLS-1", b"HTTPS-1")
            async with http.post(url % "adt", data=http_message, headers=headers) as response:
                assert response.status == 200
            async with http.post(url % "lab", data=http_message, headers=headers) as response:
                assert response.status == 403
            async with http.post(url % "adt", data=http_message) as response:
                assert response.status == 401
        # the client certificate is a credential for lab only
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as http,
            http.post(url % "adt", data=b"x") as response,
        ):
            assert response.status == 403
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 0, output.decode(errors="replace")
    assert b"over TLS" in output
    with psycopg.connect(fresh_db) as conn:
        stored = conn.execute("SELECT control_id, payload FROM inturn_message").fetchall()
    assert [(cid, bytes(p)) for cid, p in stored] == [
        ("TLS-1", MESSAGE),
        ("HTTPS-1", MESSAGE.replace(b"TLS-1", b"HTTPS-1")),
    ]


def test_ingest_command_usage_errors() -> None:
    from click.testing import CliRunner

    from inturn.worker.cli.ingest import ingest_command

    runner = CliRunner()
    result = runner.invoke(ingest_command, ["--dsn", "dbname=x", "--listen", "adt"])
    assert result.exit_code != 0 and "CHANNEL=[HOST:]PORT" in result.output
    result = runner.invoke(ingest_command, ["--dsn", "dbname=x"])
    assert result.exit_code != 0 and "nothing to serve" in result.output
    result = runner.invoke(ingest_command, ["--listen", "adt=1"], env={"INTURN_DSN": ""})
    assert result.exit_code != 0 and "INTURN_DSN" in result.output


def test_ingest_security_usage_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from inturn.worker.cli.ingest import ingest_command

    creds = tmp_path / "credentials.yaml"
    creds.write_text("credentials:\n  - {name: a, channels: [adt], clientCertificate: x}\n")
    creds.chmod(0o600)
    runner = CliRunner()
    cases = [
        (["--http", "8080"], "--http needs --http-credentials"),
        (["--http", "8080", "--http-insecure", "--http-credentials", str(creds)], "exclude"),
        (["--http", "8080", "--http-credentials", str(creds)], "need --tls-client-ca"),
        (["--listen", "adt=1", "--allow-network", "adt=10.0.0.1/8"], "CIDR"),
        (["--listen", "adt=1", "--allow-network", "lab=10.0.0.0/8"], "no --listen"),
        (["--listen", "adt=1", "--allow-subject", "adt"], "CHANNEL=VALUE"),
        (["--listen", "adt=1", "--allow-subject", "adt=ris"], "client certificates"),
    ]
    for args, message in cases:
        result = runner.invoke(ingest_command, ["--dsn", "dbname=x", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    creds.write_text("credentials: []\nextra: [")
    creds.chmod(0o600)
    result = runner.invoke(
        ingest_command, ["--dsn", "dbname=x", "--http", "1", "--http-credentials", str(creds)]
    )
    assert result.exit_code == 2 and "credentials.yaml" in result.output


def test_token_command_prints_the_token_once_and_a_file_entry(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from inturn.worker.cli import cli
    from inturn.worker.ingest.credentials import Credentials

    result = CliRunner().invoke(
        cli, ["token", "lab-system", "--channel", "lab", "--channel", "adt"]
    )
    assert result.exit_code == 0, result.output
    token = result.stderr.split("(shown once): ")[1].strip()
    assert token not in result.stdout
    path = tmp_path / "credentials.yaml"
    path.write_text("credentials:\n" + result.stdout)
    path.chmod(0o600)
    [found] = Credentials.load(path).authenticate(f"Bearer {token}")
    assert (found.name, found.channels) == ("lab-system", frozenset({"lab", "adt"}))
    everything = CliRunner().invoke(cli, ["token", "all", "--channel", "*"])
    path.write_text("credentials:\n" + everything.stdout)
    assert Credentials.load(path).entries[0].allows("anything")
    bad = CliRunner().invoke(cli, ["token", "x", "--channel", "bad name"])
    assert bad.exit_code == 2
