"""The operators' command line as a user runs it: a subprocess, its output and exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
import pytest

from inturn.worker.cli.options import os_user
from inturn.worker.store.notify import notify_channel
from tests.support.ports import free_port

INTURN = str(Path(sys.executable).with_name("inturn"))
ROOT = Path(__file__).resolve().parents[2]
DEST = "ward/lab"


def run(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [INTURN, *args]
    if dsn is not None:
        cmd += ["--dsn", dsn]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def message(n: int, patient: str, sep: str = "|", enc: str = "^~\\&") -> bytes:
    c, r = enc[0], enc[1]
    return (
        f"MSH{sep}{enc}{sep}A{sep}B{sep}C{sep}D{sep}{sep}{sep}ADT{c}A01{sep}M{n}{sep}P{sep}2.5\r"
        f"PID{sep}1{sep}{sep}OTHER{c}{c}{c}X{r}{patient}{c}{c}{c}HOSP{c}MR{sep}{sep}DOE\r"
    ).encode()


def insert(dsn: str, payloads: list[bytes], state: str = "pending") -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = []
        for i, p in enumerate(payloads):
            finished = "now()" if state != "pending" else "NULL"
            row = conn.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                f" payload, size, state, finished_at) VALUES (%s, 'adt', %s, 'ADT^A01', %s, %s,"
                f" %s, {finished}) RETURNING id",
                (DEST, f"M{i}", p, len(p), state),
            ).fetchone()
            assert row is not None
            ids.append(row[0])
        return ids


def audit(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT who, action, item_ids FROM inturn_audit ORDER BY id").fetchall()


def test_depth_list_show_and_payload(fresh_db: str) -> None:
    raw = message(1, "P1")
    [a, b] = insert(fresh_db, [raw, message(2, "P2")])
    depth = json.loads(run("queue", "depth", "--json", dsn=fresh_db).stdout)
    assert [(d["destination"], d["pending"], d["failed"]) for d in depth] == [(DEST, 2, 0)]
    listed = json.loads(run("queue", "list", "--json", "--limit", "1", dsn=fresh_db).stdout)
    assert listed["total"] == 2 and [i["id"] for i in listed["items"]] == [b]
    assert "payload" not in listed["items"][0]
    shown = json.loads(run("queue", "show", str(a), "--json", dsn=fresh_db).stdout)
    assert shown["controlId"] == "M0" and shown["state"] == "pending"
    # no --who: the audit names the operating-system user (here, as a login sets it)
    person = {k: v for k, v in os.environ.items() if k != "SUDO_USER"} | {"LOGNAME": "a.nurse"}
    out = subprocess.run(
        [INTURN, "queue", "payload", str(a), "--why", "ticket 7", "--dsn", fresh_db],
        capture_output=True,
        check=True,
        timeout=60,
        env=person,
    )
    assert out.stdout == raw
    if os.geteuid() == 0:  # through sudo, the person who ran sudo
        subprocess.run(
            [INTURN, "queue", "payload", str(a), "--why", "ticket 8", "--dsn", fresh_db],
            capture_output=True,
            check=True,
            timeout=60,
            env=person | {"SUDO_USER": "b.admin"},
        )
    with psycopg.connect(fresh_db) as conn:
        viewed = conn.execute(
            "SELECT who, why FROM inturn_audit WHERE action = 'view-payload' ORDER BY id"
        ).fetchall()
    assert viewed[0] == ("a.nurse", "ticket 7")
    assert viewed[1:] == ([("b.admin", "ticket 8")] if os.geteuid() == 0 else [])
    unsaid = run(
        "queue", "payload", str(a), dsn=fresh_db
    )  # viewing needs a reason, as in the console
    assert unsaid.returncode == 2 and "--why" in unsaid.stderr
    table = run("queue", "depth", dsn=fresh_db).stdout
    assert table.splitlines()[0].split() == [
        "DESTINATION",
        "CHANNEL",
        "PENDING",
        "FAILED",
        "OLDEST",
        "MOST-ATTEMPTS",
        "HELD-UNTIL",
        "HEAD",
        "HEAD-LAST-ERROR",
    ]


def test_skip_drain_retry_resend_and_remove(fresh_db: str) -> None:
    a, b, c = insert(fresh_db, [message(n, "P") for n in range(3)])
    assert run("queue", "skip", str(a), "--why", "dup", dsn=fresh_db).returncode == 2  # --who
    assert run("queue", "skip", str(a), "--who", "alice", dsn=fresh_db).returncode == 2  # --why
    assert (
        run("queue", "skip", str(a), "--who", "alice", "--why", "dup", dsn=fresh_db).returncode == 0
    )
    retried = run("queue", "retry", "--destination", DEST, dsn=fresh_db)
    assert retried.returncode == 0 and "2 item(s)" in retried.stdout
    assert run("queue", "drain", DEST, "--who", "bob", dsn=fresh_db).returncode == 2  # --why
    assert (
        run("queue", "drain", DEST, "--who", "bob", "--why", "stale", dsn=fresh_db).returncode == 0
    )
    refused = run("queue", "resend", str(a), "--who", "carol", dsn=fresh_db)
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        f"inturn: error: item {a} was skipped: only failed items are resent without"
        " --include-delivered",
    )
    resent = run("queue", "resend", str(a), "--who", "carol", "--include-delivered", dsn=fresh_db)
    assert resent.returncode == 0, resent.stderr
    removed = run("queue", "remove", str(a), str(b), dsn=fresh_db)
    assert removed.returncode == 0 and "removed 2" in removed.stdout
    # Without --who, the audit names the operating-system user, as an audit trail should.
    me = os_user()
    assert [(w, act) for w, act, _ in audit(fresh_db)] == [
        ("alice", "skip"),
        (me, "retry-now"),
        ("bob", "drain"),
        ("carol", "resend"),
        (me, "remove"),
    ]
    with psycopg.connect(fresh_db) as conn:
        states = conn.execute("SELECT id, state FROM inturn_delivery ORDER BY id").fetchall()
    assert [s for _, s in states] == ["skipped", "pending"]  # c drained; a's copy pending
    assert states[0][0] == c


def test_erase_by_patient_id_whatever_the_encoding_characters(fresh_db: str) -> None:
    ids = insert(
        fresh_db,
        [
            message(1, "MRN-42"),
            message(2, "MRN-7"),
            message(3, "MRN-42", sep="#", enc="$*!@"),  # other separators, same patient
        ],
    )
    insert(fresh_db, [message(4, "MRN-42")], state="delivered")
    dry = json.loads(
        run(
            "queue",
            "erase",
            "--patient-id",
            "MRN-42",
            "--who",
            "dpo",
            "--why",
            "request 9",
            "--dry-run",
            "--json",
            dsn=fresh_db,
        ).stdout
    )
    matched = [m["id"] for m in dry["matched"]]
    assert matched == [ids[0], ids[2], ids[2] + 1] and dry["erased"] == []
    assert audit(fresh_db) == [("dpo", "search-patient", matched)]  # a dry run is a lookup
    unsaid = run("queue", "erase", "--patient-id", "MRN-42", "--who", "dpo", dsn=fresh_db)
    assert unsaid.returncode == 2 and "erase needs a reason (--why)" in unsaid.stderr
    done = run(
        "queue", "erase", "--patient-id", "MRN-42", "--who", "dpo", "--why", "request 9",
        dsn=fresh_db,
    )  # fmt: skip
    assert done.returncode == 0 and "erased 3" in done.stdout
    assert "MRN-42" not in done.stdout.replace("--patient-id", "")  # no payload echoed
    with psycopg.connect(fresh_db) as conn:
        left = conn.execute("SELECT id FROM inturn_delivery").fetchall()
    assert left == [(ids[1],)]
    assert audit(fresh_db) == [("dpo", "search-patient", matched), ("dpo", "erase", matched)]


def test_list_by_control_id_and_patient_id(fresh_db: str) -> None:
    ids = insert(fresh_db, [message(1, "MRN-42"), message(2, "MRN-7"), message(3, "MRN-42")])
    migrate = run("migrate", dsn=fresh_db)  # indexes the rows stored without keys
    assert migrate.returncode == 0, migrate.stderr
    listed = json.loads(run("queue", "list", "--control-id", "M1", "--json", dsn=fresh_db).stdout)
    assert [i["id"] for i in listed["items"]] == [ids[1]] and listed["total"] == 1
    why = ("--who", "dpo", "--why", "ticket 4")
    by_patient = run(
        "queue", "list", "--patient-id", "MRN-42", "--authority", "HOSP", "--json", *why,
        dsn=fresh_db,
    )  # fmt: skip
    assert by_patient.stderr == ""
    assert [i["id"] for i in json.loads(by_patient.stdout)["items"]] == [ids[2], ids[0]]
    other = run("queue", "list", "--patient-id", "MRN-42", "--authority", "LAB", *why, dsn=fresh_db)
    assert other.returncode == 0 and other.stdout.strip().endswith("0 of 0")
    insert(fresh_db, [message(4, "MRN-42")])  # as an ingest older than the index would
    late = run("queue", "list", "--patient-id", "MRN-42", *why, dsn=fresh_db)
    assert "1 item(s) are not indexed yet" in late.stderr and "2 of 2" in late.stdout
    blank = run("queue", "list", "--patient-id", " ", *why, dsn=fresh_db)
    assert blank.returncode == 2 and "--patient-id is empty" in blank.stderr
    lone = run("queue", "list", "--authority", "HOSP", dsn=fresh_db)
    assert lone.returncode == 2 and "--authority goes with --patient-id" in lone.stderr
    unsaid = run("queue", "list", "--patient-id", "MRN-42", dsn=fresh_db)
    assert unsaid.returncode == 2 and "search-patient needs a reason (--why)" in unsaid.stderr
    assert audit(fresh_db) == [
        ("dpo", "search-patient", [ids[2], ids[0]]),
        ("dpo", "search-patient", []),
        ("dpo", "search-patient", [ids[2], ids[0]]),
    ]  # the control-ID listing and the refusals are not audited


def test_erase_scan_says_how_much_it_reads(fresh_db: str) -> None:
    ids = insert(fresh_db, [message(1, "MRN-42"), message(2, "MRN-7")])
    run("migrate", dsn=fresh_db)
    scanned = run(
        "queue",
        "erase",
        "--patient-id",
        "MRN-42",
        "--scan",
        "--who",
        "dpo",
        "--why",
        "request 9",
        "--dry-run",
        dsn=fresh_db,
    )
    assert scanned.returncode == 0, scanned.stderr
    assert "scanning every payload: about" in scanned.stderr
    assert scanned.stdout.splitlines() == [
        f"{ids[0]}  {DEST}  pending  ADT^A01",
        "would erase 1 item(s)",
    ]
    bad = run("queue", "erase", "7", "--scan", "--who", "dpo", dsn=fresh_db)
    assert bad.returncode == 2 and "go with --patient-id" in bad.stderr
    assert audit(fresh_db) == [("dpo", "search-patient", [ids[0]])]  # the scan's dry run


def test_purge_keeps_pending(fresh_db: str) -> None:
    insert(fresh_db, [message(1, "P")])
    insert(fresh_db, [message(2, "P")], state="delivered")
    out = run("purge", "--older-than", "0s", dsn=fresh_db)
    assert out.returncode == 0 and "delivered 1" in out.stdout
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT state FROM inturn_delivery").fetchall() == [("pending",)]


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "skip", "notanumber", "--who", "x"),
        ("queue", "list", "--state", "stuck"),
        ("queue", "list", "--limit", "5000"),
        ("purge", "--older-than", "soon"),
        ("purge", "--older-than", "7"),  # a bare number: add a unit
        ("worker",),
        ("nosuchcommand",),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args: tuple[str, ...], fresh_db: str) -> None:
    out = run(*args, dsn=fresh_db)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inturn: error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_unreachable_database_is_one_line(tmp_path: Path) -> None:
    out = run("queue", "depth", dsn="postgresql://nobody@127.0.0.1:1/x?connect_timeout=2")
    assert out.returncode == 2
    assert out.stderr.startswith("inturn: error: cannot reach the database:")
    assert len(out.stderr.strip().splitlines()) == 1


def test_retry_now_wakes_the_worker_channel(fresh_db: str) -> None:
    [a] = insert(fresh_db, [message(1, "P")])
    with psycopg.connect(fresh_db, autocommit=True) as listener:
        listener.execute(f"LISTEN {notify_channel(DEST)}")
        assert run("queue", "retry", str(a), dsn=fresh_db).returncode == 0
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == [DEST]


def test_audit_shows_who_and_why(fresh_db: str) -> None:
    [a] = insert(fresh_db, [message(1, "P")])
    run("queue", "skip", str(a), "--who", "alice", "--why", "sent twice upstream", dsn=fresh_db)
    [entry] = json.loads(run("queue", "audit", "--json", dsn=fresh_db).stdout)
    assert (entry["who"], entry["action"], entry["itemIds"], entry["why"]) == (
        "alice",
        "skip",
        [a],
        "sent twice upstream",
    )
    assert "sent twice upstream" in run("queue", "audit", dsn=fresh_db).stdout


def test_bare_inturn_prints_help_and_version_is_there() -> None:
    bare = run()
    assert bare.returncode == 0 and bare.stderr == ""
    assert bare.stdout.startswith("Usage: inturn [OPTIONS] [COMMAND]")
    assert "worker" in bare.stdout and "queue" in bare.stdout
    version = run("--version")
    assert (version.returncode, version.stdout) == (
        0,
        f"inturn, version {metadata.version('inturn')}\n",
    )


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "depth"),
        ("queue", "list"),
        ("worker", "--http-port", "0", "-f", str(ROOT / "examples/local-mllp.yaml")),
    ],
    ids=["depth", "list", "worker"],
)
def test_unmigrated_database_says_to_migrate(args: tuple[str, ...], empty_db: str) -> None:
    done = run(*args, dsn=empty_db)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("inturn: error: the database has no inturn schema, or an old one (")
    assert last.endswith("run `inturn migrate`")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        (
            "postgresql://u:pw@a..b/db",
            "inturn: error: invalid database host 'a..b' in the connection string\n",
        ),
        ("host=x port", "inturn: error: invalid database connection string: "),
    ],
)
def test_bad_dsn_is_one_line(dsn: str, message: str) -> None:
    done = run("queue", "depth", dsn=dsn)
    assert done.returncode == 2 and done.stderr.startswith(message)
    assert done.stderr.count("\n") == 1 and "pw" not in done.stderr


def _manifest(tmp_path: Path, sender: str) -> Path:
    path = tmp_path / "dest.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\nkind: Destination\nmetadata: {name: feed}\n"
        f"spec:\n  channel: adt\n  sender: {sender}\n  retry: {{maxAttempts: 0}}\n"
    )
    return path


@pytest.mark.parametrize(
    ("sender", "file"),
    [
        (
            "{http: {url: 'https://x.example/', secretRef: {name: creds}}}",
            "creds/headers",
        ),
        (
            "{mllp: {host: h, port: 1, tls: {secretRef: {name: t, certKey: c, keyKey: k}}}}",
            "t/ca.crt",
        ),
    ],
    ids=["http-secretRef", "mllp-tls"],
)
@pytest.mark.parametrize("command", ["worker", "local"])
def test_missing_secret_files_are_named_before_anything_starts(
    tmp_path: Path, sender: str, file: str, command: str
) -> None:
    path = _manifest(tmp_path, sender)
    args = ["--secrets-dir", str(tmp_path / "secrets"), "-f", str(path)]
    if command == "local":
        args += ["--listen", "adt=0"]
    done = run(command, "--http-port", "0", *args) if command == "worker" else run(command, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"inturn: error: destination default/feed: no file {tmp_path / 'secrets' / file}"
        " (see --secrets-dir)\n"
    )


def test_no_op_actions_answer_alike(fresh_db: str) -> None:
    [pending_id, failed_id, delivered_id] = [
        insert(fresh_db, [message(1, "P1")])[0],
        insert(fresh_db, [message(2, "P2")], state="failed")[0],
        insert(fresh_db, [message(3, "P3")], state="delivered")[0],
    ]
    assert pending_id
    for args in (
        ("show", "999999"),
        ("skip", "999999", "--who", "me", "--why", "x"),
        ("retry", "999999"),
        ("erase", "999999", "--who", "me", "--why", "x"),
        ("erase", "999999", "--dry-run"),
    ):
        done = run("queue", *args, dsn=fresh_db)
        assert (done.returncode, done.stdout, done.stderr) == (
            2,
            "",
            "inturn: error: no item 999999\n",
        ), args
    retry = run("queue", "retry", str(failed_id), dsn=fresh_db)
    assert retry.returncode == 2
    assert retry.stderr == (
        f"inturn: error: item {failed_id} failed (it is not pending): `inturn queue resend"
        f" {failed_id} --who ...` queues a copy of it\n"
    )
    skip = run("queue", "skip", str(delivered_id), "--who", "me", "--why", "x", dsn=fresh_db)
    assert skip.stderr == (
        f"inturn: error: item {delivered_id} is delivered, not pending: nothing to skip\n"
    )
    drain = run("queue", "drain", "nobody/x", "--who", "me", "--why", "x", dsn=fresh_db)
    assert drain.returncode == 2 and drain.stderr.startswith(
        "inturn: error: no destination nobody/x"
    )
    known = run("queue", "drain", DEST, "--who", "me", "--why", "x", dsn=fresh_db)
    assert (known.returncode, known.stdout) == (0, f"drained 1 item(s) from {DEST}\n")
    dry = run("queue", "erase", str(failed_id), "--dry-run", dsn=fresh_db)
    assert dry.returncode == 0 and dry.stdout.endswith("would erase 1 item(s)\n")
    no_who = run("queue", "erase", str(failed_id), dsn=fresh_db)
    assert no_who.returncode == 2 and "--who" in no_who.stderr


def test_unreachable_database_ingest_says_so_in_one_line_and_workers_wait() -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    ingest = run("ingest", "--listen", "adt=0", dsn=dsn)
    assert ingest.returncode == 2 and ingest.stdout == ""
    assert ingest.stderr.startswith("inturn: error: cannot reach the database: ")
    assert ingest.stderr.count("\n") == 1

    example = str(ROOT / "examples/local-mllp.yaml")
    worker = subprocess.Popen(
        [INTURN, "worker", "--http-port", "0", "-f", example, "--dsn", dsn],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        lines = [worker.stderr.readline(), worker.stderr.readline()]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert "database unreachable (" in lines[1]
    assert (
        lines[1].rstrip().split("): ", 1)[1].startswith("the workers of this process wait for it")
    )
