"""Readers and people's actions on the channel log (issue 43, migration 0038): a destination's
queue is its rows plus the log rows routed to it past its cursor; depth counts both, exactly
and per destination; drain, erasure, resend and the sweeper act on both."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.store import actions, delivery, reads, registry
from inturn.worker.store import lease as leases
from tests.support.channel_log import CHANNEL, append

pytestmark = pytest.mark.store

A = "ward/a"
B = "ward/b"
C = "ward/c"


def register(conn: psycopg.Connection, *destinations: str, channel: str = CHANNEL) -> None:
    for d in destinations:
        ns, name = d.split("/")
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES (%s, %s, %s, %s)",
            (d, ns, name, channel),
        )


async def test_depth_counts_the_log_rows_each_destination_has_not_pulled(fresh_db: str) -> None:
    """A pulled some of its rows (a cursor), B never pulled (registered, no cursor), C takes
    none of them; an unrouted message waits for its channel's holder. Every reader of depth
    (queue depth, the operator's status, the list of destinations with work) counts exactly
    the rows each one has, pulled or not."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        both = append(sync, [A, B], 3)
        only_b = append(sync, [B], 2)
        append(sync, ["_unrouted/" + CHANNEL], 1)
        sync.execute("UPDATE inturn_message SET enqueued_at = now() - interval '1 hour'"
                     " WHERE id = %s", (both[0],))  # fmt: skip
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w-a", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease, limit=2)  # 2 pulled, 1 left
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            more = append(sync, [A], 2)
        rows = {r.destination: r for r in await reads.depth(conn)}
        assert {d: r.pending for d, r in rows.items()} == {
            A: 2 + 1 + len(more),
            B: len(both) + len(only_b),
            "_unrouted/" + CHANNEL: 1,
        }
        assert rows[A].channel == CHANNEL and rows[B].channel == CHANNEL
        assert rows[A].oldest_seconds >= 3600 and rows[B].oldest_seconds >= 3600
        assert rows[A].max_attempts == 0 and rows[B].failed == 0
        [only] = await reads.depth(conn, B)
        assert (only.destination, only.pending) == (B, 5)
        assert await reads.depth(conn, C) == []
        status = await registry.status_depth(conn)
        assert {d: s.pending for d, s in status.items()} == {d: r.pending for d, r in rows.items()}
        assert await reads.pending_destinations(conn) == sorted(rows)
        # once pulled, the same numbers from the rows alone
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        assert [r.pending for r in await reads.depth(conn, A)] == [5]
        cur = await conn.execute("SELECT count(*) FROM inturn_unpulled(%s)", (A,))
        assert await cur.fetchone() == (0,)


async def test_depth_of_two_hundred_destinations_finds_the_one_behind(fresh_db: str) -> None:
    """200 destinations on one channel, every cursor at the log's end but one: depth names
    that one with its exact count (with every worker live, each destination costs one probe
    of the log's (channel, id) index; bench/fanout.py prints the time)."""
    dests = [f"fan/d{i:03}" for i in range(200)]
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, *dests)
        ids = append(sync, dests, 20)
        sync.execute(
            "INSERT INTO inturn_cursor (destination, channel, position)"
            " SELECT d, %s, %s FROM unnest(%s::text[]) AS d",
            (CHANNEL, ids[-1], dests),
        )
        sync.execute("UPDATE inturn_cursor SET position = %s WHERE destination = %s",
                     (ids[4], dests[7]))  # fmt: skip
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        rows = await reads.depth(conn)
    assert [(r.destination, r.pending) for r in rows] == [(dests[7], 15)]


async def pending_ids(conn: AsyncConnection, destination: str) -> list[int]:
    cur = await conn.execute(
        "SELECT message_id FROM inturn_delivery WHERE destination = %s AND state = 'pending'"
        " ORDER BY id",
        (destination,),
    )
    return [r[0] for r in await cur.fetchall()]


async def test_a_drain_skips_the_messages_not_pulled_yet_too(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        ids = append(sync, [A, B], 5)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w-a", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease, limit=2)
        drained = await actions.drain(conn, A, who="alice", why="stale")
        assert len(drained) == 5
        assert await reads.depth(conn, A) == []
        # its worker finds nothing left to pull or send; B keeps every message
        assert (await delivery.pull(conn, A, CHANNEL, lease=lease)).count == 0
        assert await pending_ids(conn, A) == []
        assert [r.pending for r in await reads.depth(conn, B)] == [5]
        cur = await conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE destination = %s AND state = 'skipped'"
            " AND decided_by = 'alice'",
            (A,),
        )
        assert await cur.fetchone() == (5,)
    assert ids


async def test_erasing_one_item_erases_its_message_for_every_destination(fresh_db: str) -> None:
    """M is routed to A, B and C: A and B pulled it, C did not. Erasing A's item erases the
    log row and B's item too; C never gets it; another message stays everywhere."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        m, other = append(sync, [A, B, C], 2)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for d in (A, B):
            lease = await leases.acquire(conn, d, "w", 60)
            await delivery.pull(conn, d, CHANNEL, lease=lease)
        cur = await conn.execute(
            "SELECT id, destination FROM inturn_delivery WHERE message_id = %s ORDER BY id", (m,)
        )
        rows = await cur.fetchall()
        item_a = next(i for i, d in rows if d == A)
        erased = await actions.erase(conn, [item_a], who="alice", why="request")
        assert erased == sorted(i for i, _ in rows)
        cur = await conn.execute("SELECT id FROM inturn_message ORDER BY id")
        assert [r[0] for r in await cur.fetchall()] == [other]
        lease_c = await leases.acquire(conn, C, "w-c", 60)
        await delivery.pull(conn, C, CHANNEL, lease=lease_c)
        for d in (A, B, C):
            assert await pending_ids(conn, d) == [other]
        cur = await conn.execute("SELECT action, item_ids FROM inturn_audit WHERE action = 'erase'")
        assert await cur.fetchall() == [("erase", sorted(i for i, _ in rows))]


async def test_erasure_by_patient_reaches_messages_no_destination_pulled(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        mine = append(sync, [A, B], 2)
        theirs = append(sync, [A], 1)
        sync.execute("UPDATE inturn_message SET patient_keys = '{k9}' WHERE id = ANY(%s)", (mine,))
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w-a", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease, limit=1)  # A has one of them
        erased = await actions.erase(conn, [], who="alice", why="request", patient_key="k0,k9")
        # A's row, and the message only in the log as minus its log id
        assert len(erased) == 2 and erased[0] == -mine[1] and erased[1] > 0
        cur = await conn.execute("SELECT id FROM inturn_message ORDER BY id")
        assert [r[0] for r in await cur.fetchall()] == theirs
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        assert await pending_ids(conn, A) == theirs
        assert await reads.depth(conn, B) == []


async def test_a_resend_goes_after_the_messages_accepted_before_it(fresh_db: str) -> None:
    """A's first message failed; two more are in the log, not pulled: the resend pulls them
    first, so its copy is sent after them, as it would have been with one row per message."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A)
        [first] = append(sync, [A], 1)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w-a", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now()"
            " WHERE message_id = %s",
            (first,),
        )
        cur = await conn.execute("SELECT id FROM inturn_delivery WHERE message_id = %s", (first,))
        [(failed,)] = await cur.fetchall()
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            later = append(sync, [A], 2)
        done = await actions.resend_many(conn, [failed], who="alice", why="fixed")
        [(_, copy)] = done.copies
        cur = await conn.execute(
            "SELECT id, message_id FROM inturn_delivery WHERE destination = %s"
            " AND state = 'pending' ORDER BY id",
            (A,),
        )
        assert [(m if m is not None else i) for i, m in await cur.fetchall()] == [*later, copy]


async def test_the_sweeper_judges_messages_no_worker_pulled(fresh_db: str) -> None:
    """No worker ever ran for A (stuck after 60 s), for B (expiring after 600 s) nor for the
    deleted D: their messages wait in the log an hour. The sweeper pulls them, then finds A and B
    stuck, B's messages expired (skipped by it) and D orphaned; E, whose message is a second
    old, is left to its worker."""
    from inturn.worker.worklist.delivery_rules import (
        delivery_expired,
        destination_stuck,
        orphaned_queue,
    )
    from tests.support.db import register as register_live

    d, e = "ward/d", "ward/e"
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register_live(conn, A, CHANNEL, stuck_after_seconds=60)
        await register_live(conn, B, CHANNEL, expire_after_seconds=600)
        await register_live(conn, d, CHANNEL)
        await register_live(conn, e, CHANNEL)
        await conn.execute(
            "UPDATE inturn_destination SET deleted_at = now() WHERE destination = %s", (d,)
        )
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            old = append(sync, [A, B, d], 2)
            sync.execute(
                "UPDATE inturn_message SET enqueued_at = now() - interval '1 hour'"
                " WHERE id = ANY(%s)",
                (old,),
            )
            append(sync, [e], 1)
        stuck = await destination_stuck(conn, limit=10, dry_run=False)
        assert stuck.placed == 2  # A, and B (the default 900 s) before its expiry skips them
        orphaned = await orphaned_queue(conn, limit=10, dry_run=False)
        assert orphaned.placed == 1
        expired = await delivery_expired(conn, limit=10, dry_run=False)
        assert expired.placed == 2
        cur = await conn.execute(
            "SELECT record_key, reason FROM inturn_worklist_item ORDER BY reason, record_key"
        )
        keys = await cur.fetchall()
        assert [(k, r) for k, r in keys if r != "expired"] == [
            (A, "destination-stuck"),
            (B, "destination-stuck"),
            (d, "orphaned-queue"),
        ]
        cur = await conn.execute(
            "SELECT destination, state, decided_by FROM inturn_delivery ORDER BY destination, id"
        )
        assert await cur.fetchall() == [
            (A, "pending", None),
            (A, "pending", None),
            (B, "skipped", "sweeper"),
            (B, "skipped", "sweeper"),
            (d, "pending", None),
            (d, "pending", None),
        ]
        assert [r.pending for r in await reads.depth(conn, e)] == [1]  # not pulled: too new


async def sealed_log_row(
    conn: psycopg.Connection,
    codec: PayloadCodec | None,
    route: list[str],
    plain: bytes,
    keys: list[str],
) -> int:
    """A message appended to the log sealed once, bound to its log id and channel, as ingest
    seals it with payload keys."""
    conn.execute(
        "INSERT INTO inturn_route (channel, destinations) VALUES (%s, %s)"
        " ON CONFLICT (channel, destinations) DO NOTHING",
        (CHANNEL, sorted(route)),
    )
    [(route_id,)] = conn.execute(
        "SELECT id FROM inturn_route WHERE channel = %s AND destinations = %s",
        (CHANNEL, sorted(route)),
    ).fetchall()
    [(log_id,)] = conn.execute("SELECT nextval('inturn_message_id_seq')").fetchall()
    stored = await codec.seal(log_id, f"channel:{CHANNEL}", plain) if codec else plain
    conn.execute(
        "INSERT INTO inturn_message (id, channel, control_id, message_type, payload, size,"
        " route, patient_keys) OVERRIDING SYSTEM VALUE"
        " VALUES (%s, %s, 'CTL', 'ADT^A01', %s, %s, %s, %s)",
        (log_id, CHANNEL, stored, len(plain), route_id, keys),
    )
    return int(log_id)


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
async def test_lookups_that_read_payloads_open_a_slim_rows_log_payload(
    fresh_db: str, keys_dir: Path, key_dsn: str, sealed: bool
) -> None:
    """A message whose identifiers passed ingest's cap (only 'capped' indexed) is sealed once
    in the log and pulled by A and B: the lookup by patient beyond the index and the payload
    scan open it, with its log row's binding, for each destination's row."""
    from inturn.worker.operations import privacy
    from inturn.worker.store import identifiers
    from tests.support import keys as test_keys

    codec = await test_keys.codec(keys_dir, key_dsn) if sealed else None
    plain = (
        b"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|CTL|P|2.5\r"
        b"PID|1||H-9^^^HOSP^MR~H-10^^^HOSP^MR||LOG^LENA\r"
    )
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        log_id = await sealed_log_row(sync, codec, [A, B], plain, ["capped"])
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for d in (A, B):
            lease = await leases.acquire(conn, d, "w", 60)
            await delivery.pull(conn, d, CHANNEL, lease=lease)
        cur = await conn.execute(
            "SELECT id FROM inturn_delivery WHERE message_id = %s ORDER BY id", (log_id,)
        )
        rows = [r[0] for r in await cur.fetchall()]
        found = await identifiers.find_patient(conn, "H-10", payloads=codec)
        assert [i.id for i in found] == rows
        assert await identifiers.find_patient(conn, "H-11", payloads=codec) == []
        scanned = await privacy.find_for_erasure(conn, patient_id="H-9", scan=True, payloads=codec)
        assert sorted(m.id for m in scanned) == rows


async def test_encrypt_existing_seals_each_log_message_once(
    fresh_db: str, keys_dir: Path, key_dsn: str
) -> None:
    """Two messages in clear in the log, pulled by A and B, not by C: encrypt-existing seals
    each once, bound to its log id and channel, leaves the slim rows without a payload of
    their own and gives them the blind index form alone; each worker's head opens it, and a
    second run seals nothing."""
    from inturn.worker.operations import payload_keys
    from inturn.worker.store import identifiers
    from tests.support import keys as test_keys

    codec = await test_keys.codec(keys_dir, key_dsn)
    plain = (
        b"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|CTL|P|2.5\r"
        b"PID|1||H-7^^^HOSP^MR||LOG^LENA\r"
    )
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        plain_keys = identifiers.keys_text(plain).split(",")
        ids = [await sealed_log_row(sync, None, [A, B, C], plain, plain_keys) for _ in range(2)]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        held = {}
        for d in (A, B):
            held[d] = await leases.acquire(conn, d, "w", 60)
            await delivery.pull(conn, d, CHANNEL, lease=held[d])
        done = await payload_keys.encrypt_existing(conn, codec, batch=1, settle_seconds=0)
        assert (done.sealed, done.pending_in_clear) == (2, False)
        cur = await conn.execute("SELECT id, payload, patient_keys FROM inturn_message ORDER BY id")
        blind = codec.index_keys(plain)
        for log_id, stored, keys_now in await cur.fetchall():
            assert await codec.open(log_id, f"channel:{CHANNEL}", bytes(stored)) == plain
            assert keys_now == blind
        cur = await conn.execute(
            "SELECT count(*), count(payload), count(*) FILTER (WHERE patient_keys = %s)"
            " FROM inturn_delivery",
            (blind,),
        )
        assert await cur.fetchone() == (4, 0, 4)
        for d in (A, B):
            head, _ = await delivery.next_head(conn, d, lease=held[d])
            assert head is not None and head.binding == (ids[0], f"channel:{CHANNEL}")
            assert await codec.open(*head.binding, head.payload) == plain
        again = await payload_keys.encrypt_existing(conn, codec, batch=1, settle_seconds=0)
        assert again.sealed == 0
        found = await identifiers.find_patient(conn, "H-7", payloads=codec)
        assert len(found) == 6  # A's and B's rows, and each message C has not pulled
        assert sorted(i.id for i in found if i.destination == C) == sorted(-i for i in ids)


async def test_lookups_by_msh10_and_patient_list_messages_not_pulled_yet(fresh_db: str) -> None:
    """C0 is routed to A, B and C; A pulled it. A lookup by its MSH-10, or by its patient,
    lists A's row and, for B and C, the log message as pending with the negative of its log
    id, after the rows; the counts agree, a destination filter and a state filter narrow them,
    and once B pulls, its row replaces the log's line."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        [m] = append(sync, [A, B, C], 1)
        sync.execute("UPDATE inturn_message SET patient_keys = '{k5}' WHERE id = %s", (m,))
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        cur = await conn.execute("SELECT id FROM inturn_delivery WHERE destination = %s", (A,))
        [(row_a,)] = await cur.fetchall()
        for found, total in (
            await reads.list_items(conn, control_id="C0"),
            await reads.list_items(conn, patient_key="k0,k5"),
        ):
            assert [(i.id, i.destination, i.state) for i in found] == [
                (row_a, A, "pending"),
                (-m, B, "pending"),
                (-m, C, "pending"),
            ]
            assert total == 3
        narrowed, total = await reads.list_items(conn, control_id="C0", destination=C)
        assert ([i.id for i in narrowed], total) == ([-m], 1)
        assert await reads.list_items(conn, control_id="C0", state="delivered") == ([], 0)
        assert await reads.list_items(conn, control_id="nothing") == ([], 0)
        # a page is never cut between the lines of one message
        page, _ = await reads.list_items(conn, control_id="C0", limit=2)
        assert [i.destination for i in page] == [A, B, C]
        first, _ = await reads.list_items(conn, control_id="C0", limit=1)
        rest, _ = await reads.list_items(conn, control_id="C0", before=first[-1].id)
        assert [i.destination for i in first + rest] == [A, B, C]
        assert await reads.list_items(conn, control_id="C0", before=-m) == ([], 3)
        lease_b = await leases.acquire(conn, B, "w", 60)
        await delivery.pull(conn, B, CHANNEL, lease=lease_b)
        found, total = await reads.list_items(conn, control_id="C0")
        assert [i.destination for i in found] == [B, A, C] and total == 3
        assert min(i.id for i in found) == -m


@pytest.mark.parametrize("lanes", [1, 4], ids=["one-stream", "lanes"])
async def test_a_suspended_destination_holds_its_log_messages_until_resumed(
    fresh_db: str, lanes: int
) -> None:
    """A is suspended with messages in the log: its worker sends nothing while depth counts
    every message; resumed, it sends them all in order; B, routed the same messages, is not
    held up."""
    import asyncio

    from inturn.worker.operations import queue as queue_ops
    from inturn.worker.operations.actor import Trusted
    from inturn.worker.testing import MllpReceiver
    from tests.support import pipeline
    from tests.support.pipeline import worker as run_worker

    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        append(sync, [A, B], 3)
        expected = [
            bytes(r[0])
            for r in sync.execute("SELECT payload FROM inturn_message ORDER BY id").fetchall()
        ]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await queue_ops.suspend(conn, Trusted("ops"), A, "receiver upgrade")
        async with MllpReceiver() as rx_a, MllpReceiver() as rx_b:
            config_a = pipeline.worker_config(A, rx_a.port, channel=CHANNEL, lanes=lanes)
            config_b = pipeline.worker_config(B, rx_b.port, channel=CHANNEL, lanes=lanes)
            async with run_worker(config_a, fresh_db), run_worker(config_b, fresh_db):
                await rx_b.wait_for(3)
                await asyncio.sleep(1.5)  # beyond A's idle poll: it would have sent by now
                assert rx_a.received == []
                [row] = await reads.depth(conn, A)
                assert row.pending == 3
                await queue_ops.resume(conn, Trusted("ops"), A, "done")
                await rx_a.wait_for(3)
        assert sorted(rx_a.received) == sorted(expected)
        if lanes == 1:
            assert rx_a.received == expected
        assert sorted(rx_b.received) == sorted(expected)


async def test_purge_never_takes_a_log_row_a_destination_still_needs(fresh_db: str) -> None:
    """A delivered both messages (its slim rows finished long ago), B pulled none: the purge
    of finished rows deletes A's rows and leaves both log rows, which B still pulls and
    reads."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        ids = append(sync, [A, B], 2)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered',"
            " finished_at = now() - interval '30 days'"
        )
        cur = await conn.execute(
            "SELECT count(*) FROM inturn_purge_deliveries('delivered', now(), 1000)"
        )
        assert await cur.fetchone() == (2,)
        cur = await conn.execute("SELECT id FROM inturn_message ORDER BY id")
        assert [r[0] for r in await cur.fetchall()] == ids
        lease_b = await leases.acquire(conn, B, "w-b", 60)
        await delivery.pull(conn, B, CHANNEL, lease=lease_b)
        head, _ = await delivery.next_head(conn, B, lease=lease_b)
        assert head is not None and head.payload.startswith(b"MSH|")
        assert head.binding == (ids[0], f"channel:{CHANNEL}")


async def test_a_destinations_head_for_people_is_its_first_message_not_pulled(
    fresh_db: str,
) -> None:
    """The console's head of a destination (heads, oldest_pending): its oldest pending row,
    else the first log message it has not pulled (pending, -log id, due)."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        first, _ = append(sync, [A, B], 2)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        heads = await reads.heads(conn, [A, B, C])
        assert sorted(heads) == [A, B]
        assert heads[A].item_id > 0 and heads[B].item_id == -first
        assert (heads[B].attempts, heads[B].wait_seconds) == (0, 0.0)
        head_b = await reads.oldest_pending(conn, B)
        assert head_b is not None
        assert (head_b.id, head_b.destination, head_b.control_id, head_b.state) == (
            -first,
            B,
            "C0",
            "pending",
        )
        head_a = await reads.oldest_pending(conn, A)
        assert head_a is not None and head_a.id == heads[A].item_id
        assert await reads.oldest_pending(conn, C) is None


async def test_a_slim_row_given_up_is_a_delivery_failed_item_read_and_resent(
    fresh_db: str,
) -> None:
    """A's receiver rejects (AR) the message A pulled from the log: the worker gives it up to
    delivery-failed; a person reads its payload (the log row's) and resends it; the copy is
    delivered. B, routed the same message, got it once, untouched."""
    import asyncio
    import dataclasses

    from inturn.worker.operations import privacy
    from inturn.worker.operations.actor import Trusted
    from inturn.worker.testing import MllpReceiver
    from tests.support import pipeline
    from tests.support.pipeline import worker as run_worker

    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        [m] = append(sync, [A, B], 1)
        [(payload,)] = sync.execute("SELECT payload FROM inturn_message").fetchall()
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        async with MllpReceiver(ack_code="AR") as rx_a, MllpReceiver() as rx_b:
            once = dataclasses.replace(pipeline.FAST_RETRY, max_attempts=1)
            config_a = pipeline.worker_config(A, rx_a.port, channel=CHANNEL, retry=once)
            config_b = pipeline.worker_config(B, rx_b.port, channel=CHANNEL)
            async with run_worker(config_a, fresh_db), run_worker(config_b, fresh_db):
                async with asyncio.timeout(15):
                    while True:
                        cur = await conn.execute(
                            "SELECT w.record_key FROM inturn_worklist_item w"
                            " WHERE w.queue = 'delivery-failed' AND w.state = 'pending'"
                        )
                        found = await cur.fetchall()
                        if found:
                            break
                        await asyncio.sleep(0.05)
                [(key,)] = found
                failed = int(key)
                item = await reads.get_item(conn, failed)
                assert item is not None and (item.destination, item.state) == (A, "failed")
                shown = await privacy.view_payload(conn, Trusted("ops"), failed, "ticket 9")
                assert shown.data == bytes(payload)
                rx_a.ack_code = "AA"
                done = await actions.resend_many(conn, [failed], who="ops", why="fixed")
                [(_, copy)] = done.copies
                await rx_a.wait_for(2)  # the rejected send, then the copy
                await rx_b.wait_for(1)
        cur = await conn.execute("SELECT state FROM inturn_delivery WHERE id = %s", (copy,))
        assert await cur.fetchone() == ("delivered",)
    assert rx_a.received == [bytes(payload), bytes(payload)]
    assert rx_b.received == [bytes(payload)]
    assert m


async def test_a_message_not_pulled_is_shown_read_and_erased_by_its_listed_id(
    fresh_db: str,
) -> None:
    """The id a lookup lists for a message not pulled yet (minus its log id) is shown
    (pending, for the first destination that has not pulled it), its payload read (audited)
    and erased, for every destination."""
    from inturn.worker.operations import privacy
    from inturn.worker.operations.actor import Trusted

    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B, C)
        m, other = append(sync, [A, B, C], 2)
        [(stored,)] = sync.execute(
            "SELECT payload FROM inturn_message WHERE id = %s", (m,)
        ).fetchall()
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        item = await reads.get_item(conn, -m)
        assert item is not None
        assert (item.id, item.destination, item.state, item.control_id) == (-m, B, "pending", "C0")
        assert await reads.get_item(conn, -(other + 1000)) is None
        assert await reads.payload(conn, -m) == bytes(stored)
        shown = await privacy.view_payload(conn, Trusted("ops"), -m, "ticket 3")
        assert shown.data == bytes(stored)
        erased = await actions.erase(conn, [-m], who="dpo", why="request")
        assert len(erased) == 1  # A's row; B's and C's copies were only in the log
        cur = await conn.execute("SELECT id FROM inturn_message")
        assert [r[0] for r in await cur.fetchall()] == [other]
        assert await reads.get_item(conn, -m) is None
        assert [r.pending for r in await reads.depth(conn, C)] == [1]


@pytest.mark.parametrize("scan", [False, True], ids=["index", "scan"])
async def test_an_erasure_finds_a_patients_message_no_destination_pulled(
    fresh_db: str, scan: bool
) -> None:
    """H-3's first message was pulled by A (not B), its second by nobody: the lookup for
    erasure (by the index, and by reading every payload) finds A's row and each log message a
    destination has not pulled (minus its log id), and erasing what it found erases both
    messages for every destination."""
    from inturn.worker.operations import privacy
    from inturn.worker.store import identifiers

    plain = (
        b"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261205120000||ADT^A01|CTL|P|2.5\r"
        b"PID|1||H-3^^^HOSP^MR||LOG^LENA\r"
    )
    keys = identifiers.keys_text(plain).split(",")
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        pulled = await sealed_log_row(sync, None, [A, B], plain, keys)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            waiting = await sealed_log_row(sync, None, [A, B], plain, keys)
            other = append(sync, [A, B], 1)
        cur = await conn.execute("SELECT id FROM inturn_delivery WHERE destination = %s", (A,))
        [(row_a,)] = await cur.fetchall()
        found = await privacy.find_for_erasure(conn, patient_id="H-3", scan=scan)
        # B pulled nothing: the first message is its line too
        expected = {(row_a, A), (-pulled, B), (-waiting, A)}
        assert {(m.id, m.destination) for m in found} == expected
        erased = await actions.erase(conn, [m.id for m in found], who="dpo", why="request")
        assert erased == [-waiting, row_a]
        cur = await conn.execute("SELECT id FROM inturn_message")
        assert [r[0] for r in await cur.fetchall()] == other


async def test_a_destination_moved_to_another_channel_counts_the_log_it_will_pull(
    fresh_db: str,
) -> None:
    """A pulled adt's log, then was moved to orm: its depth counts orm's messages routed to it
    (what its pull takes next), not adt's messages past its cursor, and a drain skips them."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A)
        append(sync, [A], 1)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease)
        await conn.execute("UPDATE inturn_delivery SET state = 'delivered', finished_at = now()")
        with psycopg.connect(fresh_db, autocommit=True) as sync:
            sync.execute(
                "UPDATE inturn_destination SET channel = 'orm' WHERE destination = %s", (A,)
            )
            append(sync, [A], 2, channel="orm")
            append(sync, [B], 3)  # adt's, past A's cursor, not A's
        [row] = await reads.depth(conn, A)
        assert (row.channel, row.pending) == ("orm", 2)
        assert len(await actions.drain(conn, A, who="ops", why="moved")) == 2
        assert await reads.depth(conn, A) == []


async def test_a_destinations_listing_shows_what_it_has_not_pulled(fresh_db: str) -> None:
    """`queue list -d A` (the console's destination page): A's rows, then each log message it
    has not pulled, oldest first, paged by before; its count equals its depth."""
    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A, B)
        ids = append(sync, [A, B], 5)
        append(sync, [B], 2)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        lease = await leases.acquire(conn, A, "w", 60)
        await delivery.pull(conn, A, CHANNEL, lease=lease, limit=2)
        found, total = await reads.list_items(conn, destination=A)
        assert total == 5 == (await reads.depth(conn, A))[0].pending
        assert [i.id for i in found][2:] == [-i for i in ids[2:]]
        assert all(i.destination == A and i.state == "pending" for i in found)
        page, _ = await reads.list_items(conn, destination=A, limit=3)
        rest, _ = await reads.list_items(conn, destination=A, limit=3, before=page[-1].id)
        assert [i.id for i in page + rest] == [i.id for i in found]
        assert (await reads.list_items(conn, destination=A, state="delivered"))[1] == 0
        assert (await reads.list_items(conn, destination=B))[1] == 7


async def test_skip_or_resend_of_a_message_not_pulled_says_why_nothing_changed(
    fresh_db: str,
) -> None:
    from inturn.worker.errors import Conflict
    from inturn.worker.operations import queue as queue_ops
    from inturn.worker.operations.actor import Trusted

    with psycopg.connect(fresh_db, autocommit=True) as sync:
        register(sync, A)
        [m] = append(sync, [A], 1)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        with pytest.raises(Conflict, match=f"message {m} of channel adt's log, not pulled yet"):
            await queue_ops.skip(conn, Trusted("ops"), -m, "stale")
        assert [r.pending for r in await reads.depth(conn, A)] == [1]
