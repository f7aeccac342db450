"""``inturn worklist ...``, ``inturn sweep`` and the worklist part of ``inturn purge``, run as a
user runs them: a subprocess, its output and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

INTURN = str(Path(sys.executable).with_name("inturn"))


def run(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [INTURN, *args]
    if dsn is not None:
        cmd += ["--dsn", dsn]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def setup_stuck(dsn: str) -> None:
    """A registered destination whose head waited an hour, and an orphaned queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel,"
            " stuck_after_seconds) VALUES ('ward/lab', 'ward', 'lab', 'adt', 60)"
        )
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, enqueued_at) VALUES"
            " ('ward/lab', 'adt', 'M1', 'ADT^A01', 'MSH', 3, now() - interval '1 hour'),"
            " ('gone/lab', 'adt', 'M2', 'ADT^A01', 'MSH', 3, now() - interval '2 minutes')"
        )


def test_sweep_then_list_count_show_clear(fresh_db: str) -> None:
    setup_stuck(fresh_db)
    dry = run("sweep", "--dry-run", "--only", "delivery", dsn=fresh_db)
    assert dry.returncode == 0, dry.stderr
    assert "destination-stuck: would place 1, already there 0, would clear 0" in dry.stdout
    assert run("worklist", "count", dsn=fresh_db).stdout.strip() == "no items"

    swept = run("sweep", "--limit", "10", dsn=fresh_db)
    assert swept.returncode == 0, swept.stderr
    lines = swept.stdout.splitlines()
    assert "destination-stuck: placed 1, already there 0, cleared 0" in lines
    assert "orphaned-queue: placed 1, already there 0, cleared 0" in lines
    assert "delivery-expired: placed 0, already there 0, cleared 0" in lines
    # the default packs (delivery, feeds, orders): no reservation rule in a plain sweep
    assert "resent-delivered: placed 0, already there 0, cleared 0" in lines
    assert len(lines) == 6 and lines[-1].startswith("unanswered-order: placed 0")
    again = run("sweep", "--json", dsn=fresh_db)
    rules = {r["rule"]: r for r in json.loads(again.stdout)["rules"]}
    assert (rules["destination-stuck"]["placed"], rules["destination-stuck"]["alreadyThere"]) == (
        0,
        1,
    )

    counts = json.loads(run("worklist", "count", "--json", dsn=fresh_db).stdout)
    assert [(c["queue"], c["reason"], c["items"]) for c in counts] == [
        ("delivery-stuck", "destination-stuck", 1),
        ("delivery-stuck", "orphaned-queue", 1),
    ]
    table = run("worklist", "list", dsn=fresh_db).stdout
    assert "destination:ward/lab" in table and "destination:gone/lab" in table

    page = json.loads(
        run("worklist", "list", "--json", "--reason", "orphaned-queue", dsn=fresh_db).stdout
    )
    [item] = page["items"]
    assert (item["recordKey"], item["placedBy"], page["nextCursor"]) == (
        "gone/lab",
        "sweeper",
        None,
    )

    first = json.loads(run("worklist", "list", "--json", "--limit", "1", dsn=fresh_db).stdout)
    rest = run(
        "worklist", "list", "--json", "--cursor", str(first["nextCursor"]), dsn=fresh_db
    ).stdout
    assert len(first["items"]) == 1 and len(json.loads(rest)["items"]) == 1

    shown = run("worklist", "show", str(item["id"]), dsn=fresh_db)
    assert shown.returncode == 0 and "orphaned-queue" in shown.stdout
    assert "history:" in shown.stdout
    assert "what:       Messages wait for a destination that is not registered" in shown.stdout

    missing_note = run("worklist", "clear", str(item["id"]), "--who", "alice", dsn=fresh_db)
    assert missing_note.returncode == 2 and "--note" in missing_note.stderr
    cleared = run(
        "worklist", "clear", str(item["id"]), "--who", "alice", "--note", "re-applied",
        "--json", dsn=fresh_db,
    )  # fmt: skip
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["clearedBy"] == "alice"
    twice = run("worklist", "clear", str(item["id"]), "--who", "bob", "--note", "x", dsn=fresh_db)
    assert twice.returncode == 2
    assert twice.stderr.strip().startswith("inturn: error: worklist item")
    assert "already cleared by alice" in twice.stderr and len(twice.stderr.splitlines()) == 1
    missing = run("worklist", "show", "999", dsn=fresh_db)
    assert missing.returncode == 2 and "no worklist item 999" in missing.stderr


def test_bad_arguments_are_one_line_errors(fresh_db: str) -> None:
    for args in (
        ("sweep", "--only", "nope"),
        ("sweep", "--limit", "0"),
        ("worklist", "list", "--record", "nokind"),
        ("worklist", "list", "--state", "done"),
        ("sweep", "--only", "reservations", "--host-carrier", "bad!"),
        ("sweep", "--host-carrier", "LH"),
        ("sweep", "--only", "reservations", "--pending-after", "soon"),
    ):
        out = run(*args, dsn=fresh_db)
        assert out.returncode == 2, args
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_sweep_while_another_runs_exits_0(fresh_db: str) -> None:
    # Another sweep holds the sweep singleton (a lease row, renewed by a live session of its own).
    with psycopg.connect(fresh_db, autocommit=True) as other:
        [(epoch,)] = other.execute("SELECT inturn_sweep_lease('another sweep', 60)").fetchall()
        assert epoch is not None
        out = run("sweep", dsn=fresh_db)
        other.execute("SELECT inturn_sweep_release('another sweep', %s)", (epoch,))
    assert out.returncode == 0
    assert out.stdout.strip() == "another sweep is running; nothing done"


def test_purge_reports_cleared_worklist_items(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason,"
            " placed_by, placed_at, state, cleared_at, cleared_by, note)"
            " SELECT 'q', 'delivery', g::text, 'r', 't', now() - interval '200 days',"
            "        CASE WHEN g <= 3 THEN 'cleared' ELSE 'pending' END,"
            "        CASE WHEN g <= 3 THEN now() - interval '100 days' END,"
            "        CASE WHEN g <= 3 THEN 'a' END, CASE WHEN g <= 3 THEN 'n' END"
            "   FROM generate_series(1, 5) g"
        )
    out = run("purge", dsn=fresh_db)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        "purged delivered 0, failed 0, skipped 0, worklist cleared 3, leases 0"
    )
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM inturn_worklist_item").fetchone() == (2,)
