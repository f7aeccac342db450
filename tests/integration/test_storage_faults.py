"""Kind 4: AE only for what a retry can fix; a restart is not a failure.

Against the real Postgres: pooled connections killed under ingest (what a Postgres restart does
to them), content the database refuses (made to happen with a test trigger raising a chosen
SQLSTATE), and keyed fields over their bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import psycopg
import pytest
import pytest_asyncio

from inturn.worker.ingest.service import Ingest
from tests.support.ingest import http_post, minimal, mllp_ack, running
from tests.support.pipeline import register, rows

pytestmark = pytest.mark.store


@pytest_asyncio.fixture
async def ingest(fresh_db: str) -> AsyncIterator[Ingest]:
    register(fresh_db, "ward/lab", "c")
    async with running(fresh_db) as started:
        yield started


def kill_pooled_connections(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'inturn-ingest'"
        ).fetchone()
    assert found is not None
    return int(found[0])


async def test_a_restart_killing_every_pooled_connection_costs_no_ae(
    ingest: Ingest, fresh_db: str
) -> None:
    for round_ in range(3):
        # Open a few connections so that the pool holds several to be killed.
        acks = await asyncio.gather(
            *(mllp_ack(ingest, minimal(f"W{round_}-{i}")) for i in range(4))
        )
        assert {a.code for a in acks} == {"AA"}
        assert kill_pooled_connections(fresh_db) >= 1
        ack = await mllp_ack(ingest, minimal(f"AFTER-{round_}"))
        assert (ack.code, ack.control_id) == ("AA", f"AFTER-{round_}")
        status, ack = await http_post(ingest, minimal(f"HTTP-{round_}"))
        assert (status, ack.code) == (200, "AA")
    assert len(rows(fresh_db)) == 3 * 6  # each stored once


REFUSALS = """
CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.control_id LIKE 'SQLSTATE-%' THEN
        RAISE EXCEPTION 'refused by the test' USING ERRCODE = substr(NEW.control_id, 10, 5);
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS test_refuse ON inturn_message;
CREATE TRIGGER test_refuse BEFORE INSERT ON inturn_message
    FOR EACH ROW EXECUTE FUNCTION test_refuse();
"""


@pytest.mark.parametrize(
    ("sqlstate", "code", "status", "err"),
    [
        ("22023", "AR", 400, "102"),  # data exception: the content
        ("22021", "AR", 400, "102"),  # invalid byte sequence
        ("54000", "AR", 400, "104"),  # program limit exceeded: an index row too large
        ("23514", "AE", 503, "207"),  # a constraint an operator added: fixable
        ("53300", "AE", 503, "207"),  # insufficient resources: busy
        ("40001", "AE", 503, "207"),  # serialization failure
        ("55P03", "AE", 503, "207"),  # lock not available
        ("42501", "AE", 503, "207"),  # privilege: an operator can fix it, then a resend works
    ],
)
async def test_each_storage_error_class_gets_its_answer(
    ingest: Ingest, fresh_db: str, sqlstate: str, code: str, status: int, err: str
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(REFUSALS)
    try:
        ack = await mllp_ack(ingest, minimal(f"SQLSTATE-{sqlstate}"))
        assert (ack.code, ack.error_code) == (code, err)
        http_status, http_ack = await http_post(ingest, minimal(f"SQLSTATE-{sqlstate}-H"))
        assert (http_status, http_ack.code) == (status, code)
        assert rows(fresh_db) == []
        ack = await mllp_ack(ingest, minimal("FINE"))  # the next message is not affected
        assert ack.code == "AA"
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("DROP TRIGGER test_refuse ON inturn_message")


@pytest.mark.parametrize(
    ("payload", "location"),
    [
        (minimal("X" * 3000), "MSH^1^10"),
        (minimal("X" * 200), "MSH^1^10"),
        (minimal("OK", "A" * 40 + "^" + "B" * 40), "MSH^1^9"),
    ],
    ids=["msh10-3000", "msh10-200", "msh9"],
)
async def test_keyed_fields_are_bounded_at_the_door(
    ingest: Ingest, fresh_db: str, payload: bytes, location: str
) -> None:
    ack = await mllp_ack(ingest, payload)
    assert (ack.code, ack.error_code) == ("AR", "104")
    status, _ = await http_post(ingest, payload)
    assert status == 400
    assert rows(fresh_db) == []
    assert (await mllp_ack(ingest, minimal("Y" * 199))).code == "AA"  # the bound itself is fine


async def test_a_channel_name_over_its_bound_is_refused(ingest: Ingest) -> None:
    url = f"http://127.0.0.1:{ingest.http_port}/channels/{'c' * 129}/messages"
    async with aiohttp.ClientSession() as session, session.post(url, data=minimal("C")) as response:
        assert response.status == 400
