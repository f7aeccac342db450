"""A role does its own job down to the column and the row (issue 41, part 1): every column
privilege of every role is exactly what ``roles.py`` declares (generated from it, so a new
table or column is covered the day it is added); the singletons' lease rows are closed to every
role but through their components' functions; a resend link is written only by the insertion
of a real copy, and audited."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict

from inturn.worker.store import roles, sweep
from tests.support.db import Denied

pytestmark = pytest.mark.store

PRIVILEGES = ("SELECT", "INSERT", "UPDATE")


def _columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


def _declared(table: str, component: str, privilege: str, columns: list[str]) -> set[str]:
    allowed: set[str] = set()
    for grant in roles.GRANTS[table].get(component, ()):
        if grant.privilege != privilege:
            continue
        if grant.columns:
            allowed |= set(grant.columns)
        else:
            allowed |= set(columns) - set(grant.but)
    return allowed


def test_every_column_privilege_is_exactly_the_declared_one(
    dsn: str, role_dsns: dict[str, str]
) -> None:
    """For every table of roles.GRANTS, every role, every column and SELECT/INSERT/UPDATE (and
    DELETE per table): what Postgres lets the role do is what roles.py says, no more."""
    wrong: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for component, role_dsn in role_dsns.items():
            role = conninfo_to_dict(role_dsn)["user"]
            for table in roles.GRANTS:
                columns = _columns(conn, table)
                for privilege in PRIVILEGES:
                    allowed = _declared(table, component, privilege, columns)
                    for column in columns:
                        row = conn.execute(
                            "SELECT has_column_privilege(%s, %s, %s, %s)",
                            (role, table, column, privilege),
                        ).fetchone()
                        has = bool(row and row[0])
                        if has != (column in allowed):
                            wrong.append(f"{component} {privilege} {table}.{column}: {has}")
                deletes = any(
                    g.privilege == "DELETE" for g in roles.GRANTS[table].get(component, ())
                )
                row = conn.execute(
                    "SELECT has_table_privilege(%s, %s, 'DELETE')", (role, table)
                ).fetchone()
                if bool(row and row[0]) != deletes:
                    wrong.append(f"{component} DELETE {table}: {bool(row and row[0])}")
    assert wrong == []


def test_no_role_may_write_a_resend_link(role_dsns: dict[str, str]) -> None:
    for component, role_dsn in role_dsns.items():
        with psycopg.connect(role_dsn) as conn:
            with pytest.raises(Denied):
                conn.execute("UPDATE inturn_delivery SET resent_as = 1 WHERE false")
            conn.rollback()
        assert component  # every role, the admin's included


def test_a_route_set_never_changes(fresh_db: str, role_dsns: dict[str, str]) -> None:
    """Ingest's UPDATE on inturn_route.channel is for its upsert's change of nothing: moving a
    set to another channel (its messages would never be pulled) is refused to ingest and to the
    owner; the upsert still returns the set's id."""
    with psycopg.connect(fresh_db, autocommit=True) as owner:
        [(route,)] = owner.execute(
            "INSERT INTO inturn_route (channel, destinations) VALUES ('adt', '{ward/lab}')"
            " RETURNING id"
        ).fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            owner.execute(
                "UPDATE inturn_route SET destinations = '{ward/x}' WHERE id = %s", (route,)
            )
    with psycopg.connect(role_dsns["ingest"], autocommit=True) as ingest:
        for channel in ("other", "adt "):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                ingest.execute(
                    "UPDATE inturn_route SET channel = %s WHERE id = %s", (channel, route)
                )
        upserted = ingest.execute(
            "INSERT INTO inturn_route (channel, destinations) VALUES ('adt', '{ward/lab}')"
            " ON CONFLICT (channel, destinations) DO UPDATE SET channel = excluded.channel"
            " RETURNING id"
        ).fetchall()
        assert upserted == [(route,)]
        assert ingest.execute("SELECT id, channel, destinations FROM inturn_route").fetchall() == [
            (route, "adt", ["ward/lab"])
        ]


async def test_the_sweeper_only_skips_a_pending_message(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """The sweeper's UPDATE on a delivery's state is for delivery-expired's skip: marking a
    message delivered, failed or pending again, skipping without saying who decided, or
    touching a finished row is refused; its own skip (sweep.skip_expired, audited) works."""
    with psycopg.connect(fresh_db, autocommit=True) as owner:
        ids = [
            owner.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " payload, size, state, finished_at) VALUES ('ward/lab', 'adt', %s, 'ADT^A01',"
                " 'MSH|', 4, %s, %s) RETURNING id",
                (f"S-{state}", state, None if state == "pending" else "2026-12-05"),
            ).fetchall()[0][0]
            for state in ("pending", "pending", "delivered")
        ]
    with psycopg.connect(role_dsns["sweeper"], autocommit=True) as sweeper:
        for change in (
            "state = 'delivered', finished_at = now(), decided_by = 'sweeper'",
            "state = 'failed', finished_at = now(), decided_by = 'sweeper'",
            "state = 'skipped', finished_at = now()",
            "state = 'pending'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                sweeper.execute(f"UPDATE inturn_delivery SET {change} WHERE id = %s", (ids[0],))
        finished = sweeper.execute(
            "UPDATE inturn_delivery SET state = 'skipped', decided_by = 'sweeper',"
            " finished_at = now() WHERE id = %s",
            (ids[2],),
        )
        assert finished.rowcount == 0
    async with (
        await AsyncConnection.connect(role_dsns["sweeper"], autocommit=True) as conn,
        conn.transaction(),
    ):
        skipped = await sweep.skip_expired(conn, ids, who="sweeper", why="expired")
    assert sorted(r["id"] for r in skipped) == ids[:2]
    with psycopg.connect(fresh_db) as owner:
        states = owner.execute(
            "SELECT state FROM inturn_delivery WHERE id = ANY(%s) ORDER BY id", (ids,)
        ).fetchall()
    assert states == [("skipped",), ("skipped",), ("delivered",)]


def _seed(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = {}
        for name, state in (("failed", "failed"), ("delivered", "delivered")):
            row = conn.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " payload, size, state, finished_at) VALUES ('ward/lab', 'adt', %s, 'ADT^A01',"
                " 'MSH|', 4, %s, now()) RETURNING id",
                (f"C-{name}", state),
            ).fetchone()
            assert row is not None
            ids[name] = row[0]
        for singleton in ("inturn:sweep", "inturn:purge", "inturn:local"):
            conn.execute(
                "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
                " VALUES (%s, 'owner', 1, now() - interval '1 s', 60)",
                (singleton,),
            )
        return ids


def test_a_copy_links_its_own_original_only(fresh_db: str, role_dsns: dict[str, str]) -> None:
    """Ingest queues a copy naming the failed message: linked and audited. A copy that names
    another message (another MSH-10: the reported attack pointed a failed message at a
    delivered one) links nothing, so the failed message stays for a person."""
    ids = _seed(fresh_db)
    with psycopg.connect(role_dsns["ingest"], autocommit=True) as conn:
        for control_id in ("C-delivered", "C-failed"):
            conn.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " payload, size, resent_from) VALUES ('ward/lab', 'adt', %s, 'ADT^A01',"
                " 'MSH|', 4, %s)",
                (control_id, ids["failed"]),
            )
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        links = conn.execute(
            "SELECT o.control_id, c.control_id, c.state FROM inturn_delivery o"
            " JOIN inturn_delivery c ON c.id = o.resent_as ORDER BY o.id"
        ).fetchall()
        audit = conn.execute(
            "SELECT action, destination, item_ids FROM inturn_audit ORDER BY id"
        ).fetchall()
    assert links == [("C-failed", "C-failed", "pending")]
    assert len(audit) == 1 and audit[0][0] == "resend-linked" and audit[0][1] == "ward/lab"
    assert audit[0][2][0] == ids["failed"]


@pytest.mark.parametrize("component", ["worker", "ingest", "admin", "sweeper", "reader"])
def test_the_singletons_lease_rows_are_closed_to_every_role(
    fresh_db: str, role_dsns: dict[str, str], component: str
) -> None:
    """The reported attack: the worker role set the sweeper's lease to expire never, with a
    live backend's pid, and every sweep stopped for good. No role may write those rows."""
    _seed(fresh_db)
    with psycopg.connect(role_dsns[component], autocommit=True) as conn:
        try:
            cur = conn.execute(
                "UPDATE inturn_lease SET expires_at = 'infinity', holder = 'evil',"
                " backend_pid = pg_backend_pid() WHERE destination LIKE 'inturn:%%'"
            )
            assert cur.rowcount == 0  # the rows are not visible to an UPDATE
        except Denied:
            pass
        for statement in (
            "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
            " VALUES ('inturn:sweep2', 'evil', 1, 'infinity', 60)",
            "DELETE FROM inturn_lease WHERE destination = 'inturn:sweep'",
        ):
            try:
                cur = conn.execute(statement)
                assert cur.rowcount == 0, statement
            except (Denied, psycopg.errors.UniqueViolation):
                pass
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT destination, holder, expires_at < 'infinity' FROM inturn_lease"
            " ORDER BY destination"
        ).fetchall()
    assert rows == [
        ("inturn:local", "owner", True),
        ("inturn:purge", "owner", True),
        ("inturn:sweep", "owner", True),
    ]


def test_the_worker_still_writes_a_destinations_lease(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    with psycopg.connect(role_dsns["worker"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
            " VALUES ('ward/lab', 'w1', 1, now() + interval '1 min', 60)"
        )
        cur = conn.execute("UPDATE inturn_lease SET epoch = 2 WHERE destination = 'ward/lab'")
        assert cur.rowcount == 1
