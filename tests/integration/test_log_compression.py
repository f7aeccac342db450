"""The channel log's payloads read for less (migration 0057, issue 43):
inturn_log_payload_rows returns its row as a set, the payload as stored (decompressed once,
when sent), and new payloads are compressed with lz4 where the server has it (a third of
pglz's instructions to decompress). Every log partition takes lz4, and so does the next
epoch's, made ahead by the maintenance job; a payload stored with pglz before reads as it
did."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.store import delivery
from inturn.worker.store import lease as leases
from inturn.worker.store.migrate import migrate
from tests.support.channel_log import append
from tests.support.db import migrate_below

pytestmark = [pytest.mark.store, pytest.mark.usefixtures("epochs_as_migrated")]

A = "ward/lz4"


def has_lz4(conn: psycopg.Connection[Any]) -> bool:
    [(found,)] = conn.execute(
        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    ).fetchall()
    return bool(found)


def compression(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The payload column's compression setting of the log and each of its partitions."""
    rows = conn.execute(
        "SELECT c.relname, a.attcompression FROM pg_attribute a JOIN pg_class c"
        " ON c.oid = a.attrelid WHERE a.attname = 'payload'"
        " AND c.relnamespace = to_regnamespace(current_schema())"
        " AND c.relname ~ '^inturn_message(_e[0-9]+)?$'"
    ).fetchall()
    return {str(name): str(method) for name, method in rows}


def test_the_lookup_returns_a_set_and_no_row_for_an_id_the_log_does_not_hold(
    fresh_db: str,
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        [(is_set, rows)] = sync.execute(
            "SELECT proretset, prorows FROM pg_proc"
            " WHERE oid = 'inturn_log_payload_rows(bigint)'::regprocedure"
        ).fetchall()
        assert (is_set, rows) == (True, 1)
        [log_id] = append(sync, [A], 1)
        assert sync.execute("SELECT * FROM inturn_log_payload_rows(NULL)").fetchall() == []
        assert (
            sync.execute("SELECT * FROM inturn_log_payload_rows(%s)", (log_id + 1,)).fetchall()
            == []
        )
        [(payload, seal_id, scope)] = sync.execute(
            "SELECT * FROM inturn_log_payload_rows(%s)", (log_id,)
        ).fetchall()
        assert payload.startswith(b"MSH|") and (seal_id, scope) == (log_id, "channel:adt")


async def test_log_payloads_are_lz4_in_every_partition_and_read_back_whole(
    fresh_db: str,
) -> None:
    big = b"PID|1||" + b"^".join(b"%06d" % i for i in range(600)) + b"\r"  # compressible, 4 KB
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        if not has_lz4(sync):
            pytest.skip("this Postgres was built without lz4: the log keeps pglz")
        sync.execute("SELECT inturn_epoch_prepare(1000)")  # the next epoch's, made ahead
        assert compression(sync) == {
            "inturn_message": "l", "inturn_message_e1": "l", "inturn_message_e2": "l",
        }  # fmt: skip
        [old, new] = append(sync, [A], 2)
        # a payload stored with pglz before the migration: read as it was
        sync.execute("SET default_toast_compression = pglz")
        sync.execute("ALTER TABLE inturn_message_e1 ALTER COLUMN payload SET COMPRESSION pglz")
        sync.execute("UPDATE inturn_message SET payload = payload || %s WHERE id = %s", (big, old))
        sync.execute("ALTER TABLE inturn_message_e1 ALTER COLUMN payload SET COMPRESSION lz4")
        sync.execute("UPDATE inturn_message SET payload = payload || %s WHERE id = %s", (big, new))
        methods = dict(
            sync.execute(
                "SELECT id, pg_column_compression(payload) FROM inturn_message WHERE id = ANY(%s)",
                ([old, new],),
            ).fetchall()
        )
        assert methods == {old: "pglz", new: "lz4"}
        stored = dict(
            sync.execute(
                "SELECT id, payload FROM inturn_message WHERE id = ANY(%s)", ([old, new],)
            ).fetchall()
        )
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        held = await leases.acquire(conn, A, "w-lz4", 60)
        assert (await delivery.pull(conn, A, "adt", lease=held)).count == 2
        head, _ = await delivery.next_head(conn, A, lease=held, renew=False)
        assert head is not None and head.payload == bytes(stored[old]) and head.binding[0] == old
        _, (head, _) = await delivery.succeeded_next(conn, head.item, 1, lease=held, renew=False)
        assert head is not None and head.payload == bytes(stored[new]) and head.binding[0] == new


async def test_a_worker_with_prepared_statements_reads_on_across_the_migration(
    empty_db: str,
) -> None:
    """Migration 0057 runs under a worker whose session has prepared its per-message statements
    (psycopg prepares a statement at its fifth run on a direct connection): it drops no
    function a prepared plan names, so the same session reads and marks on, in order, with
    nothing failing ("cache lookup failed for function" once, when 0057 dropped and made
    ``inturn_log_payload`` again: an upgrade under traffic, clean-clone CI of 846f1e0)."""
    migrate_below(empty_db, 57)
    with psycopg.connect(empty_db, autocommit=True) as sync:
        ids = append(sync, [A], 12)
    async with await AsyncConnection.connect(empty_db, autocommit=True) as conn:
        assert conn.prepare_threshold == 5
        held = await leases.acquire(conn, A, "w-prepared", 60)
        assert (await delivery.pull(conn, A, "adt", lease=held)).count == 12
        head, _ = await delivery.next_head(conn, A, lease=held, renew=False)
        read = []
        for _ in range(8):  # prepared by now
            assert head is not None
            read.append(head.binding[0])
            _, (head, _) = await delivery.succeeded_next(
                conn, head.item, 1, lease=held, renew=False
            )
        assert [m.version for m in migrate(empty_db)] == [57]
        while head is not None:
            read.append(head.binding[0])
            _, (head, _) = await delivery.succeeded_next(
                conn, head.item, 1, lease=held, renew=False
            )
    assert read == ids
