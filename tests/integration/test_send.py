"""``inturn send`` as a user runs it, against a real ``inturn ingest`` process: MLLP over TLS
with a client certificate, HTTP over TLS with a token, LF and CRLF files, folders, standard
input, refusals and a peer that is not there."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from inturn.worker.ingest.credentials import new_token
from tests.support.ports import free_port

pytestmark = pytest.mark.store

HOST = "127.0.0.1"
INTURN = str(Path(sys.executable).with_name("inturn"))


def message(control_id: str, sep: str = "\r", kind: str = "ADT^A01") -> bytes:
    segments = [
        f"MSH|^~\\&|HIS|H|LAB|H|20260101||{kind}|{control_id}|P|2.5",
        "PID|1||100001^^^H^MR",
    ]
    return (sep.join(segments) + sep).encode()


@contextmanager
def ingest(dsn: str, pki: Path, credentials: Path) -> Iterator[tuple[int, int]]:
    """A real ``inturn ingest``: MLLP for channel adt over TLS, client certificates required
    (subject client.example), and HTTP over TLS with the credentials file."""
    mllp, http, ops = free_port(), free_port(), free_port()
    command = [
        INTURN, "ingest", "--listen", f"adt={HOST}:{mllp}", "--ops", f"{HOST}:{ops}",
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), "--allow-subject", "adt=client.example",
        "--http", f"{HOST}:{http}", "--http-credentials", str(credentials), "--refresh", "0.5",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        env={"INTURN_DSN": dsn, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"http://{HOST}:{ops}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("ingest did not become ready")
        yield mllp, http
    finally:
        process.terminate()
        process.wait(timeout=30)


def send(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INTURN, "send", *args],
        input=stdin.decode("latin-1") if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def setup(fresh_db: str, pki: Path, tmp_path: Path) -> Iterator[tuple[int, int, str, Path]]:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES ('hospital/lab', 'hospital', 'lab', 'adt')"
        )
    token, digest = new_token()
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(
        f"credentials:\n  - {{name: his, channels: [adt, orders], tokenSha256: {digest}}}\n"
    )
    credentials.chmod(0o600)  # a key file: others may not read it
    with ingest(fresh_db, pki, credentials) as (mllp, http):
        yield mllp, http, token, tmp_path


def stored(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        # ingest stores a message once, in its channel's log
        rows = conn.execute("SELECT control_id FROM inturn_message ORDER BY id").fetchall()
    return [r[0] for r in rows]


def test_mllp_over_tls_sends_folders_files_and_stdin_in_order(
    setup: tuple[int, int, str, Path], pki: Path, fresh_db: str
) -> None:
    mllp, _, _, tmp = setup
    folder = tmp / "feed"
    folder.mkdir()
    (folder / "1.hl7").write_bytes(message("M1", "\n") + message("M2", "\n"))  # LF, two
    (folder / "2.hl7").write_bytes(message("M3", "\r\n"))  # CRLF
    # an HL7 batch: its messages go one by one (ingest stores them one by one too)
    envelope = (b"FHS|^~\\&|HIS|H\rBHS|^~\\&|HIS|H\r", b"BTS|2\rFTS|1\r")
    (folder / "3.hl7").write_bytes(envelope[0] + message("M5") + message("M6") + envelope[1])
    (folder / ".hidden").write_bytes(b"not a message")
    tls = ["--tls", "--ca-file", str(pki / "ca.pem")]
    client = ["--cert-file", str(pki / "client.pem"), "--key-file", str(pki / "client.key")]
    done = send("--mllp", f"{HOST}:{mllp}", *tls, *client, str(folder), "-", stdin=message("M4"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"AA  M1  {folder}/1.hl7#1",
        f"AA  M2  {folder}/1.hl7#2",
        f"AA  M3  {folder}/2.hl7",
        f"AA  M5  {folder}/3.hl7#1",
        f"AA  M6  {folder}/3.hl7#2",
        "AA  M4  -",
    ]
    assert done.stderr.strip() == "sent 6 of 6: AA 6"
    assert stored(fresh_db) == ["M1", "M2", "M3", "M5", "M6", "M4"]

    # without the client certificate the handshake fails: a transport failure, exit 1
    refused = send("--mllp", f"{HOST}:{mllp}", *tls, str(folder))
    assert refused.returncode == 1
    first = refused.stdout.splitlines()
    # TLS 1.3: the server refuses the certificate after the client's first write, so all the
    # client knows is that its message went out and the connection closed before the ACK
    assert len(first) == 1
    assert first[0].startswith(f"--  M1  {folder}/1.hl7#1: closed before the ACK: ")
    assert first[0].endswith(
        " (sent: it may have been stored; sending it again is a duplicate the duplicate window"
        " catches)"
    )
    assert refused.stderr.strip() == "sent 1 of 5: -- 1; 4 not sent"


def test_http_with_a_token_reports_each_answer(
    setup: tuple[int, int, str, Path], pki: Path, fresh_db: str
) -> None:
    _, http, token, tmp = setup
    one = tmp / "one.hl7"
    one.write_bytes(message("H1"))
    url = f"https://localhost:{http}/channels/adt/messages"
    ca = ["--ca-file", str(pki / "ca.pem")]
    done = send("--url", url, "--token", token, *ca, str(one))
    assert (done.returncode, done.stdout) == (0, f"AA  H1  {one}\n")

    # no token: 401, no ACK, and nothing more is tried
    refused = send("--url", url, *ca, str(one), str(one))
    assert refused.returncode == 1
    assert refused.stdout == f"--  H1  {one}: HTTP 401 Unauthorized\n"
    # a channel with no destination: AR with ingest's reason, exit 1
    unrouted = send("--url", url.replace("/adt/", "/orders/"), "--token", token, *ca, str(one))
    assert unrouted.returncode == 1
    assert unrouted.stdout == f"AR  H1  {one}: channel orders has no destinations\n"
    # a channel the token does not name: 403, no ACK
    forbidden = send("--url", url.replace("/adt/", "/lab/"), "--token", token, *ca, str(one))
    assert (forbidden.returncode, forbidden.stdout) == (1, f"--  H1  {one}: HTTP 403 Forbidden\n")
    assert stored(fresh_db) == ["H1"]


def test_bad_input_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.hl7", tmp_path / "bad.txt"
    good.write_bytes(message("G1"))
    bad.write_text("this is not HL7\n")
    port = free_port()  # nothing listens: had anything been sent, it would say so
    done = send("--mllp", f"{HOST}:{port}", str(good), str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        f"inturn: error: {bad}: does not start with an MSH segment (it starts 'this is not HL7\\n')"
    )
    usage = send(str(good))
    assert usage.returncode == 2 and "exactly one of --mllp and --url" in usage.stderr


def test_nothing_listening_counts_nothing_as_sent(tmp_path: Path) -> None:
    """A peer that cannot be reached: the first message's line says it was not sent, and so
    does the count (a new user's trial read 'sent 1 of 1' for a message that never left)."""
    for n in (1, 2):
        (tmp_path / f"{n}.hl7").write_bytes(message(f"N{n}"))
    port = free_port()  # nothing listens
    mllp = send("--mllp", f"{HOST}:{port}", "--timeout", "5", str(tmp_path))
    assert mllp.returncode == 1
    assert mllp.stdout.startswith(f"--  N1  {tmp_path}/1.hl7: unreachable: ")
    assert mllp.stdout.rstrip().endswith("(not sent)")
    assert mllp.stderr.strip() == "sent 0 of 2: -- 1; 2 not sent"
    http = send("--url", f"http://{HOST}:{port}/channels/adt/messages", str(tmp_path))
    assert http.returncode == 1
    assert http.stdout.rstrip().endswith("(not sent)")
    assert http.stderr.strip() == "sent 0 of 2: -- 1; 2 not sent"
