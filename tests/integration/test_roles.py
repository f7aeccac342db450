"""Least-privilege database roles: each component's role, made by ``inturn migrate
--create-roles``, does its real job through our own code, and is refused the rest."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo

from inturn.worker.cli import cli, main
from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.hl7.pid import lookup_key
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.operations.packs import names, select
from inturn.worker.reservations import bookings, sweep
from inturn.worker.reservations.cancel import cancel_expired
from inturn.worker.store import (
    actions,
    delivery,
    locks,
    lockwatch,
    queue,
    reads,
    registry,
    roles,
    roles_apply,
    worklist,
)
from inturn.worker.store import lease as leases
from inturn.worker.store.model import NewItem
from inturn.worker.testing import MllpReceiver
from inturn.worker.worklist.sweep import sweep as run_sweep
from tests.support import db
from tests.support.db import Denied, refused
from tests.support.pipeline import INTURN, worker, worker_config

pytestmark = pytest.mark.store

HOST = "127.0.0.1"
DEST = "ward/lab"


def message(control_id: str) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|{control_id}|P|2.5\r"
        "PID|1||P1^^^HOSP^MR||DOE^JOHN\r"
    ).encode()


async def register(
    conn: AsyncConnection[Any], destination: str, channel: str, carriers: list[str] | None = None
) -> bool:
    """Register ``destination`` (``namespace/name``) for ``channel`` as the operator does."""
    return await db.register(conn, destination, channel, carriers=carriers or [])


async def aseed(dsn: str, *control_ids: str, destination: str = DEST) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        items = [NewItem(destination, "adt", cid, "ADT^A01", message(cid)) for cid in control_ids]
        return await queue.enqueue(conn, items)


# --- every table has a decision ------------------------------------------------------------------


def test_every_table_has_a_grant_decision(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = roles_apply.tables(conn)
    assert set(present) == set(roles.GRANTS), "add the new table to roles.GRANTS"
    for table, decided in roles.GRANTS.items():
        assert set(decided) <= set(roles.COMPONENTS), table


def test_a_table_without_a_decision_stops_the_grants(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE inturn_zz_undecided (id int)")
        try:
            with pytest.raises(roles_apply.RolesError, match="inturn_zz_undecided"):
                roles_apply.apply_roles(dsn, f"t{uuid.uuid4().hex[:8]}_")
        finally:
            conn.execute("DROP TABLE inturn_zz_undecided")


def test_the_security_page_shows_the_grants_as_declared() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "security.md"
    assert roles.privilege_tables() in page.read_text(), "paste roles.privilege_tables() there"


def test_bad_prefix_is_a_usage_error(dsn: str) -> None:
    result = CliRunner().invoke(
        cli, ["migrate", "--dsn", dsn, "--create-roles", "--role-prefix", "Bad-Prefix"]
    )
    assert result.exit_code == 2 and "lower-case" in result.output


def test_running_it_again_changes_nothing_and_a_plain_role_cannot(
    dsn: str, role_dsns: dict[str, str]
) -> None:
    ingest_user = psycopg.conninfo.conninfo_to_dict(role_dsns["ingest"])["user"]
    same_prefix = str(ingest_user).removesuffix("ingest")
    report = roles_apply.apply_roles(dsn, same_prefix)
    assert report.created == [] and report.warnings == []  # all exist; grants reset
    with pytest.raises(roles_apply.RolesError, match="not allowed"):
        roles_apply.apply_roles(role_dsns["reader"], f"t{uuid.uuid4().hex[:8]}_")


# --- each role does its job and nothing else ------------------------------------------------------


async def test_ingest_role_stores_a_message(fresh_db: str, role_dsns: dict[str, str]) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, "adt")
    config = IngestConfig(listeners=[ListenerConfig("adt", HOST, 0)], refresh_seconds=0.2)
    async with Ingest(config, dsn=role_dsns["ingest"]) as ingest:
        reader, writer = await asyncio.open_connection(HOST, ingest.mllp_ports["adt"])
        writer.write(frame(message("ROLE-IN-1")))
        framer = FrameReader(1 << 20)
        async with asyncio.timeout(10):
            replies: list[bytes] = []
            while not replies:
                replies = [
                    e.payload for e in framer.feed(await reader.read(65536)) if isinstance(e, Frame)
                ]
        writer.close()
    assert parse_ack(replies[0]).code == "AA"
    with psycopg.connect(fresh_db) as conn:  # stored once, in the channel log, routed to DEST
        assert conn.execute(
            "SELECT m.control_id, r.destinations FROM inturn_message m"
            " JOIN inturn_route r ON r.id = m.route"
        ).fetchall() == [("ROLE-IN-1", [DEST])]


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_worker_role_delivers(fresh_db: str, role_dsns: dict[str, str], lanes: int) -> None:
    await aseed(fresh_db, "ROLE-W-1", "ROLE-W-2")
    async with MllpReceiver() as rx:
        cfg = worker_config(DEST, rx.port, channel="adt", lanes=lanes)
        async with worker(cfg, role_dsns["worker"]):
            await rx.wait_for(2)
    with psycopg.connect(fresh_db) as conn:
        states = conn.execute("SELECT state FROM inturn_delivery ORDER BY id").fetchall()
    assert states == [("delivered",), ("delivered",)]


async def test_operator_role_registers_and_reads_depth(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    await aseed(fresh_db, "ROLE-O-1")
    async with await AsyncConnection.connect(role_dsns["operator"], autocommit=True) as conn:
        assert await register(conn, DEST, "adt", carriers=["LH"])
        depth = await registry.status_depth(conn)
        assert depth[DEST].pending == 1
        # what a destination's lanes hold, through inturn_lane_window (keys made anonymous)
        [waiting] = await reads.lane_window(conn, DEST)
        assert waiting.keys and all(k.isdigit() for k in waiting.keys)
        assert await registry.mark_deleted(conn, DEST)
    async with await AsyncConnection.connect(role_dsns["reader"], autocommit=True) as conn:
        [seen] = await reads.lane_window(conn, DEST)
        assert seen.id == waiting.id and len(seen.keys) == len(waiting.keys)


async def test_purge_role_deletes_finished_items_by_age(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    [done, waiting] = await aseed(fresh_db, "ROLE-P-1", "ROLE-P-2")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered',"
            " finished_at = now() - interval '9 days' WHERE id = %s",
            (done,),
        )
    cutoff = datetime.now(UTC) - timedelta(days=7)
    async with await AsyncConnection.connect(role_dsns["purge"], autocommit=True) as conn:
        counts = await actions.purge(
            conn, {"delivered": cutoff, "failed": cutoff, "skipped": cutoff}
        )
        assert await worklist.purge(conn, 7 * 86400) == 0
    assert counts == {"delivered": 1, "failed": 0, "skipped": 0}
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT id FROM inturn_delivery").fetchall() == [(waiting,)]


def purge(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``inturn purge --dsn DSN ARGS`` as a process."""
    return subprocess.run(
        [INTURN, "purge", "--dsn", dsn, *args], capture_output=True, text=True, timeout=120
    )


async def test_purge_removes_the_expired_lease_rows_of_deleted_destinations_only(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """``inturn purge`` as the purge role (a real process; the role has no privilege on
    inturn_lease) removes the lease rows of destinations deleted or never registered whose
    lease expired longer ago than --older-than; it keeps a live destination's, a recent one,
    one still held, and the singletons'. A destination made again starts at epoch 1 under its
    new holder, and the old holder's lease fences nothing back in."""
    live, gone, recent, held, never = (
        "ward/live", "ward/gone", "ward/recent", "ward/held", "ward/never",
    )  # fmt: skip
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for destination in (live, gone, recent, held):
            await register(conn, destination, "adt")
        taken = {
            d: await leases.acquire(conn, d, f"w-{d}", 30)
            for d in (live, gone, recent, held, never)
        }
        for destination in (gone, recent, held):
            assert await registry.mark_deleted(conn, destination)
        first = taken[gone]
        assert first is not None
        await leases.release(conn, first)
        old = await leases.acquire(conn, gone, "w-old", 30)  # its last holder: epoch 2
        await conn.execute(
            "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
            " VALUES ('inturn:sweep', 'sweeper', 4, now() - interval '30 days', 60)"
        )
        await conn.execute(
            "UPDATE inturn_lease SET expires_at = now() - interval '8 days'"
            " WHERE destination = ANY(%s)",
            ([live, gone, never],),
        )
        await conn.execute(
            "UPDATE inturn_lease SET expires_at = now() - interval '1 hour' WHERE destination = %s",
            (recent,),
        )
    assert taken[held] is not None and old == leases.Lease(gone, "w-old", 2)
    done = await asyncio.to_thread(purge, role_dsns["purge"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("worklist cleared 0, leases 2")
    with psycopg.connect(fresh_db) as conn:
        left = conn.execute("SELECT destination, epoch FROM inturn_lease ORDER BY 1").fetchall()
    assert left == [
        ("inturn:purge", 1),  # this run's own (released, not long ago)
        ("inturn:sweep", 4),
        (held, 1),
        (live, 1),
        (recent, 1),
    ]
    # --older-than 0s: the recently expired one of a deleted destination too, never a held one
    again = await asyncio.to_thread(purge, role_dsns["purge"], "--older-than", "0s")
    assert again.stdout.splitlines()[0].endswith("leases 1"), again.stdout
    with psycopg.connect(fresh_db) as conn:
        left = conn.execute("SELECT destination FROM inturn_lease ORDER BY 1").fetchall()
    assert left == [("inturn:purge",), ("inturn:sweep",), (held,), (live,)]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, gone, "adt")  # made again
        assert await leases.acquire(conn, gone, "w-new", 30) == leases.Lease(gone, "w-new", 1)
        with pytest.raises(leases.LeaseLost):
            await leases.renew(conn, old, 30)
        assert await leases.acquire(conn, gone, "w-old", 30) is None  # the new lease is live
    # the purge role calls only the function: no privilege on the table itself
    assert refused(role_dsns["purge"], "DELETE FROM inturn_lease")


async def test_sweeper_role_runs_its_rules_and_an_auto_cancel(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    [expired, _] = await aseed(fresh_db, "ROLE-S-1", "ROLE-S-2")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as owner:
        await db.register(owner, DEST, "adt", stuck_after_seconds=60, expire_after_seconds=3600)
        await owner.execute(
            "UPDATE inturn_delivery SET enqueued_at = now() - interval '2 hours' WHERE id = %s",
            (expired,),
        )
    async with await AsyncConnection.connect(role_dsns["sweeper"], autocommit=True) as conn:
        report = await run_sweep(conn, select(names()), limit=100)
        assert report.ok, [r.summary(False) for r in report.results]
        outcomes = {r.rule.name: r.outcome.placed for r in report.results}
        assert (outcomes["destination-stuck"], outcomes["delivery-expired"]) == (1, 1)
        await worklist.clear_where(
            conn, record_kind="destination", record_keys=[DEST], who="sweeper", note="seen"
        )
        placed = await worklist.place(
            conn,
            queue="destination-stuck",
            record_kind="destination",
            record_key=DEST,
            reason="oldest-too-old",
            placed_by="sweeper",
        )
        assert placed.created
        cleared = await worklist.clear_where(
            conn, record_kind="destination", record_keys=[DEST], who="sweeper", note="drained"
        )
        assert len(cleared) == 1
        depth = await reads.depth(conn)
        assert depth[0].pending == 1
    # the reservation rules, and an automatic cancellation that tells the carrier
    booking = {
        "locator": "ROLE01",
        "owner": "FRA1A0",
        "createdAt": "2026-11-30T07:00:00Z",
        "ticketingDeadline": "2026-12-01T18:00:00Z",
        "segments": [
            {
                "number": 1,
                "carrier": "UA",
                "flight": "960",
                "date": "2026-12-20",
                "origin": "JFK",
                "destination": "FRA",
                "status": "HN",
                "requestedAt": "2026-11-30T08:00:00Z",
            }
        ],
    }
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, "air/united", "air", carriers=["UA"])
    async with await AsyncConnection.connect(role_dsns["admin"], autocommit=True) as conn:
        await bookings.import_document(conn, [booking])
    later = datetime(2026, 12, 3, tzinfo=UTC)
    async with await AsyncConnection.connect(role_dsns["sweeper"], autocommit=True) as conn:
        assert (await sweep.unanswered(conn, limit=10, at=later)).placed == 1
        assert (await sweep.ticketing_expired(conn, limit=10, at=later)).placed == 1
        done = await cancel_expired(conn, "ROLE01", at=later)
        assert done.cancelled and list(done.told) == ["UA"]
    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute(
            "SELECT destination FROM inturn_delivery WHERE destination = 'air/united'"
        ).fetchall()
    assert rows == [("air/united",)]


async def test_admin_role_decides(fresh_db: str, role_dsns: dict[str, str]) -> None:
    [a, b, c] = await aseed(fresh_db, "ROLE-A-1", "ROLE-A-2", "ROLE-A-3")
    async with await AsyncConnection.connect(role_dsns["admin"], autocommit=True) as conn:
        assert await actions.skip(conn, a, who="ops", why="test")
        assert await reads.payload(conn, b) == message("ROLE-A-2")
        assert await actions.erase(conn, [b], who="ops", why="test") == [b]
        assert await actions.drain(conn, DEST, who="ops", why="test") == [c]
        assert await actions.remove(conn, [a], who="ops") == [a]
        done = [row["action"] for row in await reads.audit_log(conn)]
        assert done == ["remove", "drain", "erase", "skip"]
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT id, state FROM inturn_delivery").fetchall() == [(c, "skipped")]


async def test_reader_role_lists_but_cannot_read_a_payload(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    [item] = await aseed(fresh_db, "ROLE-R-1")
    async with await AsyncConnection.connect(role_dsns["reader"], autocommit=True) as conn:
        shown = await reads.get_item(conn, item)
        assert shown is not None and shown.control_id == "ROLE-R-1"
        assert [d.destination for d in await reads.depth(conn)] == [DEST]
        with pytest.raises(Denied):
            await reads.payload(conn, item)


async def test_the_consoles_searches_run_with_its_roles(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """The console reads with the reader role and acts with the admin role: a control-ID search
    and an item's relatives need no patient data; the audited patient search runs as admin."""
    [first, second] = await aseed(fresh_db, "ROLE-S-1", "ROLE-S-2")
    async with await AsyncConnection.connect(role_dsns["reader"], autocommit=True) as conn:
        items, total = await reads.list_items(conn, control_id="ROLE-S-1")
        assert ([i.id for i in items], total) == ([first], 1)
        assert [i.id for i in await reads.resend_chain(conn, first)] == [first]
        page = await worklist.list_items(
            conn, record_kind="delivery", record_key=str(first), state=None
        )
        assert page.items == []
        with pytest.raises(Denied):
            await reads.search_patient(conn, lookup_key("P1"), who="pia", why="ticket")
    async with await AsyncConnection.connect(role_dsns["admin"], autocommit=True) as conn:
        items, total = await reads.search_patient(conn, lookup_key("P1"), who="pia", why="ticket")
        assert ([i.id for i in items], total) == ([second, first], 2)
        [entry] = await reads.audit_log(conn)
        assert (entry["action"], entry["itemIds"], entry["why"]) == (
            "search-patient",
            [second, first],
            "ticket",
        )


#: What each role must be refused (besides what its job test shows it can do).
REFUSED: dict[str, list[str]] = {
    "ingest": [
        "UPDATE inturn_delivery SET state = 'delivered'",
        "SELECT payload FROM inturn_delivery",
        "DELETE FROM inturn_delivery",
        "UPDATE inturn_destination SET suspended = true",
        "INSERT INTO inturn_destination (destination, namespace, name, channel)"
        " VALUES ('x/y', 'x', 'y', 'adt')",
        "SELECT * FROM inturn_worklist_item",
    ],
    "worker": [
        "DELETE FROM inturn_delivery",
        "UPDATE inturn_destination SET suspended = true",
        "DELETE FROM inturn_destination",
        "INSERT INTO inturn_destination (destination, namespace, name, channel)"
        " VALUES ('x/y', 'x', 'y', 'adt')",
        "DELETE FROM inturn_worklist_item",
        "TRUNCATE inturn_delivery",
    ],
    "operator": [
        "SELECT payload FROM inturn_delivery",
        "SELECT patient_keys FROM inturn_delivery",
        "UPDATE inturn_delivery SET state = 'skipped'",
        "DELETE FROM inturn_delivery",
        "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
        " size) VALUES ('a/b', 'c', 'd', 'e', '', 0)",
        "SELECT * FROM inturn_booking",
    ],
    "purge": [
        "SELECT payload FROM inturn_delivery",
        "UPDATE inturn_delivery SET state = 'skipped'",
        "DELETE FROM inturn_destination",
        "DELETE FROM inturn_audit",
    ],
    "sweeper": [
        "DELETE FROM inturn_booking",
        "SELECT payload FROM inturn_delivery",
        "DELETE FROM inturn_delivery",
        # it may skip an expired message (state, decider), nothing else of a delivery
        "UPDATE inturn_delivery SET attempts = 0",
        "UPDATE inturn_delivery SET payload = ''",
        "DELETE FROM inturn_worklist_item",
    ],
    "admin": [
        "CREATE TABLE inturn_evil (id int)",
        "DROP TABLE inturn_delivery",
        "ALTER TABLE inturn_delivery ADD COLUMN x int",
        "TRUNCATE inturn_delivery",
        "CREATE ROLE inturn_evil",
        "DELETE FROM inturn_audit",
        "SELECT * FROM inturn_received",
    ],
    "reader": [
        "SELECT payload FROM inturn_delivery",
        "UPDATE inturn_delivery SET state = 'skipped'",
        "DELETE FROM inturn_delivery",
        "INSERT INTO inturn_audit (who, action) VALUES ('x', 'y')",
    ],
}


#: Taking a destination's worker lock other than through the worker's own function, or as
#: another role: each would stop the destination's delivery while held.
WORKER_LOCK_KEY = f"hashtextextended('inturn:worker:{DEST}', 0)"
TAKE_WORKER_LOCK = [
    f"SELECT pg_try_advisory_lock({WORKER_LOCK_KEY})",
    f"SELECT pg_advisory_lock_shared({WORKER_LOCK_KEY})",
    f"SELECT pg_try_advisory_xact_lock({WORKER_LOCK_KEY})",
    f"SELECT pg_try_advisory_lock_shared({WORKER_LOCK_KEY})",
    f"SELECT inturn_worker_lock('{DEST}')",
]
for _component in roles.COMPONENTS:
    if _component != "worker":
        REFUSED[_component] += TAKE_WORKER_LOCK
REFUSED["worker"] += [
    # a worker changes only state, attempts, times and errors (it reads the patient keys: they
    # are its lanes' keys)
    "UPDATE inturn_delivery SET payload = convert_to('MSH|FORGED', 'UTF8')",
    "UPDATE inturn_delivery SET destination = 'ward/other'",
    "UPDATE inturn_delivery SET control_id = 'X', channel = 'x'",
    "UPDATE inturn_delivery SET patient_keys = NULL",
    # it takes its own lock through its function, no other key
    f"SELECT pg_try_advisory_lock({WORKER_LOCK_KEY})",
    "SELECT pg_try_advisory_lock(hashtextextended('inturn:purge', 0))",
    "SELECT inturn_purge_lock()",
    # it pulls slim rows from the channel log (migration 0033): never a payload or a state of
    # its own making, never a change to the log
    "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload, size)"
    " VALUES ('ward/lab', 'adt', 'X', 'ADT^A01', convert_to('MSH|FORGED', 'UTF8'), 11)",
    "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, size, state,"
    " finished_at) VALUES ('ward/lab', 'adt', 'X', 'ADT^A01', 11, 'delivered', now())",
    "UPDATE inturn_message SET payload = convert_to('MSH|FORGED', 'UTF8')",
    "INSERT INTO inturn_message (channel, control_id, message_type, payload, size, route)"
    " VALUES ('adt', 'X', 'ADT^A01', convert_to('MSH|FORGED', 'UTF8'), 11, 1)",
    "UPDATE inturn_cursor SET destination = 'ward/other'",
]
REFUSED["purge"] += [
    # purge deletes through its function only, which never deletes a pending row
    "DELETE FROM inturn_delivery WHERE state = 'pending'",
    "DELETE FROM inturn_worklist_item WHERE state = 'pending'",
    "SELECT id FROM inturn_delivery",
    "SELECT inturn_sweep_lock()",
    "SELECT inturn_sweep_lease('x', 60)",
    # the destinations' leases are the workers'
    "UPDATE inturn_lease SET epoch = epoch + 1",
]
REFUSED["reader"] += [
    "UPDATE inturn_lease SET epoch = epoch + 1",
    "SELECT patient_keys FROM inturn_delivery",
    "SELECT inturn_purge_lock()",
    "SELECT inturn_enqueue_lock('ward/lab')",
    "SELECT payload FROM inturn_message",
    "SELECT patient_keys FROM inturn_message",
]
for _component in roles.COMPONENTS:
    if _component != "sweeper":
        REFUSED[_component] += ["SELECT inturn_sweep_lease('x', 60)"]
    if _component != "worker":
        REFUSED[_component] += [
            "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
            " VALUES ('ward/lab', 'x', 9, now() + interval '1 h', 60)"
        ]
    if _component != "purge":
        REFUSED[_component] += [
            "SELECT inturn_purge_lease('x', 60)",
            "SELECT * FROM inturn_purge_deliveries('delivered', now() + interval '1 day', 10)",
            "SELECT * FROM inturn_purge_worklist(0, 10)",
        ]


def test_every_role_has_refusals_listed() -> None:
    assert set(REFUSED) == set(roles.COMPONENTS)


def snapshot(dsn: str) -> list[Any]:
    """Everything a refused statement could have changed: the rows of the delivery and
    worklist tables and the advisory locks held on the server."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            conn.execute("SELECT * FROM inturn_delivery ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM inturn_worklist_item ORDER BY id").fetchall(),
            conn.execute(
                "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall(),
        ]


@pytest.mark.parametrize(
    ("component", "statement"),
    [(c, statement) for c, statements in REFUSED.items() for statement in statements],
)
async def test_each_role_is_refused_the_rest(
    fresh_db: str, role_dsns: dict[str, str], component: str, statement: str
) -> None:
    [pending, done] = await aseed(fresh_db, "ROLE-X-1", "ROLE-X-2")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await delivery.succeeded(conn, done, 1, lease=await leases.acquire(conn, DEST, "test", 600))
        await worklist.place(
            conn, queue="delivery-failed", record_kind="delivery", record_key=str(pending),
            reason="gave-up", placed_by="worker",
        )  # fmt: skip
    before = snapshot(fresh_db)
    assert refused(role_dsns[component], statement)
    assert snapshot(fresh_db) == before
    dsn = role_dsns["reader"]
    assert refused(dsn, "UPDATE inturn_delivery SET state = 'skipped'")
    assert refused(dsn, "DELETE FROM inturn_delivery")
    assert refused(dsn, "INSERT INTO inturn_audit (who, action) VALUES ('x', 'y')")


async def test_worker_records_attempts_and_honours_a_hold_the_admin_role_sets(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    [item] = await aseed(fresh_db, "ROLE-H-1")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, "adt")
    worker_dsn, admin_dsn = role_dsns["worker"], role_dsns["admin"]
    async with await AsyncConnection.connect(worker_dsn, autocommit=True) as conn:
        assert await delivery.retry(
            conn, item, 1, 0, "application: AE", lease=await leases.acquire(conn, DEST, "test", 600)
        )
    async with await AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        assert [a.outcome for a in await reads.attempts(conn, item)] == ["retry"]
        assert await registry.suspend(conn, DEST, who="jo", why="upgrade")
    async with await AsyncConnection.connect(worker_dsn, autocommit=True) as conn:
        assert await delivery.next_head(
            conn, DEST, lease=await leases.acquire(conn, DEST, "test", 600)
        ) == (None, delivery.ON_HOLD)  # held: no head, and the worker told why
    async with await AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        assert await registry.resume(conn, DEST, who="jo")
    async with await AsyncConnection.connect(worker_dsn, autocommit=True) as conn:
        head, _ = await delivery.next_head(
            conn, DEST, lease=await leases.acquire(conn, DEST, "test", 600)
        )
        assert head is not None and head.item.id == item
    assert refused(worker_dsn, "UPDATE inturn_destination SET held_at = now()")
    assert refused(admin_dsn, "UPDATE inturn_destination SET channel = 'x'")


async def test_purge_role_cannot_delete_a_pending_row_even_through_its_functions(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    [pending] = await aseed(fresh_db, "ROLE-PP-1")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await worklist.place(
            conn, queue="delivery-failed", record_kind="delivery", record_key=str(pending),
            reason="gave-up", placed_by="worker",
        )  # fmt: skip
    before = snapshot(fresh_db)
    future = datetime.now(UTC) + timedelta(days=365)
    with psycopg.connect(role_dsns["purge"], autocommit=True) as conn:
        for state in ("pending", "delivered", "failed", "skipped"):
            deleted = conn.execute(
                "SELECT * FROM inturn_purge_deliveries(%s, %s, 5000)", (state, future)
            ).fetchall()
            assert deleted == []
        assert conn.execute("SELECT * FROM inturn_purge_worklist(-1e9, 5000)").fetchall() == []
    assert snapshot(fresh_db) == before


def test_purge_role_runs_inturn_purge(fresh_db: str, role_dsns: dict[str, str]) -> None:
    [done, pending] = asyncio.run(aseed(fresh_db, "ROLE-PC-1", "ROLE-PC-2"))
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered',"
            " finished_at = now() - interval '9 days' WHERE id = %s",
            (done,),
        )
    result = CliRunner().invoke(cli, ["purge", "--dsn", role_dsns["purge"], "--older-than", "7d"])
    assert result.exit_code == 0, result.output
    assert "delivered 1" in result.output
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT id FROM inturn_delivery").fetchall() == [(pending,)]


async def test_only_the_worker_role_holds_a_worker_lock(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """Every other role is refused the lock (above); the worker's own session takes it, and a
    second worker session waits for it, so the lock still means "the one sender"."""
    async with (
        await AsyncConnection.connect(role_dsns["worker"], autocommit=True) as first,
        await AsyncConnection.connect(role_dsns["worker"], autocommit=True) as second,
    ):
        assert await locks.try_component_lock(first, "worker", DEST)
        assert not await locks.try_component_lock(second, "worker", DEST)
        await locks.release_component_lock(first, "worker", DEST)
        assert await locks.try_component_lock(second, "worker", DEST)


def test_the_advisory_lock_functions_are_closed_to_public(
    dsn: str, role_dsns: dict[str, str]
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        still = conn.execute(
            roles_apply.Q["public_executes"], {"signatures": list(roles.ADVISORY_LOCKS)}
        ).fetchall()
        assert still == []
        # every function of ours is decided, and PUBLIC may execute none of them
        assert set(roles_apply.functions(conn)) == set(roles.FUNCTIONS)
        assert (
            conn.execute(
                roles_apply.Q["public_executes"], {"signatures": roles_apply.functions(conn)}
            ).fetchall()
            == []
        )


ADVISORY = ", ".join(roles.ADVISORY_LOCKS)


def test_a_plain_owner_is_told_what_it_could_not_revoke(
    dsn: str, pg_server_dsn: str, role_dsns: dict[str, str]
) -> None:
    """A tables' owner that is not a superuser cannot revoke the server's advisory lock
    functions: it still sets the grants, and says which protection is missing."""
    owner = f"t{uuid.uuid4().hex[:8]}_owner"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{owner}" LOGIN CREATEROLE')
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"GRANT EXECUTE ON FUNCTION {ADVISORY} TO PUBLIC")  # as installed
            for table in roles_apply.tables(conn):
                conn.execute(f'ALTER TABLE "{table}" OWNER TO "{owner}"')
            for function in roles_apply.functions(conn):
                conn.execute(f'ALTER FUNCTION {function} OWNER TO "{owner}"')
        try:
            report = roles_apply.apply_roles(
                make_conninfo(dsn, user=owner), f"t{uuid.uuid4().hex[:8]}_"
            )
            assert report.warnings and "superuser" in report.warnings[0]
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for table in roles_apply.tables(conn):
                    conn.execute(f'ALTER TABLE "{table}" OWNER TO CURRENT_USER')
                for function in roles_apply.functions(conn):
                    conn.execute(f"ALTER FUNCTION {function} OWNER TO CURRENT_USER")
                conn.execute(f"REVOKE EXECUTE ON FUNCTION {ADVISORY} FROM PUBLIC")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{owner}"')
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{owner}"')


def test_reader_role_runs_queue_list_and_is_told_what_it_lacks(
    fresh_db: str, role_dsns: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    [item] = asyncio.run(aseed(fresh_db, "ROLE-RL-1"))
    reader = role_dsns["reader"]
    result = CliRunner().invoke(cli, ["queue", "list", "--dsn", reader])
    assert result.exit_code == 0, result.output
    assert "ROLE-RL-1" in result.output
    for command in (["depth"], ["show", str(item)], ["audit"]):
        result = CliRunner().invoke(cli, ["queue", *command, "--dsn", reader])
        assert result.exit_code == 0, (command, result.output)
    # a command of another role: the error names the refusal and the role, not the DSN
    with pytest.raises(SystemExit) as exited:
        main(["queue", "payload", str(item), "--why", "test", "--dsn", reader])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "permission denied for table inturn_" in err  # the payload of a row or its log
    assert psycopg.conninfo.conninfo_to_dict(reader)["user"] in err
    assert "connection string" not in err


async def test_every_role_can_name_the_session_a_lock_wait_waits_for(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """The lock watch (inturn.worker.store.lockwatch) needs no privilege beyond the role's own:
    pg_blocking_pids and the pid, application name and user of pg_stat_activity."""
    holder = await AsyncConnection.connect(fresh_db, application_name="table-locker")
    await holder.execute("LOCK TABLE inturn_delivery IN ACCESS EXCLUSIVE MODE")
    waiter = await AsyncConnection.connect(fresh_db, autocommit=True)
    waiting = asyncio.create_task(waiter.execute("SELECT count(*) FROM inturn_delivery"))
    try:
        for component, role_dsn in role_dsns.items():
            async with await AsyncConnection.connect(role_dsn, autocommit=True) as conn:
                found: list[lockwatch.Blocker] = []
                async with asyncio.timeout(10):
                    while not found:
                        found = await lockwatch.blockers(conn, waiter.info.backend_pid)
                assert [(b.pid, b.application_name) for b in found] == [
                    (holder.info.backend_pid, "table-locker")
                ], component
    finally:
        await holder.rollback()
        await waiting
        await holder.close()
        await waiter.close()
