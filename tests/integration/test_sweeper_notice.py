"""Only ingest can put a message into a destination's queue (issue 27, item 4).

With the roles ``inturn migrate --create-roles`` makes, on a real Postgres: the sweeper cannot
insert a delivery (a forged ADT, ORU or notice); its one way to enqueue is the database function
that builds a cancelled booking's notice from the booking record, byte for byte the notice
``build_notice`` makes, and that refuses a booking not cancelled, a carrier without a withdrawn
segment, and a record altered (through the sweeper's own UPDATE privilege) to carry another
segment. Of every role, only ingest and admin (resend) may write a payload.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.reservations import bookings
from inturn.worker.reservations.cancel import cancel_expired
from inturn.worker.reservations.notice import build_notice
from inturn.worker.store import bookings as store
from inturn.worker.store import roles
from inturn.worker.store.model import Withdrawn
from tests.support.db import Denied, refused, register

pytestmark = pytest.mark.store

LATER = datetime(2026, 12, 3, tzinfo=UTC)


def booking(locator: str) -> dict[str, Any]:
    def segment(number: int, carrier: str, flight: str, status: str) -> dict[str, Any]:
        return {
            "number": number,
            "carrier": carrier,
            "flight": flight,
            "date": f"2026-12-{19 + number}",
            "origin": "JFK",
            "destination": "FRA",
            "status": status,
        }

    return {
        "locator": locator,
        "owner": "FRA1A0",
        "createdAt": "2026-11-30T07:00:00Z",
        "ticketingDeadline": "2026-12-01T18:00:00Z",
        "segments": [
            segment(1, "UA", "960", "HK"),
            segment(2, "LH", "400", "HN"),
            segment(3, "UA", "961", "KK"),
            segment(4, "UA", "962", "XX"),  # already dead: not withdrawn, not in the notice
        ],
    }


FORGED = [
    b"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|F1|P|2.5\rPID|1||P1^^^HOSP^MR\r",
    b"MSH|^~\\&|LIS|LAB|EHR|HOSP|20261129120000||ORU^R01|F2|P|2.5\rOBX|1|ST|K||POSITIVE\r",
    b"MSH|^~\\&|INTURN|FRA1A0|UA|UA|20261203000000||ZRC^Z01^ZRC_Z01|XXFAKEUA|P|2.5\r",
]


async def setup(fresh_db: str, role_dsns: dict[str, str], *locators: str) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, "air/united", "air", carriers=["UA"])
        await register(conn, "air/lufthansa", "air", carriers=["LH"])
    async with await AsyncConnection.connect(role_dsns["admin"], autocommit=True) as conn:
        await bookings.import_document(conn, [booking(loc) for loc in locators])


@pytest.mark.parametrize("payload", FORGED, ids=["ADT", "ORU", "notice"])
async def test_the_sweeper_cannot_insert_a_delivery(
    fresh_db: str,
    role_dsns: dict[str, str],
    payload: bytes,
) -> None:
    await setup(fresh_db, role_dsns)
    for columns, values in [
        (
            "destination, channel, control_id, message_type, payload, size",
            "%s, 'air', 'F', 'X', %s, 1",
        ),
        ("destination, channel, control_id, message_type, payload", "%s, 'air', 'F', 'X', %s"),
    ]:
        assert refused(
            role_dsns["sweeper"],
            f"INSERT INTO inturn_delivery ({columns}) VALUES ({values})",  # type: ignore[arg-type]
            ("air/united", payload),
        )
    assert refused(role_dsns["sweeper"], "SELECT inturn_enqueue_lock('air/united')")
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (0,)


async def test_the_notice_is_built_by_the_database_from_the_booking(
    fresh_db: str,
    role_dsns: dict[str, str],
) -> None:
    await setup(fresh_db, role_dsns, "NOTE01")
    async with await AsyncConnection.connect(role_dsns["sweeper"], autocommit=True) as conn:
        done = await cancel_expired(conn, "NOTE01", at=LATER)
        assert done.cancelled and sorted(done.told) == ["LH", "UA"]
        # calling the function again returns the notice made, never a second one
        again = await store.enqueue_cancel_notice(conn, "NOTE01", "UA")
        assert again == (done.told["UA"], "air/united")
        cancelled = await store.get(conn, "NOTE01")
        assert cancelled is not None and cancelled.cancelled_at is not None
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT destination, control_id, message_type, payload, size, patient_keys"
            " FROM inturn_delivery ORDER BY destination"
        )
        rows = await cur.fetchall()
    assert [r[:3] for r in rows] == [
        ("air/lufthansa", "XXNOTE01LH", "ZRC^Z01"),
        ("air/united", "XXNOTE01UA", "ZRC^Z01"),
    ]
    withdrawn = [  # what the Python builder is given for the same cancellation
        Withdrawn(n, carrier, flight, date(2026, 12, 19 + n), "JFK", "FRA", previous)
        for n, carrier, flight, previous in [
            (1, "UA", "960", "HK"),
            (2, "LH", "400", "HN"),
            (3, "UA", "961", "KK"),
        ]
    ]
    for (_, _, _, payload, size, keys), carrier in zip(rows, ["LH", "UA"], strict=True):
        expected = build_notice(
            locator="NOTE01",
            owner="FRA1A0",
            carrier=carrier,
            reason="ticketing-expired",
            cancelled_at=cancelled.cancelled_at,
            segments=withdrawn,
        )
        assert bytes(payload) == expected and size == len(expected) and keys == []
    assert b"ZSG|4|" not in bytes(rows[1][3])  # the segment that was dead already


#: What a stolen sweeper DSN may do to the records with its own privileges (withdraw a segment:
#: its status and a history event; cancel a booking: its cancellation columns).
WITHDRAW = [
    "UPDATE inturn_segment SET status = 'XX', status_changed_at = now()"
    " WHERE locator = 'EVIL01' AND number = 1",
    "INSERT INTO inturn_segment_event (locator, number, code, previous, result, outcome,"
    " received_at) VALUES ('EVIL01', 1, 'XX', 'HK', 'XX', 'withdrawn', now())",
]


def cancel(reason: str) -> str:
    return (
        "UPDATE inturn_booking SET cancelled_at = now(), cancel_reason = "
        f"{reason} WHERE locator = 'EVIL01'"
    )


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ([], psycopg.errors.ObjectNotInPrerequisiteState),  # not cancelled
        (WITHDRAW, psycopg.errors.ObjectNotInPrerequisiteState),  # withdrawn, not cancelled
        ([cancel("'x'")], psycopg.errors.ObjectNotInPrerequisiteState),  # nothing withdrawn
        # a segment smuggled into the reason, with a CR or a field separator
        ([cancel("E'x\\rPID|1||FORGED'"), *WITHDRAW], psycopg.errors.InvalidParameterValue),
        ([cancel("'a|b'"), *WITHDRAW], psycopg.errors.InvalidParameterValue),
        ([cancel("'a^b'"), *WITHDRAW], psycopg.errors.InvalidParameterValue),
        # ... or into the status a withdrawal event says the segment held
        (
            [cancel("'x'"), WITHDRAW[0], WITHDRAW[1].replace("'HK'", "E'HK\\rOBX|1'")],
            psycopg.errors.InvalidParameterValue,
        ),
    ],
    ids=[
        "not-cancelled",
        "withdrawn-not-cancelled",
        "nothing-withdrawn",
        "cr-in-reason",
        "separator-in-reason",
        "component-in-reason",
        "cr-in-previous",
    ],
)
async def test_the_function_makes_only_the_notice_it_is_for(
    fresh_db: str,
    role_dsns: dict[str, str],
    changes: list[str],
    error: type[Exception],
) -> None:
    await setup(fresh_db, role_dsns, "EVIL01")
    with psycopg.connect(role_dsns["sweeper"], autocommit=True) as conn:
        for change in changes:
            conn.execute(change)  # type: ignore[arg-type]
        with pytest.raises(error):
            conn.execute("SELECT * FROM inturn_enqueue_cancel_notice('EVIL01', 'UA')")
        with pytest.raises(psycopg.errors.NoDataFound):
            conn.execute("SELECT * FROM inturn_enqueue_cancel_notice('NOSUCH', 'UA')")
        with pytest.raises((psycopg.errors.NoDataFound, error)):  # no Destination serves ZZ
            conn.execute("SELECT * FROM inturn_enqueue_cancel_notice('EVIL01', 'ZZ')")
        # the sweeper may change a booking's cancellation, not who owns it or its flights
        with pytest.raises(Denied):
            conn.execute("UPDATE inturn_booking SET owner = 'X' WHERE locator = 'EVIL01'")
        with pytest.raises(Denied):
            conn.execute("UPDATE inturn_segment SET flight = '1|2' WHERE locator = 'EVIL01'")
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM inturn_delivery").fetchone() == (0,)


def test_only_ingest_and_admin_may_write_a_payload(
    fresh_db: str,
    role_dsns: dict[str, str],
) -> None:
    may: dict[str, tuple[bool, bool]] = {}
    with psycopg.connect(fresh_db) as conn:
        for component in roles.COMPONENTS:
            role = psycopg.conninfo.conninfo_to_dict(role_dsns[component])["user"]
            row = conn.execute(
                "SELECT has_column_privilege(%s, 'inturn_delivery', 'payload', 'INSERT'),"
                "       has_column_privilege(%s, 'inturn_delivery', 'payload', 'UPDATE')",
                (role, role),
            ).fetchone()
            assert row is not None
            may[component] = (bool(row[0]), bool(row[1]))
    assert {c for c, (ins, upd) in may.items() if ins or upd} == {"ingest", "admin"}
    assert may["ingest"] == (True, False)  # ingest inserts; nobody but admin rewrites


async def test_two_calls_at_once_make_one_notice(
    fresh_db: str,
    role_dsns: dict[str, str],
) -> None:
    await setup(fresh_db, role_dsns, "TWICE1")
    async with await AsyncConnection.connect(role_dsns["sweeper"], autocommit=True) as conn:
        done = await cancel_expired(conn, "TWICE1", host_carriers=["UA"], at=LATER)
        assert sorted(done.told) == ["LH"]  # UA is a host carrier here: not told yet
    a = await AsyncConnection.connect(role_dsns["sweeper"])
    b = await AsyncConnection.connect(role_dsns["sweeper"])
    try:
        first = await store.enqueue_cancel_notice(a, "TWICE1", "UA")  # a's transaction open
        second = asyncio.create_task(store.enqueue_cancel_notice(b, "TWICE1", "UA"))
        await asyncio.sleep(0.3)
        assert not second.done()  # waits for a's lock on the booking
        await a.commit()
        assert await second == first
        await b.commit()
    finally:
        await a.close()
        await b.close()
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE control_id = 'XXTWICE1UA'"
        ).fetchone() == (1,)


async def test_a_notice_goes_after_the_log_messages_its_destination_has_not_pulled(
    fresh_db: str, role_dsns: dict[str, str]
) -> None:
    """United's worker has not pulled two messages of its channel's log (issue 43): the
    sweeper's notice is queued after them, as it was when ingest wrote their rows."""
    from tests.support.channel_log import append

    await setup(fresh_db, role_dsns, "LOGGED")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        earlier = append(conn, ["air/united"], 2, channel="air")
    async with await AsyncConnection.connect(role_dsns["sweeper"], autocommit=True) as conn:
        done = await cancel_expired(conn, "LOGGED", at=LATER)
    with psycopg.connect(fresh_db) as conn:
        queued = conn.execute(
            "SELECT id, message_id, control_id FROM inturn_delivery"
            " WHERE destination = 'air/united' ORDER BY id"
        ).fetchall()
    assert [(m, c) for _, m, c in queued] == [
        (earlier[0], "C0"),
        (earlier[1], "C1"),
        (None, "XXLOGGEDUA"),
    ]
    assert queued[-1][0] == done.told["UA"]
