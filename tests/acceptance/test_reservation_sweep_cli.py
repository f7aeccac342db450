"""``inturn sweep --only reservations`` as a user runs it: flags, environment, summary lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.support.booking_data import LH400, UA960, booking, segment

INTURN = str(Path(sys.executable).with_name("inturn"))


def inturn(
    *args: str, dsn: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INTURN, *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_sweep_reservations_with_flags_and_environment(fresh_db: str, tmp_path: Path) -> None:
    # requested two days ago, deadline passed yesterday (both relative to the real clock)
    with psycopg.connect(fresh_db) as conn:
        row = conn.execute("SELECT now() - interval '2 days', now() - interval '1 day'").fetchone()
    assert row is not None
    requested, deadline = (t.isoformat() for t in row)
    doc = booking(
        "SWP001",
        segment(LH400, status="HN", requestedAt=requested),
        UA960,
        ticketingDeadline=deadline,
    )
    path = tmp_path / "b.json"
    path.write_text(json.dumps([doc]))
    assert inturn("bookings", "import", str(path), dsn=fresh_db).returncode == 0

    dry = inturn("sweep", "--only", "reservations", "--dry-run", "--auto-cancel", dsn=fresh_db)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "unanswered: would place 1, already there 0, would clear 0",
        "ticketing-due: would place 0, already there 0, would clear 0",
        "ticketing-expired: would place 1, already there 0, would clear 0",
    ]
    # a 3-day wait for replies: nothing unanswered yet; auto-cancel from the environment
    done = inturn(
        "sweep",
        "--only",
        "reservations",
        "--pending-after",
        "3d",
        dsn=fresh_db,
        env={"INTURN_SWEEP_AUTO_CANCEL": "true", "INTURN_SWEEP_HOST_CARRIERS": "LH"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "unanswered: placed 0, already there 0, cleared 0",
        "ticketing-due: placed 0, already there 0, cleared 0",
        "ticketing-expired: placed 2, already there 0, cleared 0",
    ]
    shown = json.loads(inturn("bookings", "show", "SWP001", "--json", dsn=fresh_db).stdout)
    assert shown["cancelReason"] == "ticketing-expired"
    items = json.loads(
        inturn("worklist", "list", "--queue", "office-fra1a0", "--json", dsn=fresh_db).stdout
    )
    listed = items["items"] if isinstance(items, dict) else items
    assert sorted(i["reason"] for i in listed) == ["cancel-not-delivered", "ticketing-expired"]

    bad = inturn("sweep", "--only", "reservations", "--host-carrier", "lufthansa", dsn=fresh_db)
    assert bad.returncode == 2 and "is not an IATA airline designator" in bad.stderr
    bad = inturn("sweep", "--pending-after", "soon", dsn=fresh_db)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
