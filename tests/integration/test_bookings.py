"""Bookings in the real store: import (idempotent, all or nothing), show, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from inturn.worker.reservations import bookings
from inturn.worker.reservations.records import BookingFileError
from tests.support.booking_data import booking

INTURN = str(Path(sys.executable).with_name("inturn"))


def inturn(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INTURN, *args, "--dsn", dsn], capture_output=True, text=True, timeout=60, check=False
    )


async def test_import_is_idempotent_and_updates(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        first = await bookings.import_document(conn, [booking(), booking("DEF456")])
        assert (first.created, first.updated, first.unchanged) == (2, 0, 0)
        again = await bookings.import_document(conn, [booking(), booking("DEF456")])
        assert (again.created, again.updated, again.unchanged) == (0, 0, 2)

        changed = booking(ticketed=True, ticketNumbers=["2201234567890"])
        changed["segments"] = changed["segments"][:1]
        changed["segments"][0]["status"] = "HK"
        third = await bookings.import_document(conn, [changed, booking("DEF456")])
        assert (third.created, third.updated, third.unchanged) == (0, 1, 1)
        found = await bookings.show(conn, "ABC123")
    assert found is not None
    b, history = found
    assert b.ticketed and b.ticket_numbers == ("2201234567890",)
    assert [(s.number, s.status) for s in b.segments] == [(1, "HK")]
    assert history == []


async def test_a_malformed_entry_imports_nothing(fresh_db: str) -> None:
    bad = booking("DEF456")
    bad["segments"][1]["flight"] = "nine"
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        with pytest.raises(BookingFileError) as info:
            await bookings.import_document(conn, [booking(), bad])
        assert info.value.errors == (
            "[1].segments[1].flight: 'nine' does not match ^[0-9]{1,4}[A-Z]?$",
        )
        cur = await conn.execute("SELECT count(*) FROM inturn_booking")
        assert await cur.fetchone() == (0,)


@pytest.mark.slow  # inturn subprocesses: left out by make test-fast
def test_cli_import_show_and_errors(fresh_db: str, tmp_path: Path) -> None:
    good = tmp_path / "bookings.json"
    good.write_text(json.dumps([booking(), booking("DEF456")]))
    done = inturn("bookings", "import", str(good), dsn=fresh_db)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported 2 bookings: 2 new, 0 updated, 0 unchanged"
    done = inturn("bookings", "import", str(good), dsn=fresh_db)
    assert done.stdout.strip() == "imported 2 bookings: 0 new, 0 updated, 2 unchanged"

    shown = inturn("bookings", "show", "abc123", "--json", dsn=fresh_db)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["ticketingDeadline"] == "2026-12-01T17:00:00Z"
    assert doc["ticketingDeadlineText"] == "2026-12-01T18:00:00+01:00"
    assert [(s["number"], s["status"]) for s in doc["segments"]] == [(1, "HN"), (2, "HK")]
    text = inturn("bookings", "show", "ABC123", dsn=fresh_db).stdout
    assert "ticketing deadline: 2026-12-01T17:00:00Z" in text and "UA       960" in text

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([booking("GHI789"), {"locator": "JKL012"}]))
    refused = inturn("bookings", "import", str(bad), dsn=fresh_db)
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    assert "[1].owner: required" in refused.stderr and "nothing imported" in refused.stderr
    assert inturn("bookings", "show", "GHI789", dsn=fresh_db).stderr.strip() == (
        "inturn: error: no booking GHI789"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    refused = inturn("bookings", "import", str(broken), dsn=fresh_db)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("inturn: error: nothing imported:")
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # inturn subprocesses: left out by make test-fast
def test_cli_apply_status(fresh_db: str, tmp_path: Path) -> None:
    good = tmp_path / "bookings.json"
    good.write_text(json.dumps([booking()]))
    assert inturn("bookings", "import", str(good), dsn=fresh_db).returncode == 0
    done = inturn("bookings", "apply-status", "abc123", "1", "kk", dsn=fresh_db)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ABC123 segment 1: KK applied (HN -> HK)"
    assert lines[1].startswith("placed worklist office-fra1a0: confirmed (item ")
    again = inturn(
        "bookings",
        "apply-status",
        "ABC123",
        "1",
        "KK",
        "--json",
        "--received-at",
        "2026-11-30T10:00:00+01:00",
        dsn=fresh_db,
    )
    doc = json.loads(again.stdout)
    assert (doc["outcome"], doc["previous"], doc["status"]) == ("applied", "HK", "HK")
    assert doc["placed"]["created"] is False and doc["placed"]["reason"] == "confirmed"
    shown = json.loads(inturn("bookings", "show", "ABC123", "--json", dsn=fresh_db).stdout)
    assert shown["history"][1]["receivedAt"].startswith("2026-11-30T09:00:00")
    for args, message in [
        (("ABC123", "1", "K"), "'K' is not a status code"),
        (("ABC123", "0", "KK"), "0 is not in the range 1<=x<=99"),
        (("ABC123", "7", "KK"), "inturn: error: no segment 7 in booking ABC123"),
        (("NOPE42", "1", "KK"), "inturn: error: no booking NOPE42"),
    ]:
        bad = inturn("bookings", "apply-status", *args, dsn=fresh_db)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    bad = inturn(
        "bookings", "apply-status", "ABC123", "1", "KK", "--received-at", "noon", dsn=fresh_db
    )
    assert bad.returncode == 2 and "'noon' is not an RFC 3339 date-time" in bad.stderr
