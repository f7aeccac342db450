"""A worker works for the destination it was started for, and the database enforces it (issue 41,
part 1; migration 0036; docs/explanation/security.md "One login per destination").

A login made for destination A (``inturn_worker_login``, what the operator calls per Destination)
reaches A's rows only, in every table the worker role may read or write, whatever the statement
(the worker's own, or one written by hand), through its lock functions too, and through a pooler;
``SET ROLE`` to the shared worker role widens nothing. The shared worker role keeps every
destination (the single-tenant default)."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from inturn.worker.errors import Invalid
from inturn.worker.hl7.profile import compile_profile
from inturn.worker.store import delivery, logins, roles
from inturn.worker.store import lease as leases
from inturn.worker.store.lease import LeaseLost
from inturn.worker.store.migrate import migrate
from inturn.worker.store.roles_apply import apply_roles
from inturn.worker.testing import MllpReceiver
from tests.support import pgbouncer
from tests.support.channel_log import append
from tests.support.db import migrate_below
from tests.support.pipeline import worker, worker_config

pytestmark = pytest.mark.store

A = "ward/a"
B = "ward/b"
CHANNEL = "adt"
PASSWORD = "not-a-real-password-0123456789abcdef"


def legacy(conn: psycopg.Connection[Any], destination: str, control_id: str) -> int:
    """A delivery row holding its own payload (stored before the log)."""
    payload = f"MSH|^~\\&|A|B|C|D|2026||ADT^A01|{control_id}|P|2.5\r".encode()
    [(row_id,)] = conn.execute(
        "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
        " size) VALUES (%s, %s, %s, 'ADT^A01', %s, %s) RETURNING id",
        (destination, CHANNEL, control_id, payload, len(payload)),
    ).fetchall()
    return int(row_id)


@contextlib.contextmanager
def login_for(admin_dsn: str, destination: str) -> Iterator[str]:
    """A worker login for ``destination`` made through the admin role (as the operator makes
    them); yields its DSN; dropped afterwards."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        verifier = logins.scram_verifier(PASSWORD)
        [(login,)] = conn.execute(
            "SELECT inturn_worker_login(%s, %s)", (destination, verifier)
        ).fetchall()
    try:
        yield make_conninfo(admin_dsn, user=login)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("SELECT inturn_worker_logout(%s)", (destination,))


@pytest.fixture
def seeded(fresh_db: str) -> dict[str, list[int]]:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        return {
            "both": append(conn, [A, B], 2, "AB"),
            "b": append(conn, [B], 2, "B"),
            "legacy_a": [legacy(conn, A, "LA")],
            "legacy_b": [legacy(conn, B, "LB")],
        }


def test_a_verifier_is_the_one_libpq_makes(dsn: str) -> None:
    """Our SCRAM-SHA-256 verifier equals libpq's (PQencryptPasswordConn) for the same salt."""
    with psycopg.connect(dsn) as conn:
        theirs = conn.pgconn.encrypt_password(PASSWORD.encode(), b"x", b"scram-sha-256").decode()
    iterations, rest = theirs.removeprefix("SCRAM-SHA-256$").split(":", 1)
    salt = base64.b64decode(rest.split("$", 1)[0])
    assert logins.scram_verifier(PASSWORD, salt=salt, iterations=int(iterations)) == theirs
    with pytest.raises(Invalid):
        logins.scram_verifier("with space")
    with pytest.raises(Invalid):
        logins.scram_verifier("")


def test_a_login_reaches_its_destinations_rows_only(
    fresh_db: str, role_dsns: dict[str, str], seeded: dict[str, list[int]]
) -> None:
    with login_for(role_dsns["admin"], A) as a_dsn, psycopg.connect(a_dsn, autocommit=True) as a:
        assert a.execute("SELECT inturn_worker_destination()").fetchone() == (A,)
        # the log: rows routed to A (and to A and B), never B's alone
        log_ids = [r[0] for r in a.execute("SELECT id FROM inturn_message ORDER BY id")]
        assert log_ids == seeded["both"]
        # the hot table: A's rows only, and nothing of B's to change
        rows = a.execute("SELECT destination FROM inturn_delivery").fetchall()
        assert rows == [(A,)]
        changed = a.execute(
            "UPDATE inturn_delivery SET state = 'delivered', finished_at = now()"
            " WHERE destination = %s",
            (B,),
        ).rowcount
        assert changed == 0
        refusals = {
            "a delivery row of B's": (
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " size, enqueued_at, message_id) VALUES (%s, 'adt', 'X', 'ADT^A01', 1, now(), %s)",
                (B, seeded["b"][0]),
            ),
            "B's cursor": (
                "INSERT INTO inturn_cursor (destination, channel, position) VALUES (%s, 'adt', 99)",
                (B,),
            ),
            "B's lease": (
                "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
                " VALUES (%s, 'me', 1, 'infinity', 60)",
                (B,),
            ),
            "B's sender record": (
                "INSERT INTO inturn_worker_sender (destination, fingerprint) VALUES (%s, 'x')",
                (B,),
            ),
            "an attempt of B's row": (
                "INSERT INTO inturn_attempt (item_id, attempt, outcome) VALUES (%s, 1, 'retry')",
                (seeded["legacy_b"][0],),
            ),
            "a worklist item on B's row": (
                "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason,"
                " placed_by) VALUES ('delivery-failed', 'delivery', %s, 'gave-up', 'me')",
                (str(seeded["legacy_b"][0]),),
            ),
            "a worklist item about something else": (
                "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason,"
                " placed_by) VALUES ('feeds', 'feed', 'adt', 'feed-silent', 'me')",
                None,
            ),
            "an order expectation of B's": (
                "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
                " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
                " VALUES (%s, %s, 'X', 'ORM^O01', 'k', 'd', 'orr', '{ORR}', now())",
                (B, seeded["legacy_b"][0]),
            ),
            # the pull's insertion: a slim row naming a log message routed to A only
            "a row of A's naming B's log message": (
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " size, enqueued_at, message_id) VALUES (%s, 'adt', 'X', 'ADT^A01', 1, now(), %s)",
                (A, seeded["b"][0]),
            ),
            "a row of A's naming no log message": (
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " size, enqueued_at) VALUES (%s, 'adt', 'X', 'ADT^A01', 1, now())",
                (A,),
            ),
            "B's sequence": (
                "INSERT INTO inturn_sequence (destination, last) VALUES (%s, 1)",
                (B,),
            ),
            "a sequence number of A's on B's row": (
                "INSERT INTO inturn_sequence_number (item_id, destination, number)"
                " VALUES (%s, %s, 1)",
                (seeded["legacy_b"][0], A),
            ),
            "B's worker lock": ("SELECT inturn_worker_lock(%s)", (B,)),
            "B's worker lock holder": ("SELECT inturn_worker_lock_holder(%s)", (B,)),
            "B's enqueue lock": ("SELECT inturn_enqueue_lock(%s)", (B,)),
        }
        refused = []
        for what, (statement, params) in refusals.items():
            try:
                with a.transaction():
                    a.execute(statement, params)
            except psycopg.errors.InsufficientPrivilege:
                refused.append(what)
        assert refused == list(refusals)
        # what is A's stays A's to write
        with a.transaction():
            a.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " size, enqueued_at, message_id) VALUES (%s, 'adt', 'X', 'ADT^A01', 1, now(), %s)",
                (A, seeded["both"][0]),
            )
            assert a.execute("SELECT inturn_worker_lock_holder(%s)", (A,)).fetchone() == (None,)
            a.execute(
                "INSERT INTO inturn_sequence_number (item_id, destination, number)"
                " VALUES (%s, %s, 1)",
                (seeded["legacy_a"][0], A),
            )
            a.execute(
                "INSERT INTO inturn_attempt (item_id, attempt, outcome) VALUES (%s, 1, 'retry')",
                (seeded["legacy_a"][0],),
            )
            a.execute(
                "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason,"
                " placed_by) VALUES ('delivery-failed', 'delivery', %s, 'gave-up', 'me')",
                (str(seeded["legacy_a"][0]),),
            )
            assert a.execute("SELECT inturn_worker_lock(%s)", (A,)).fetchone() == (True,)
            assert a.execute("SELECT inturn_worker_unlock(%s)", (A,)).fetchone() == (True,)
        # SET ROLE to the shared worker role widens nothing: the scope is the login's
        worker_role = conninfo_to_dict(role_dsns["worker"])["user"]
        a.execute(f'SET ROLE "{worker_role}"')
        assert a.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (2,)
        assert a.execute("SELECT inturn_worker_destination()").fetchone() == (A,)
    # the shared worker role still reaches every destination
    with psycopg.connect(role_dsns["worker"], autocommit=True) as shared:
        assert shared.execute("SELECT inturn_worker_destination()").fetchone() == ("*",)
        assert shared.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (3,)
        assert len(shared.execute("SELECT id FROM inturn_message").fetchall()) == 4
        # it too inserts only the pull's rows: a log message routed to the row's destination
        insert = (
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, size,"
            " enqueued_at, message_id) VALUES (%s, 'adt', 'X', 'ADT^A01', 1, now(), %s)"
        )
        for destination, message_id in ((A, seeded["b"][0]), (B, None), (A, 2**40 - 1)):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), shared.transaction():
                shared.execute(insert, (destination, message_id))
        with shared.transaction():
            shared.execute(insert, (B, seeded["b"][1]))


async def test_a_login_leases_and_pulls_its_own_destination_only(
    fresh_db: str, role_dsns: dict[str, str], seeded: dict[str, list[int]]
) -> None:
    with login_for(role_dsns["admin"], A) as a_dsn:
        async with await AsyncConnection.connect(a_dsn, autocommit=True) as a:
            lease_a = await leases.acquire(a, A, "w-a", 60)
            assert lease_a is not None
            pulled = await delivery.pull(a, A, CHANNEL, lease=lease_a)
            assert pulled.count == len(seeded["both"])
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await leases.acquire(a, B, "w-b", 60)
        # B's lease, taken by its own worker, cannot be used by A's login to pull B's rows
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as owner:
            lease_b = await leases.acquire(owner, B, "w-b", 60)
            assert lease_b is not None
        async with await AsyncConnection.connect(a_dsn, autocommit=True) as a:
            with pytest.raises((psycopg.errors.InsufficientPrivilege, LeaseLost)):
                await delivery.pull(a, B, CHANNEL, lease=lease_b)
    with psycopg.connect(fresh_db) as conn:
        [(b_rows,)] = conn.execute(
            "SELECT count(*) FROM inturn_delivery"
            " WHERE destination = %s AND message_id IS NOT NULL",
            (B,),
        ).fetchall()
    assert b_rows == 0


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_a_real_worker_delivers_with_its_login(
    fresh_db: str, role_dsns: dict[str, str], seeded: dict[str, list[int]], lanes: int
) -> None:
    """With spec.profile's sequenceNumbers too: the login keeps its destination's counter."""
    profile = compile_profile({"sequenceNumbers": True})
    with login_for(role_dsns["admin"], A) as a_dsn:
        async with MllpReceiver() as rx:
            cfg = worker_config(A, rx.port, channel=CHANNEL, lanes=lanes, profile=profile)
            async with worker(cfg, a_dsn):
                await rx.wait_for(3)
        headers = [m.split(b"\r")[0].split(b"|") for m in rx.received]
    assert sorted(h[9].decode() for h in headers) == ["AB0", "AB1", "LA"]
    assert sorted(h[12].decode() for h in headers) == ["1", "2", "3"]
    with psycopg.connect(fresh_db) as conn:
        states = conn.execute(
            "SELECT destination, state, count(*) FROM inturn_delivery GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
        numbered = conn.execute(
            "SELECT destination, count(*) FROM inturn_sequence_number GROUP BY 1"
        ).fetchall()
    assert states == [(A, "delivered", 3), (B, "pending", 1)]
    assert numbered == [(A, 3)]


@pytest.mark.skipif(pgbouncer.missing() is not None, reason=str(pgbouncer.missing()))
async def test_the_scope_holds_behind_a_pooler(
    fresh_db: str, role_dsns: dict[str, str], seeded: dict[str, list[int]]
) -> None:
    """PgBouncer in transaction mode logs in to the server as the client's user: the scope is
    the login's on whichever server session a transaction lands. Through it, a login of A's
    reads none of B's rows or payloads, takes no lease of B's, pulls nothing with B's lease and
    marks none of B's rows, while its own lease, pull and mark work."""
    with login_for(role_dsns["admin"], A) as a_dsn:
        login = conninfo_to_dict(a_dsn)["user"]
        with pgbouncer.Bouncer(fresh_db, "transaction", users=(login,)) as bouncer:
            pooled = bouncer.dsn(a_dsn)
            for _ in range(3):
                with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as a:
                    assert a.execute("SELECT inturn_worker_destination()").fetchone() == (A,)
                    assert a.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (1,)
                    assert a.execute("SELECT count(*) FROM inturn_message").fetchone() == (2,)
                    # B's payloads: its own row's, and the log's messages routed to B alone
                    assert a.execute(
                        "SELECT count(*) FROM inturn_delivery d"
                        " LEFT JOIN inturn_message m ON m.id = d.message_id"
                        " WHERE d.destination = %s OR m.id = ANY(%s)",
                        (B, seeded["b"]),
                    ).fetchone() == (0,)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as owner:
                lease_b = await leases.acquire(owner, B, "w-b", 60)
                assert lease_b is not None
            async with await AsyncConnection.connect(
                pooled, autocommit=True, prepare_threshold=None
            ) as a:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await leases.acquire(a, B, "w-x", 60, direct=False)
                with pytest.raises((psycopg.errors.InsufficientPrivilege, LeaseLost)):
                    await delivery.pull(a, B, CHANNEL, lease=lease_b)
                cur = await a.execute(
                    "UPDATE inturn_delivery SET state = 'delivered', finished_at = now()"
                    " WHERE destination = %s",
                    (B,),
                )
                assert cur.rowcount == 0
                lease_a = await leases.acquire(a, A, "w-a", 60, direct=False)
                assert lease_a is not None
                pulled = await delivery.pull(a, A, CHANNEL, lease=lease_a)
                assert pulled.count == len(seeded["both"])
    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute(
            "SELECT destination, state, count(*) FROM inturn_delivery GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    assert rows == [(A, "pending", 3), (B, "pending", 1)]


def test_a_login_is_made_and_dropped_with_its_destination(
    fresh_db: str, role_dsns: dict[str, str], pg_server_dsn: str
) -> None:
    admin = role_dsns["admin"]
    with login_for(admin, A) as a_dsn:
        login = conninfo_to_dict(a_dsn)["user"]
        with psycopg.connect(fresh_db, autocommit=True) as owner:
            [(stored,)] = owner.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (login,)
            ).fetchall()
            assert stored.startswith("SCRAM-SHA-256$4096:")
            assert owner.execute(
                "SELECT role::text, destination FROM inturn_worker_scope"
            ).fetchall() == [(login, A)]
        worker_role = conninfo_to_dict(role_dsns["worker"])["user"]
        assert login.startswith(worker_role + "_") and len(login) == len(worker_role) + 13
        with psycopg.connect(admin, autocommit=True) as conn:
            # made again: the same login, re-keyed; a clear password and a bad name refused
            again = conn.execute(
                "SELECT inturn_worker_login(%s, %s)", (A, logins.scram_verifier("other-one"))
            ).fetchone()
            assert again == (login,)
            for args, error in (
                ((A, "a clear password"), psycopg.errors.InvalidParameterValue),
                (("not a name", None), psycopg.errors.InvalidParameterValue),
            ):
                with pytest.raises(error):
                    conn.execute("SELECT inturn_worker_login(%s, %s)", args)
        # the worker and reader roles may not make logins
        for component in ("worker", "reader", "ingest"):
            with (
                psycopg.connect(role_dsns[component], autocommit=True) as conn,
                pytest.raises(psycopg.errors.InsufficientPrivilege),
            ):
                conn.execute("SELECT inturn_worker_login(%s, NULL)", (B,))
    with psycopg.connect(fresh_db, autocommit=True) as owner:
        assert owner.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchall() == []
        assert owner.execute("SELECT count(*) FROM inturn_worker_scope").fetchone() == (0,)


def test_a_login_whose_mapping_is_gone_reaches_nothing(
    fresh_db: str, role_dsns: dict[str, str], seeded: dict[str, list[int]], pg_server_dsn: str
) -> None:
    worker_role = conninfo_to_dict(role_dsns["worker"])["user"]
    stray = f"{worker_role}_0123456789ab"
    with psycopg.connect(pg_server_dsn, autocommit=True) as server:
        server.execute(f'CREATE ROLE "{stray}" LOGIN IN ROLE "{worker_role}"')
    try:
        with psycopg.connect(make_conninfo(fresh_db, user=stray), autocommit=True) as conn:
            assert conn.execute("SELECT inturn_worker_destination()").fetchone() == ("",)
            assert conn.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM inturn_message").fetchone() == (0,)
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as server:
            server.execute(f'DROP ROLE "{stray}"')


async def test_ensure_login_through_the_store(fresh_db: str, role_dsns: dict[str, str]) -> None:
    async with await AsyncConnection.connect(role_dsns["operator"], autocommit=True) as conn:
        login = await logins.ensure_login(conn, A, PASSWORD)
        assert await logins.ensure_login(conn, A) == login
        assert await logins.drop_login(conn, A) is True
        assert await logins.drop_login(conn, A) is False
        assert await logins.scope(conn) == "*"


def test_other_roles_plans_keep_the_patient_index(
    fresh_db: str, role_dsns: dict[str, str], seeded: dict[str, list[int]]
) -> None:
    """The worker's restrictive policy is the worker role's alone: the admin's patient lookup
    (array overlap, not leakproof, which a security barrier would keep off the index) still
    plans on the GIN index of the hot table and the log."""
    plans = []
    for component in ("admin",):  # the one role besides the worker that reads patient keys
        with psycopg.connect(role_dsns[component], autocommit=True) as conn:
            conn.execute("SET enable_seqscan = off")
            for table in ("inturn_delivery", "inturn_message"):
                rows = conn.execute(
                    f"EXPLAIN SELECT id FROM {table}"
                    " WHERE patient_keys && string_to_array('k1', ',')"
                ).fetchall()
                plans.append("\n".join(r[0] for r in rows))
    assert len(plans) == 2
    assert all("Bitmap Index Scan" in p and "Seq Scan" not in p for p in plans), plans


def test_every_table_the_worker_may_touch_is_scoped_or_said_why() -> None:
    """Generated from roles.py: a table granted to the worker role is either narrowed by its
    row policy (WORKER_SCOPED) or declared readable whole, with the reason (WORKER_UNSCOPED);
    a new table the worker is granted fails here until it is one or the other."""
    granted = {table for table, by in roles.GRANTS.items() if by.get("worker")}
    assert not set(roles.WORKER_SCOPED) & set(roles.WORKER_UNSCOPED)
    assert granted == set(roles.WORKER_SCOPED) | set(roles.WORKER_UNSCOPED)
    for table in roles.WORKER_UNSCOPED:
        assert all(g.privilege == "SELECT" for g in roles.GRANTS[table]["worker"]), table


def _seed_b_only(conn: psycopg.Connection[Any]) -> None:
    """A row of B's, and of B's alone, in every table of roles.WORKER_SCOPED."""
    conn.execute(
        "INSERT INTO inturn_destination (destination, namespace, name, channel)"
        " VALUES (%s, 'ward', 'b', %s)",
        (B, CHANNEL),
    )
    [log_id] = append(conn, [B], 1, "BO")
    row = legacy(conn, B, "LBO")
    for statement, params in (
        (
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, size,"
            " message_id) VALUES (%s, %s, 'BS', 'ADT^A01', 1, %s)",
            (B, CHANNEL, log_id),
        ),
        ("INSERT INTO inturn_cursor (destination, channel) VALUES (%s, %s)", (B, CHANNEL)),
        (
            "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
            " VALUES (%s, 'w-b', 1, now() - interval '1 hour', 60)",
            (B,),
        ),
        ("INSERT INTO inturn_worker_sender (destination, fingerprint) VALUES (%s, 'f')", (B,)),
        ("INSERT INTO inturn_attempt (item_id, attempt, outcome) VALUES (%s, 1, 'retry')", (row,)),
        (
            "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, placed_by)"
            " VALUES ('delivery-failed', 'delivery', %s, 'gave-up', 'w-b')",
            (str(row),),
        ),
        (
            "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
            " message_type, order_key, key_digest, reply_channel, reply_types, due_at)"
            " VALUES (%s, %s, 'LBO', 'ORM^O01', 'k', 'd', 'orr', '{ORR}', now())",
            (B, row),
        ),
        # a receiver profile's MSH-13 counter and a message's number (migration 0045)
        ("INSERT INTO inturn_sequence (destination, last) VALUES (%s, 1)", (B,)),
        (
            "INSERT INTO inturn_sequence_number (item_id, destination, number) VALUES (%s, %s, 1)",
            (row, B),
        ),
    ):
        conn.execute(statement, params)


def test_a_login_reads_and_changes_nothing_of_another_destination_in_any_scoped_table(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """Generated from roles.py: for every table of WORKER_SCOPED, holding B's rows only, a login
    of A's reads none, and every UPDATE and DELETE the worker role is granted there changes
    none (the policy hides them: 0 rows, as for rows that are not there)."""
    with psycopg.connect(fresh_db, autocommit=True) as owner:
        _seed_b_only(owner)
        held = {
            table: owner.execute(f"SELECT count(*) FROM {table}").fetchone()
            for table in roles.WORKER_SCOPED
        }
        generated = {
            table: [
                r[0]
                for r in owner.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attnum > 0 AND NOT attisdropped AND attidentity = ''",
                    (table,),
                )
            ]
            for table in roles.WORKER_SCOPED
        }
    # every scoped table holds a row of B's (a new one needs a seed above)
    assert all(n is not None and n[0] > 0 for n in held.values()), sorted(held.items())
    seen: dict[str, int] = {}
    changed: dict[str, int] = {}
    with login_for(role_dsns["admin"], A) as a_dsn, psycopg.connect(a_dsn, autocommit=True) as a:
        for table in roles.WORKER_SCOPED:
            grants = roles.GRANTS[table]["worker"]
            if any(g.privilege == "SELECT" for g in grants):
                row = a.execute(f"SELECT count(*) FROM {table}").fetchone()
                seen[table] = row[0] if row else -1
            for grant in grants:
                if grant.privilege == "UPDATE":
                    for column in grant.columns or generated[table]:
                        if column in grant.but:
                            continue
                        cur = a.execute(f"UPDATE {table} SET {column} = {column}")
                        changed[f"{table}.{column}"] = cur.rowcount
                elif grant.privilege == "DELETE":
                    changed[f"{table} DELETE"] = a.execute(f"DELETE FROM {table}").rowcount
    assert seen and set(seen.values()) == {0}, seen
    assert changed and set(changed.values()) == {0}, changed


def test_every_worker_function_of_a_destination_refuses_another(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """Generated from roles.FUNCTIONS: every function the worker role may execute that takes a
    destination refuses B to a login of A's when it runs as its owner (SECURITY DEFINER, where
    no row policy applies), and finds nothing of B's when it runs as its caller (the row
    policies apply)."""
    with psycopg.connect(fresh_db, autocommit=True) as owner:
        _seed_b_only(owner)
        definer = {
            signature: bool(
                (
                    owner.execute(
                        "SELECT prosecdef FROM pg_proc WHERE oid = %s::regprocedure", (signature,)
                    ).fetchone()
                    or (False,)
                )[0]
            )
            for signature, who in roles.FUNCTIONS.items()
            if "worker" in who and signature.endswith("(text)")
        }
    assert len(definer) >= 5, definer
    outcome: dict[str, str] = {}
    with login_for(role_dsns["admin"], A) as a_dsn, psycopg.connect(a_dsn, autocommit=True) as a:
        for signature in definer:
            name = signature.split("(")[0]
            try:
                rows = a.execute(f"SELECT * FROM {name}(%s)", (B,)).fetchall()
            except psycopg.errors.InsufficientPrivilege:
                outcome[signature] = "refused"
                continue
            outcome[signature] = f"rows {rows}"
    expected = {
        signature: "refused" if secure else "rows []" for signature, secure in definer.items()
    }
    assert outcome == expected


async def test_an_upgrade_keeps_every_worker_delivering_then_scopes_the_logins(
    empty_db: str, pg_server_dsn: str
) -> None:
    """An install from before migration 0036: its worker role (made by an older
    --create-roles; here with the grants a worker had then) keeps reaching every destination's
    rows once the new migrations apply and until the hook runs --create-roles again (only
    permissive policies meanwhile); after it, a destination's login reaches its own rows, those
    stored before the upgrade included, and a real worker delivers them with it."""
    migrate_below(empty_db, 36)
    with psycopg.connect(empty_db, autocommit=True) as owner:
        rows = {d: legacy(owner, d, f"UP{d[-1].upper()}") for d in (A, B)}
    tag = f"t{uuid.uuid4().hex[:8]}_"
    old = f"{tag}oldworker"
    try:
        with psycopg.connect(pg_server_dsn, autocommit=True) as server:
            server.execute(f'CREATE ROLE "{old}" LOGIN')
        with psycopg.connect(empty_db, autocommit=True) as owner:
            owner.execute(
                f'GRANT SELECT, UPDATE (state, finished_at) ON inturn_delivery TO "{old}"'
            )
        migrate(empty_db)
        with psycopg.connect(make_conninfo(empty_db, user=old), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (2,)
            assert (
                conn.execute(
                    "UPDATE inturn_delivery SET state = state WHERE id = %s", (rows[B],)
                ).rowcount
                == 1
            )
        apply_roles(empty_db, tag)
        admin = make_conninfo(empty_db, user=f"{tag}admin")
        with login_for(admin, A) as a_dsn:
            with psycopg.connect(a_dsn, autocommit=True) as a:
                seen = a.execute("SELECT id FROM inturn_delivery").fetchall()
                assert seen == [(rows[A],)]
            async with (
                MllpReceiver() as rx,
                worker(worker_config(A, rx.port, channel=CHANNEL), a_dsn),
            ):
                await rx.wait_for(1)
            assert [m.split(b"\r")[0].split(b"|")[9] for m in rx.received] == [b"UPA"]
        with psycopg.connect(
            make_conninfo(empty_db, user=f"{tag}worker"), autocommit=True
        ) as shared:
            states = shared.execute(
                "SELECT destination, state FROM inturn_delivery ORDER BY id"
            ).fetchall()
            assert states == [(A, "delivered"), (B, "pending")]
    finally:
        with psycopg.connect(empty_db, autocommit=True) as owner:
            for (role,) in owner.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (tag,)
            ).fetchall():
                owner.execute(f'DROP OWNED BY "{role}"')
        with psycopg.connect(pg_server_dsn, autocommit=True) as server:
            for (role,) in server.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)"
                " ORDER BY length(rolname) DESC",
                (tag,),
            ).fetchall():
                server.execute(f'DROP ROLE "{role}"')
