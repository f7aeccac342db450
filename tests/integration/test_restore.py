"""A queue database restored from a backup is noticed, said and held (issue 39, part 1;
docs/howto/backups.md): the operator records each Destination's witness (the database clock's
tick and its last delivered and accepted messages) in its status; a real ``pg_dump`` taken
while 30 messages were waiting, those 30 then delivered and 5 more accepted, and a real
``pg_restore`` of the dump: the operator says in one line (log, event, ``status.restore``)
that 30 messages may be sent twice and what was lost, and holds delivery (``spec.afterRestore``
hold); ``inturn queue mark-delivered`` and ``resume`` decide, audited; with ``resend`` delivery
goes on and the restore is only said."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Awaitable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from inturn.operator.restore import HOLDER, Finding, Witness, went_back
from inturn.operator.status import rfc3339
from inturn.worker.cli import cli, main
from inturn.worker.store import restore as restore_store
from inturn.worker.store.migrate import migrate
from inturn.worker.store.restore import Seen
from tests.support import channel_log, pgcluster
from tests.support.keys import pg_tool
from tests.support.kopf_env import (
    DEST,
    EVENTS,
    NS,
    ApiServerLikeEmulator,
    destination,
    env,
    eventually,
    obj,
    operator,
)

#: slow (left out by make test-fast): a fault, an outage or clusters of its own
pytestmark = [pytest.mark.kmock(cls=ApiServerLikeEmulator), pytest.mark.store, pytest.mark.slow]
__all__ = ["env"]  # the emulator fixture of test_operator, used here by name

KEY = f"{NS}/lis"


def rows(dsn: str, n: int, state: str, tag: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, finished_at)"
            " SELECT %s, 'adt', %s || g, 'ADT^A01', 'MSH|x', 5, %s,"
            " CASE WHEN %s = 'pending' THEN NULL ELSE now() END"
            " FROM generate_series(1, %s) AS g RETURNING id",
            (KEY, tag, state, state, n),
        ).fetchall()
    return sorted(r[0] for r in found)


def deliver(dsn: str, ids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', finished_at = now()"
            " WHERE id = ANY(%s)",
            (ids,),
        )


def status(env: kmock.KubernetesEmulator) -> dict[str, Any]:
    return dict(obj(env, DEST, "lis").get("status") or {})


def pg_dump(dsn: str, path: Path) -> None:
    subprocess.run(
        [pg_tool("pg_dump"), "-Fc", "--no-owner", "--no-privileges", "-f", str(path), "-d", dsn],
        check=True,
        capture_output=True,
        timeout=120,
    )


def pg_restore(dsn: str, path: Path) -> None:
    """The documented procedure (docs/howto/backups.md): the database dropped (its sessions
    ended) and made anew, then ``pg_restore --single-transaction`` of the dump into it."""
    params = conninfo_to_dict(dsn)
    name = str(params["dbname"])
    with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True) as server:
        server.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        server.execute(f'CREATE DATABASE "{name}"')
    command = [pg_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error"]
    # in one transaction: the operator, left running, never sees it half loaded (the clock
    # restored before the messages: it would count none)
    command.append("--single-transaction")
    subprocess.run(
        [*command, "-d", dsn, str(path)],
        check=True,
        capture_output=True,
        timeout=120,
    )


async def local_look(dsn: str, path: Path, *, keyed: bool = False) -> Any:
    """One look of ``inturn local``'s restore witness (its file at ``path``) at ``dsn``."""
    from inturn.worker.local import witness

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await witness.look(conn, path, keyed=keyed)


@pytest.fixture
def queue_db(empty_db: str, env: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database of this test's own (it is restored under the operator's feet)."""
    migrate(empty_db)
    monkeypatch.setenv("INTURN_DSN", empty_db)
    monkeypatch.setenv("INTURN_RESTORE_TICK_SECONDS", "1")
    return empty_db


async def test_a_restored_dump_is_noticed_said_held_and_decided(
    env: kmock.KubernetesEmulator,
    queue_db: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    before = rows(queue_db, 20, "delivered", "OLD")
    waiting = rows(queue_db, 30, "pending", "WAIT")
    caplog.set_level(logging.WARNING, logger="inturn.operator")
    async with operator():
        await eventually(lambda: status(env)["witness"]["acceptedThrough"] == waiting[-1])
        # below its first waiting row
        assert status(env)["witness"]["deliveredThrough"] == before[-1]
        backup = tmp_path / "queue.dump"
        pg_dump(queue_db, backup)
        # after the backup: the 30 waiting messages are delivered, 5 more accepted and
        # delivered
        deliver(queue_db, waiting)
        late = rows(queue_db, 5, "pending", "LATE")
        deliver(queue_db, late)
        await eventually(lambda: status(env)["witness"]["deliveredThrough"] == late[-1])
        assert status(env)["witness"]["acceptedThrough"] == late[-1]
        # the disaster recovery: the database restored from the dump
        pg_restore(queue_db, backup)
        restore = await eventually(lambda: status(env).get("restore"), timeout=30)
        assert (restore["policy"], restore["mayBeSentAgain"], restore["deliveredThrough"]) == (
            "hold",
            30,
            late[-1],
        )
        assert "30 message(s) delivered before may be sent again" in restore["message"]
        assert "ask the senders to send them again" in restore["message"]
        with psycopg.connect(queue_db) as conn:
            held = conn.execute(
                "SELECT held_by, held_why FROM inturn_destination WHERE destination = %s",
                (KEY,),
            ).fetchone()
            audited = conn.execute(
                "SELECT who, action FROM inturn_audit WHERE destination = %s", (KEY,)
            ).fetchall()
            kept = conn.execute(
                "SELECT delivered_through FROM inturn_restore WHERE destination = %s", (KEY,)
            ).fetchall()
        assert held is not None and held[0] == HOLDER and "went back in time" in held[1]
        assert audited == [(HOLDER, "suspend")]
        assert kept == [(late[-1],)]
        events = [
            o.raw
            for (res, ns, _), o in env.objects.items()
            if res == EVENTS and ns == NS and o.raw.get("reason") == "DatabaseRestored"
        ]
        assert len(events) == 1
        lines = [r.getMessage() for r in caplog.records if "went back in time" in r.getMessage()]
        assert len(lines) == 1  # one line for the destination, not one per pass
        # ingest takes messages again before anyone decides: the finding moved the sequence
        # past the largest id the witness saw, so no id a lost message had is given again
        fresh = rows(queue_db, 5, "pending", "NEW")
        assert fresh == list(range(late[-1] + 1, late[-1] + 6))
        # a person decides: the receiver has what was delivered before; the rest may go
        dsn = ["--dsn", queue_db, "--who", "ops"]
        await asyncio.to_thread(
            main, ["queue", "mark-delivered", KEY, "--why", "it has them", *dsn]
        )
        # still undecided (held): the status counts again, no second line or event
        await eventually(lambda: status(env)["restore"]["mayBeSentAgain"] == 0, timeout=30)
        assert (
            "0 message(s) delivered before may be sent again" in status(env)["restore"]["message"]
        )
        lines = [r.getMessage() for r in caplog.records if "went back in time" in r.getMessage()]
        assert len(lines) == 1
        await asyncio.to_thread(main, ["queue", "resume", KEY, *dsn])
        await eventually(lambda: not status(env).get("restore"), timeout=30)
    with psycopg.connect(queue_db) as conn:
        states = conn.execute(
            "SELECT state, count(*) FROM inturn_delivery WHERE destination = %s GROUP BY 1",
            (KEY,),
        ).fetchall()
        pending = conn.execute(
            "SELECT control_id FROM inturn_delivery WHERE destination = %s AND state = 'pending'"
            " ORDER BY id",
            (KEY,),
        ).fetchall()
        actions = conn.execute(
            "SELECT who, action FROM inturn_audit WHERE destination = %s ORDER BY id", (KEY,)
        ).fetchall()
        left = conn.execute("SELECT count(*) FROM inturn_restore").fetchone()
    # the 30 delivered before are marked; the 5 accepted after the restore are not (before, a
    # bound by id alone marked them delivered: lost)
    assert dict(states) == {"delivered": 50, "pending": 5}
    assert [c for (c,) in pending] == [f"NEW{i}" for i in range(1, 6)]
    assert actions == [(HOLDER, "suspend"), ("ops", "mark-delivered"), ("ops", "resume")]
    assert left == (0,)  # the finding goes with the decision


async def test_a_restore_on_the_channel_log_counts_and_marks_by_log_message(
    env: kmock.KubernetesEmulator, queue_db: str, tmp_path: Path
) -> None:
    """Slim rows (issue 43): a backup taken while 10 messages waited in the channel log, not
    pulled; then all pulled, delivered, 3 more accepted and delivered. Restored, the 10 are
    unpulled log rows again (no delivery row, no id to name): they are counted, and
    mark-delivered pulls them and marks them by their log message; the 3 messages accepted
    after the restore take the lost messages' log ids and are not marked."""
    env.objects[DEST, NS, "lis"] = destination("lis")

    def append(n: int, tag: str) -> list[int]:
        with psycopg.connect(queue_db, autocommit=True) as conn:
            return channel_log.append(conn, [KEY], n, tag)

    def pull_and_deliver() -> None:
        with psycopg.connect(queue_db, autocommit=True) as conn:
            conn.execute("SELECT inturn_pull_for(%s, 1000)", (KEY,))
            conn.execute(
                "UPDATE inturn_delivery SET state = 'delivered', finished_at = now()"
                " WHERE destination = %s AND state = 'pending'",
                (KEY,),
            )

    async with operator():
        await eventually(lambda: "witness" in status(env))
        first = append(10, "A")
        backup = tmp_path / "queue.dump"
        pg_dump(queue_db, backup)
        pull_and_deliver()
        later = append(3, "B")
        pull_and_deliver()
        await eventually(lambda: status(env)["witness"].get("deliveredMessage") == later[-1])
        witness = status(env)["witness"]
        assert witness["channelThrough"] == later[-1]
    # the operator is away while the database is restored and ingest takes messages again
    pg_restore(queue_db, backup)
    again = append(3, "C")
    assert again == later  # the restored log sequence hands out the lost ids again
    async with operator():
        restore = await eventually(lambda: status(env).get("restore"), timeout=30)
        # the finding moved the log's sequence past the last id the witness saw: a message
        # accepted from now on has an id no message had before the restore
        after = append(1, "D")
        assert after[0] > later[-1]
        assert (restore["mayBeSentAgain"], restore["deliveredMessage"]) == (10, later[-1])
        # what was lost, on the channel: after the last message the backup holds, up to the
        # last one the witness saw
        with psycopg.connect(queue_db) as conn:
            [(kept_at,)] = conn.execute(
                "SELECT enqueued_at FROM inturn_message WHERE id = %s", (first[-1],)
            ).fetchall()
        assert restore["lostAfter"] == rfc3339(kept_at)
        assert restore["lostThrough"] == witness["channelTime"][:19] + "Z"
        assert (
            f"messages accepted on channel adt after {rfc3339(kept_at)} up to"
            f" {restore['lostThrough']} are not in the database" in restore["message"]
        )
        dsn = ["--dsn", queue_db, "--who", "ops"]
        await asyncio.to_thread(main, ["queue", "mark-delivered", KEY, "--why", "has them", *dsn])
        await asyncio.to_thread(main, ["queue", "resume", KEY, *dsn])
        await eventually(lambda: not status(env).get("restore"), timeout=30)
    with psycopg.connect(queue_db) as conn:
        found = conn.execute(
            "SELECT control_id, state, message_id FROM inturn_delivery WHERE destination = %s"
            " ORDER BY message_id",
            (KEY,),
        ).fetchall()
    assert found == [(f"A{i}", "delivered", m) for i, m in enumerate(first)] + [
        (f"C{i}", "pending", m) for i, m in enumerate(again)
    ] + [("D0", "pending", after[0])]


def test_mark_delivered_needs_a_finding_or_a_bound(fresh_db: str) -> None:
    """Without a restore found for it, mark-delivered wants --through (one line, nothing
    changed)."""
    result = CliRunner().invoke(
        cli, ["queue", "mark-delivered", KEY, "--dsn", fresh_db, "--who", "ops", "--why", "x"]
    )
    assert result.exit_code != 0
    assert f"no restore was found for {KEY}: name the last message" in result.output


async def test_with_resend_delivery_goes_on_and_the_restore_is_said(
    env: kmock.KubernetesEmulator, queue_db: str, tmp_path: Path
) -> None:
    body = destination("lis")
    body["spec"]["afterRestore"] = "resend"
    env.objects[DEST, NS, "lis"] = body
    waiting = rows(queue_db, 10, "pending", "WAIT")
    async with operator():
        await eventually(lambda: status(env)["witness"]["acceptedThrough"] == waiting[-1])
        backup = tmp_path / "queue.dump"
        pg_dump(queue_db, backup)
        deliver(queue_db, waiting)
        await eventually(lambda: status(env)["witness"]["deliveredThrough"] == waiting[-1])
        pg_restore(queue_db, backup)
        await eventually(
            lambda: any(
                o.raw.get("reason") == "DatabaseRestored"
                for (res, _, _), o in env.objects.items()
                if res == EVENTS
            ),
            timeout=30,
        )
        # not held: the ten go again (receivers deduplicate by MSH-10), and the witness restarts
        await eventually(lambda: not status(env).get("restore"), timeout=30)
    with psycopg.connect(queue_db) as conn:
        held = conn.execute(
            "SELECT held_at FROM inturn_destination WHERE destination = %s", (KEY,)
        ).fetchone()
    assert held == (None,)


def test_the_decision_is_pure() -> None:
    recorded = Witness(7, 50, "2026-12-05T10:00:00Z", 55, "2026-12-05T10:01:00Z")
    assert Witness.from_status(recorded.to_status()) == recorded
    assert went_back(recorded, 6) and not went_back(recorded, 7) and not went_back(None, 0)
    now = Seen(20, None, 50, None)
    line = Finding(KEY, "hold", 30, recorded, now).line()
    assert "30 message(s) delivered before may be sent again" in line
    assert "up to 2026-12-05T10:01:00Z are not in the database" in line
    assert f"inturn queue mark-delivered {KEY} (what the receiver has" in line
    found = Witness(7, 50, "2026-12-05T10:00:00.250000Z", delivered_message=90).finding()
    assert (found.delivered_through, found.delivered_message) == (50, 90)
    assert found.delivered_at is not None and found.delivered_at.microsecond == 250000
    # the log bound is kept while the hot table shows none (its slim rows moved to history)
    assert Witness.of(8, Seen(60, None, 60, None), Witness(7, delivered_message=90)) == Witness(
        8, 60, None, 60, None, 90
    )
    assert "receivers see repeats" in Finding(KEY, "resend", 1, recorded, now).line()
    # the channel log: lost when the restored log's last message by the witness's time is older
    logged = Witness(7, channel_through=90, channel_time="2026-12-05T10:02:00.500000Z")
    kept = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
    assert Finding(KEY, "hold", 0, logged, None, "adt", 80, kept).lost() == (
        "2026-12-05T09:00:00Z",
        "2026-12-05T10:02:00Z",
    )
    assert Finding(KEY, "hold", 0, logged, None, "adt", 90, kept).lost() is None
    assert Finding(KEY, "hold", 0, logged, None, "adt").lost() == (None, "2026-12-05T10:02:00Z")
    assert "messages accepted on channel adt after its first message" in (
        Finding(KEY, "hold", 0, logged, None, "adt").line()
    )


async def test_a_worker_that_outlives_the_restore_waits_for_the_operators_look(
    fresh_db: str,
) -> None:
    """A worker alive across the restore sees the database's clock go back at its next session
    and sends nothing until the operator has ticked again (then its hold, if any, decides)."""
    from inturn.worker.store import queue
    from inturn.worker.store.model import NewItem
    from inturn.worker.testing import MllpReceiver
    from tests.support.pipeline import register, worker, worker_config

    def message(n: int) -> NewItem:
        payload = f"MSH|^~\\&|A|B|C|D|2026||ADT^A01|RS{n}|P|2.5\rPID|1||R{n}\r".encode()
        return NewItem(KEY, "adt", f"RS{n}", "ADT^A01", payload)

    async def enqueue(*numbers: int) -> None:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await queue.enqueue(conn, [message(n) for n in numbers])

    register(fresh_db, KEY, "adt")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_clock (one, tick) VALUES (true, 5)"
            " ON CONFLICT (one) DO UPDATE SET tick = 5"
        )
    async with (
        MllpReceiver() as rx,
        worker(worker_config(KEY, rx.port, channel="adt"), fresh_db),
    ):
        await enqueue(1)
        await rx.wait_for(1)
        # the restore: the clock goes back, every session of the database ends
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("UPDATE inturn_clock SET tick = 3")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        await enqueue(2, 3)
        await asyncio.sleep(4)  # two of its looks: nothing may go meanwhile
        assert len(rx.received) == 1
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("UPDATE inturn_clock SET tick = 4")  # the operator's look
        await rx.wait_for(3, timeout=20)
    assert [p.split(b"|")[9] for p in rx.received] == [b"RS1", b"RS2", b"RS3"]


@pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing()))
async def test_a_base_backup_restored_holds_the_older_tick() -> None:
    """A physical restore (pg_basebackup, the server started on the copy) brings the clock back
    to its tick at the backup: what the operator compares with the witness it recorded."""
    cluster = pgcluster.Cluster()
    try:
        dsn = cluster.primary.dsn()
        migrate(dsn)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(3):
                await restore_store.tick(conn)
        copy = cluster.root / "backup"
        pgcluster.base_backup(cluster.primary, copy)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(3):
                before, now = await restore_store.tick(conn)
        recorded = Witness(now)  # what the operator wrote in the Destinations' status
        cluster.primary.stop()
        restored = pgcluster.Server(copy, pgcluster.free_port(), settings={"fsync": "off"})
        cluster.servers.append(restored)
        restored.start()
        async with await psycopg.AsyncConnection.connect(restored.dsn(), autocommit=True) as conn:
            held = await restore_store.clock(conn)
        assert (before, now, held) == (5, 6, 3)
        assert went_back(recorded, held)
    finally:
        cluster.close()


@pytest.mark.skipif(pgcluster.missing() is not None, reason=str(pgcluster.missing()))
async def test_a_failover_to_a_lagging_replica_holds_the_older_tick() -> None:
    """A failover to a replica that had not received the last ticks (it was cut off from the
    primary, then promoted when the primary died) holds the tick it had: older than the witness
    the operator recorded from the primary."""
    cluster = pgcluster.Cluster()
    try:
        standby = cluster.add_standby(synchronous=False)
        dsn = cluster.primary.dsn()
        migrate(dsn)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(3):
                await restore_store.tick(conn)

        def standby_tick() -> int | None:
            """The standby's tick; None before it replayed the migrations."""
            try:
                with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                    found = conn.execute("SELECT max(tick) FROM inturn_clock").fetchone()
            except psycopg.errors.UndefinedTable:
                return None
            return int(found[0]) if found and found[0] is not None else None

        deadline = asyncio.get_running_loop().time() + 60
        while standby_tick() != 3:
            assert asyncio.get_running_loop().time() < deadline, "the standby never caught up"
            await asyncio.sleep(0.1)
        standby.stop()  # cut off: the ticks that follow never reach it
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(2):
                before, now = await restore_store.tick(conn)
        recorded = Witness(now)  # what the operator wrote in the Destinations' status
        cluster.primary.stop("immediate")  # the primary dies
        standby.start()
        standby.promote()  # the failover
        async with await psycopg.AsyncConnection.connect(standby.dsn(), autocommit=True) as conn:
            held = await restore_store.clock(conn)
            # the operator's next tick on the promoted server: the tick it held before is older
            behind, _ = await restore_store.tick(conn)
        assert (before, now, held, behind) == (4, 5, 3, 3)
        assert went_back(recorded, behind)
    finally:
        cluster.close()


async def test_a_second_restore_before_the_decision_is_found_again(
    env: kmock.KubernetesEmulator, queue_db: str, tmp_path: Path
) -> None:
    """Restored, held; then restored once more (a better backup) before a person decided: the
    hold went with the first restored database, so the operator finds it again (a second event,
    held again) rather than taking the hold's absence for a decision."""
    env.objects[DEST, NS, "lis"] = destination("lis")
    waiting = rows(queue_db, 10, "pending", "WAIT")

    def restored_events() -> int:
        return sum(
            1
            for (res, _, _), o in env.objects.items()
            if res == EVENTS and o.raw.get("reason") == "DatabaseRestored"
        )

    def held_by() -> Any:
        with psycopg.connect(queue_db) as conn:
            found = conn.execute(
                "SELECT held_by FROM inturn_destination WHERE destination = %s", (KEY,)
            ).fetchone()
        return found[0] if found else None

    async with operator():
        await eventually(lambda: status(env)["witness"]["acceptedThrough"] == waiting[-1])
        backup = tmp_path / "queue.dump"
        pg_dump(queue_db, backup)
        deliver(queue_db, waiting)
        await eventually(lambda: status(env)["witness"]["deliveredThrough"] == waiting[-1])
        pg_restore(queue_db, backup)
        await eventually(lambda: restored_events() == 1, timeout=30)
        await eventually(lambda: held_by() == HOLDER, timeout=30)
        pg_restore(queue_db, backup)  # once more, before anyone decided
        await eventually(lambda: restored_events() == 2, timeout=30)
        await eventually(lambda: held_by() == HOLDER, timeout=30)
        restore = status(env)["restore"]
        assert (restore["mayBeSentAgain"], restore["deliveredThrough"]) == (10, waiting[-1])
        await asyncio.sleep(3)  # a few ticks: it stays undecided and held
        assert status(env).get("restore") and held_by() == HOLDER and restored_events() == 2


async def test_inturn_local_keeps_the_witness_in_its_data_folder(
    empty_db: str, tmp_path: Path
) -> None:
    """``inturn local`` has no operator: its witness is a file of its data folder. A real
    pg_dump taken with 10 messages waiting, those delivered, a real pg_restore: its next look
    holds the destination (audited as inturn-local), says so in one line with the 10, and
    keeps the finding for mark-delivered; once a person resumes, the finding goes."""
    from inturn.worker.local import witness
    from tests.support.pipeline import register

    migrate(empty_db)
    register(empty_db, KEY, "adt")
    path = tmp_path / ".inturn" / witness.FILE_NAME

    def look() -> Awaitable[witness.Noticed | None]:
        return local_look(empty_db, path)

    waiting = rows(empty_db, 10, "pending", "WAIT")
    assert await look() is None and path.exists()
    backup = tmp_path / "queue.dump"
    pg_dump(empty_db, backup)
    deliver(empty_db, waiting)
    late = rows(empty_db, 3, "pending", "LATE")
    deliver(empty_db, late)
    assert await look() is None  # the file now records the 13 delivered
    pg_restore(empty_db, backup)
    noticed = await look()
    assert noticed is not None and noticed.held == (KEY,)
    [line] = noticed.lines
    assert "went back in time" in line and "10 message(s) delivered before" in line
    # the sequence moved past the last id the witness file saw: no lost message's id again
    assert rows(empty_db, 1, "pending", "NEW") == [late[-1] + 1]
    assert await look() is None  # said once
    with psycopg.connect(empty_db) as conn:
        held = conn.execute(
            "SELECT held_by FROM inturn_destination WHERE destination = %s", (KEY,)
        ).fetchone()
        audited = conn.execute(
            "SELECT who, action FROM inturn_audit WHERE destination = %s", (KEY,)
        ).fetchall()
    assert held == ("inturn-local",) and audited == [("inturn-local", "suspend")]
    dsn = ["--dsn", empty_db, "--who", "ops"]
    await asyncio.to_thread(main, ["queue", "mark-delivered", KEY, "--why", "has them", *dsn])
    await asyncio.to_thread(main, ["queue", "resume", KEY, *dsn])
    assert await look() is None
    with psycopg.connect(empty_db) as conn:
        states = conn.execute(
            "SELECT state, count(*) FROM inturn_delivery WHERE destination = %s GROUP BY 1",
            (KEY,),
        ).fetchall()
        left = conn.execute("SELECT count(*) FROM inturn_restore").fetchone()
    assert dict(states) == {"delivered": 10, "pending": 1} and left == (0,)


async def test_inturn_local_names_the_channel_log_messages_a_restore_lost(
    empty_db: str, tmp_path: Path
) -> None:
    """Messages AA'd after the backup are gone from the restored log: the witness file records
    the channel's last message and its time, and the WARNING line names the window to send
    again (after the restored log's last one, up to the witness's), as the operator does;
    queue depth lists the held destination though nothing is pending."""
    from inturn.worker.local import witness
    from tests.support.pipeline import INTURN, register

    migrate(empty_db)
    register(empty_db, KEY, "adt")
    path = tmp_path / ".inturn" / witness.FILE_NAME

    def look() -> Awaitable[witness.Noticed | None]:
        return local_look(empty_db, path)

    with psycopg.connect(empty_db, autocommit=True) as conn:
        channel_log.append(conn, [KEY], 4, "KEPT", channel="adt")
    backup = tmp_path / "queue.dump"
    pg_dump(empty_db, backup)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        lost_ids = channel_log.append(conn, [KEY], 3, "LOST", channel="adt")
        times = dict(conn.execute("SELECT id, enqueued_at FROM inturn_message").fetchall())
    assert await look() is None
    recorded = json.loads(path.read_text())["destinations"][KEY]
    assert recorded["channelThrough"] == lost_ids[-1]
    assert datetime.fromisoformat(recorded["channelTime"]) == times[lost_ids[-1]]
    pg_restore(empty_db, backup)
    noticed = await look()
    assert noticed is not None and noticed.held == (KEY,)
    [line] = noticed.lines

    def ms(moment: datetime) -> str:
        return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    kept_last = max(i for i in times if i not in lost_ids)
    assert (
        f"; messages accepted on channel adt after {ms(times[kept_last])} up to"
        f" {ms(times[lost_ids[-1]])} are not in the database: ask the senders to send them"
        " again; delivery is held" in line
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [INTURN, "queue", "depth", "--json", "--dsn", empty_db],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [listed] = json.loads(done.stdout)
    assert (listed["destination"], listed["suspendedBy"]) == (KEY, "inturn-local")
    assert listed["pending"] == 4  # the kept ones, waiting again behind the hold


async def test_inturn_local_with_dsn_keeps_a_witness_per_database(
    empty_db: str, pg_server_dsn: str, tmp_path: Path
) -> None:
    """A new user's trial: a dump of the database --dsn named, restored into a database of
    its own after its messages were delivered, was sent again unnoticed. The witness of such
    databases is kept per identity (migration 0055): the restored copy is noticed and held, a
    database made anew is not taken for a restore, and a full disk does not move the clock."""
    from inturn.worker.local import witness
    from tests.support.db import database
    from tests.support.pipeline import register

    migrate(empty_db)
    register(empty_db, KEY, "adt")
    path = tmp_path / ".inturn" / witness.KEYED_FILE_NAME
    waiting = rows(empty_db, 5, "pending", "WAIT")
    assert await local_look(empty_db, path, keyed=True) is None
    backup = tmp_path / "queue.dump"
    pg_dump(empty_db, backup)
    deliver(empty_db, waiting)
    assert await local_look(empty_db, path, keyed=True) is None
    with (
        database(pg_server_dsn, "inturn_anew") as anew,
        database(pg_server_dsn, "inturn_copy") as copy,
    ):
        migrate(anew)
        register(anew, KEY, "adt")
        assert await local_look(anew, path, keyed=True) is None  # its own identity
        subprocess.run(
            [pg_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
             "--single-transaction", "-d", copy, str(backup)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        noticed = await local_look(copy, path, keyed=True)
        assert noticed is not None and noticed.held == (KEY,)
        [line] = noticed.lines
        assert "went back in time" in line and "5 message(s) delivered before" in line
        assert len(json.loads(path.read_text())["databases"]) == 2  # one per identity
        # a full disk under the file: the look fails whole, the clock stays where it was
        with psycopg.connect(anew) as conn:
            before = conn.execute("SELECT tick FROM inturn_clock").fetchone()
        with small_folder(tmp_path / "full") as full:
            shutil.copy(path, full / witness.KEYED_FILE_NAME)
            fill(full / "filler")
            with pytest.raises(OSError, match="No space left"):
                await local_look(anew, full / witness.KEYED_FILE_NAME, keyed=True)
            assert sorted(p.name for p in full.iterdir()) == ["filler", witness.KEYED_FILE_NAME]
        with psycopg.connect(anew) as conn:
            assert conn.execute("SELECT tick FROM inturn_clock").fetchone() == before


@contextlib.contextmanager
def small_folder(where: Path) -> Iterator[Path]:
    """A folder on a 64 KiB tmpfs of its own (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a tmpfs needs root")
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "inturn-witness", str(where)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False, capture_output=True, timeout=60)


def fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    with contextlib.suppress(OSError), path.open("wb") as out:
        while True:
            out.write(b"x" * 1024)
            out.flush()
