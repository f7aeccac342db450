"""The console's store additions through the command line: a hold and an audited viewing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from inturn.worker.cli import cli
from tests.support.console import enqueue, message, register

INTURN = str(Path(sys.executable).with_name("inturn"))


def run(dsn: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [INTURN, *args, "--dsn", dsn], capture_output=True, timeout=60, check=False
    )


@pytest.mark.slow  # inturn subprocesses: left out by make test-fast
async def test_suspend_resume_and_payload_viewing_are_audited(fresh_db: str) -> None:
    await register(fresh_db, "ward/lab")
    [item] = await enqueue(fresh_db, "ward/lab", [3])
    out = run(fresh_db, "queue", "suspend", "ward/lab", "--who", "jo", "--why", "upgrade")
    assert (out.returncode, out.stdout) == (0, b"suspended ward/lab\n")
    # the depth says who holds it and that nothing goes until it is resumed
    depth = run(fresh_db, "queue", "depth").stdout.decode().splitlines()
    cells = depth[1].split()
    assert cells[:4] == ["ward/lab", "adt", "1", "0"]
    assert cells[5:] == ["0", "queue", "resume", "(suspended", "by", "jo)", str(item), "-"]
    [row] = json.loads(run(fresh_db, "queue", "depth", "--json").stdout)
    assert row["suspendedBy"] == "jo" and row["suspendedAt"] is not None
    out = run(fresh_db, "queue", "resume", "ward/lab", "--who", "jo")
    assert (out.returncode, out.stdout) == (0, b"resumed ward/lab\n")
    depth = run(fresh_db, "queue", "depth").stdout.decode().splitlines()
    assert depth[1].split()[5:] == ["0", "-", str(item), "-"]  # not held; the head waits
    [row] = json.loads(run(fresh_db, "queue", "depth", "--json").stdout)
    assert (row["suspendedAt"], row["suspendedBy"]) == (None, None)
    # a second resume, or a suspend of what is held already, changes and audits nothing
    out = run(fresh_db, "queue", "resume", "ward/lab", "--who", "jo")
    assert (out.returncode, out.stdout) == (0, b"ward/lab was not held: nothing to resume\n")
    out = run(fresh_db, "queue", "suspend", "no/where", "--who", "jo")
    assert out.returncode == 2 and b"no registered destination no/where" in out.stderr
    out = run(fresh_db, "queue", "payload", str(item), "--who", "jo", "--why", "ticket 9")
    assert out.returncode == 0 and out.stdout == message(3)
    out = run(fresh_db, "queue", "audit", "--json")
    entries = [(e["who"], e["action"], e["why"]) for e in json.loads(out.stdout)]
    assert entries == [
        ("jo", "view-payload", "ticket 9"),
        ("jo", "resume", None),
        ("jo", "suspend", "upgrade"),
    ]


def test_listing_a_destination_nobody_knows_is_an_error(fresh_db: str) -> None:
    """An empty listing of an unknown name says so (a typo), an empty known one does not."""
    asyncio.run(register(fresh_db, "ward/lab"))
    runner = CliRunner()
    known = runner.invoke(cli, ["queue", "list", "-d", "ward/lab", "--dsn", fresh_db])
    assert (known.exit_code, known.output.splitlines()[-1]) == (0, "0 of 0")
    typo = runner.invoke(cli, ["queue", "list", "-d", "ward/lba", "--dsn", fresh_db])
    assert typo.exit_code == 1
    assert typo.output == (
        "Error: no destination ward/lba (names are namespace/name; see `inturn queue depth`)\n"
    )


def test_a_listing_of_every_destination_says_what_is_not_taken_yet(fresh_db: str) -> None:
    """A new user's trial: during an outage `queue list -s pending` said "1 of 1" while the
    depth said 400 (the rest waited in the channel log, listed only per destination)."""
    import psycopg

    from tests.support import channel_log

    asyncio.run(register(fresh_db, "ward/lab"))
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        channel_log.append(conn, ["ward/lab"], 3, "W", channel="adt")
    result = CliRunner().invoke(cli, ["queue", "list", "-s", "pending", "--dsn", fresh_db])
    assert result.exit_code == 0
    assert result.stderr == (
        "note: 3 pending message(s) not yet taken by their destination's worker are listed"
        " only with --destination (or --control-id); `inturn queue depth` counts them\n"
    )
    one = CliRunner().invoke(cli, ["queue", "list", "-d", "ward/lab", "--dsn", fresh_db])
    assert one.stdout.splitlines()[-1] == "3 of 3" and one.stderr == ""
