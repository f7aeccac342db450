"""The destination lease (inturn.worker.store.lease) against a real Postgres: acquire, renew,
release, takeover only after expiry with the epoch raised, and the plans of its statements."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from inturn.worker.errors import Invalid
from inturn.worker.store import delivery, lease, locks, queue
from inturn.worker.store.lease import Lease, LeaseLost
from inturn.worker.store.model import NewItem
from inturn.worker.worklist.delivery_failed import give_up

pytestmark = pytest.mark.store

DEST = "hospital/lab"


async def test_acquire_a_free_destination_gives_epoch_one(conn: AsyncConnection[Any]) -> None:
    got = await lease.acquire(conn, DEST, "a", 30)
    assert got == Lease(DEST, "a", 1)
    info = await lease.holder(conn, DEST)
    assert info is not None
    assert (info.holder, info.epoch) == ("a", 1)
    assert 29 < info.seconds_left <= 30


async def test_a_live_lease_is_never_taken_over(conn: AsyncConnection[Any]) -> None:
    assert await lease.acquire(conn, DEST, "a", 30) is not None
    assert await lease.acquire(conn, DEST, "b", 30) is None
    info = await lease.holder(conn, DEST)
    assert info is not None and (info.holder, info.epoch) == ("a", 1)


async def test_takeover_after_expiry_raises_the_epoch_and_fences_the_old_holder(
    conn: AsyncConnection[Any],
) -> None:
    old = await lease.acquire(conn, DEST, "a", 0.2)
    assert old is not None
    await asyncio.sleep(0.3)
    new = await lease.acquire(conn, DEST, "b", 30)
    assert new == Lease(DEST, "b", 2)
    with pytest.raises(LeaseLost, match="epoch 1 of a"):
        await lease.renew(conn, old, 30)
    await lease.release(conn, old)  # a stale release changes nothing
    info = await lease.holder(conn, DEST)
    assert info is not None and (info.holder, info.epoch) == ("b", 2) and info.seconds_left > 29


async def test_an_expired_lease_cannot_be_renewed(conn: AsyncConnection[Any]) -> None:
    mine = await lease.acquire(conn, DEST, "a", 0.1)
    assert mine is not None
    await asyncio.sleep(0.2)
    with pytest.raises(LeaseLost):
        await lease.renew(conn, mine, 30)


async def test_renew_extends_and_says_what_is_left(conn: AsyncConnection[Any]) -> None:
    mine = await lease.acquire(conn, DEST, "a", 1)
    assert mine is not None
    left = await lease.renew(conn, mine, 45)
    assert 44 < left <= 45


async def test_release_lets_a_successor_in_at_once_with_a_higher_epoch(
    conn: AsyncConnection[Any],
) -> None:
    first = await lease.acquire(conn, DEST, "a", 30)
    assert first is not None
    await lease.release(conn, first)
    second = await lease.acquire(conn, DEST, "b", 30)
    assert second == Lease(DEST, "b", 2)  # the row and its epoch outlive the release


async def test_the_same_holder_reacquires_its_own_lease_with_a_new_epoch(
    conn: AsyncConnection[Any],
) -> None:
    """After a reconnect the holder need not wait out its own lease; its earlier statements
    are fenced all the same."""
    first = await lease.acquire(conn, DEST, "a", 30)
    again = await lease.acquire(conn, DEST, "a", 30)
    assert first is not None and again == Lease(DEST, "a", 2)
    with pytest.raises(LeaseLost):
        await lease.renew(conn, first, 30)


async def test_destinations_are_leased_apart(conn: AsyncConnection[Any]) -> None:
    assert await lease.acquire(conn, DEST, "a", 30) == Lease(DEST, "a", 1)
    assert await lease.acquire(conn, "hospital/rad", "b", 30) == Lease("hospital/rad", "b", 1)


async def test_racing_acquirers_get_one_lease(fresh_db: str) -> None:
    """Ten sessions acquire an expired lease at once: exactly one wins, one epoch raised."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as c:
        assert await lease.acquire(c, DEST, "old", 0.05) is not None
    await asyncio.sleep(0.1)
    conns = [await AsyncConnection.connect(fresh_db, autocommit=True) for _ in range(10)]
    try:
        got = await asyncio.gather(
            *(lease.acquire(c, DEST, f"h{i}", 30) for i, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    won = [g for g in got if g is not None]
    assert len(won) == 1 and won[0].epoch == 2


async def test_bad_ttl_is_refused(conn: AsyncConnection[Any]) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await lease.acquire(conn, DEST, "a", 0)


def test_holder_ids_are_unique_and_name_the_process() -> None:
    a, b = lease.holder_id(), lease.holder_id("lab")
    assert a != b and b.endswith(":lab")
    assert re.fullmatch(r".+:\d+:[0-9a-f]{8}", a)


def test_lease_statements_use_the_primary_key(dsn: str) -> None:
    """Each statement finds its row by the primary key, whatever the table holds."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET enable_seqscan = off")
        for name in ("renew", "release", "holder"):
            params = {"destination": DEST, "holder": "a", "epoch": 1, "ttl_seconds": 30}
            plan = "\n".join(r[0] for r in c.execute(f"EXPLAIN {lease.Q[name]}", params).fetchall())  # type: ignore[call-overload]
            assert "inturn_lease_pkey" in plan, (name, plan)


# --- the guard in the worker's statements (inturn.worker.store.queue) ---------------------------


def _item(n: int) -> NewItem:
    payload = f"MSH|^~\\&|A|B|C|D|||ADT^A01|G{n}|P|2.5\r".encode()
    return NewItem(DEST, "adt", f"G{n}", "ADT^A01", payload)


async def _row(conn: AsyncConnection[Any], item_id: int) -> tuple[str, int]:
    cur = await conn.execute(
        "SELECT state, attempts FROM inturn_delivery WHERE id = %s", (item_id,)
    )
    row = await cur.fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


async def test_a_stale_epoch_changes_nothing_in_any_guarded_statement(
    conn: AsyncConnection[Any],
) -> None:
    [a, b] = await queue.enqueue(conn, [_item(1), _item(2)])
    stale = await lease.acquire(conn, DEST, "old", 0.1)
    assert stale is not None
    head, _ = await delivery.next_head(conn, DEST, lease=stale)
    assert head is not None and head.item.id == a
    await asyncio.sleep(0.2)
    assert await lease.acquire(conn, DEST, "new", 30) is not None  # takeover: epoch 2
    with pytest.raises(LeaseLost, match="reading the head"):
        await delivery.next_head(conn, DEST, lease=stale)
    with pytest.raises(LeaseLost, match=f"marking id={a} delivered"):
        await delivery.succeeded_next(conn, head.item, 1, lease=stale)
    with pytest.raises(LeaseLost):
        await delivery.succeeded(conn, a, 1, lease=stale)
    with pytest.raises(LeaseLost):
        await delivery.retry(conn, a, 1, 60, "timeout", lease=stale)
    with pytest.raises(LeaseLost):
        await delivery.gave_up(conn, b, 1, "AR", lease=stale)
    with pytest.raises(LeaseLost):
        await give_up(conn, head.item, attempts=1, cause="AR", outcome="AR", exhausted=False,
                      lease=stale)  # fmt: skip
    with pytest.raises(LeaseLost):
        await delivery.sender_changed(conn, DEST, "fingerprint", lease=stale)
    # the per-message statements that only check the lease (no renewal due) fence alike
    with pytest.raises(LeaseLost, match="reading the head"):
        await delivery.next_head(conn, DEST, lease=stale, renew=False)
    with pytest.raises(LeaseLost, match=f"marking id={a} delivered"):
        await delivery.succeeded_next(conn, head.item, 1, lease=stale, renew=False)
    with pytest.raises(LeaseLost, match="pulling"):
        await delivery.pull(conn, DEST, "adt", lease=stale, renew=False)
    with pytest.raises(LeaseLost, match="window"):
        await delivery.pending_window(conn, DEST, limit=8, lease=stale, renew=False)
    done = [delivery.Delivered(head.item, 1)]
    with pytest.raises(LeaseLost, match="taking"):
        await delivery.take(conn, DEST, [b], delivered=done, lease=stale, renew=False)
    assert [await _row(conn, a), await _row(conn, b)] == [("pending", 0), ("pending", 0)]
    cur = await conn.execute("SELECT count(*) FROM inturn_attempt")
    assert await cur.fetchone() == (0,)
    cur = await conn.execute("SELECT count(*) FROM inturn_worklist_item")
    assert await cur.fetchone() == (0,)
    cur = await conn.execute("SELECT count(*) FROM inturn_worker_sender")
    assert await cur.fetchone() == (0,)


async def test_the_guarded_statements_renew_the_lease(conn: AsyncConnection[Any]) -> None:
    [a] = await queue.enqueue(conn, [_item(1)])
    mine = await lease.acquire(conn, DEST, "a", 30)
    assert mine is not None
    await conn.execute("UPDATE inturn_lease SET expires_at = clock_timestamp() + interval '1 s'")
    head, _ = await delivery.next_head(conn, DEST, lease=mine)
    assert head is not None
    info = await lease.holder(conn, DEST)
    assert info is not None and info.seconds_left > 29  # renewed to its ttl
    await conn.execute("UPDATE inturn_lease SET expires_at = clock_timestamp() + interval '1 s'")
    waited, (following, wait) = await delivery.succeeded_next(conn, head.item, 1, lease=mine)
    assert waited is not None and following is None and wait is None
    info = await lease.holder(conn, DEST)
    assert info is not None and info.seconds_left > 29
    assert await _row(conn, a) == ("delivered", 1)


async def _expires_at(conn: AsyncConnection[Any]) -> Any:
    cur = await conn.execute("SELECT expires_at FROM inturn_lease WHERE destination = %s", (DEST,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def test_a_statement_that_only_checks_the_lease_writes_nothing_to_it(
    conn: AsyncConnection[Any],
) -> None:
    """Issue 43: a per-message statement whose renewal is not due reads its head and marks it
    under the same holder and epoch, leaving the lease row as it was."""
    [a, b] = await queue.enqueue(conn, [_item(1), _item(2)])
    mine = await lease.acquire(conn, DEST, "a", 30)
    assert mine is not None
    before = await _expires_at(conn)
    head, _ = await delivery.next_head(conn, DEST, lease=mine, renew=False)
    assert head is not None and head.item.id == a
    waited, (following, _) = await delivery.succeeded_next(
        conn, head.item, 1, lease=mine, renew=False
    )
    assert waited is not None and following is not None and following.item.id == b
    assert (await delivery.pull(conn, DEST, "adt", lease=mine, renew=False)).count == 0
    window = await delivery.pending_window(conn, DEST, limit=8, lease=mine, renew=False)
    assert [p.id for p in window] == [b]
    done = [delivery.Delivered(following.item, 1)]
    waited_by_id, heads = await delivery.take(
        conn, DEST, [], delivered=done, lease=mine, renew=False
    )
    assert list(waited_by_id) == [b] and heads == []
    assert await _expires_at(conn) == before  # checked, not renewed
    assert [await _row(conn, a), await _row(conn, b)] == [("delivered", 1), ("delivered", 1)]
    head, _ = await delivery.next_head(conn, DEST, lease=mine)  # renewing: moved on
    assert head is None and await _expires_at(conn) > before


async def test_a_check_of_the_lease_waits_for_a_takeover_in_progress(fresh_db: str) -> None:
    """The check holds a share lock of the lease row, as the renewal held its row lock: a
    statement that meets a takeover not yet committed waits for it, then finds the epoch
    raised and changes nothing (no send on the word of a lease already taken over)."""
    async with (
        await AsyncConnection.connect(fresh_db, autocommit=True) as worker,
        await AsyncConnection.connect(fresh_db, autocommit=True) as taker,
    ):
        [a] = await queue.enqueue(worker, [_item(1)])
        mine = await lease.acquire(worker, DEST, "a", 30)
        assert mine is not None
        head, _ = await delivery.next_head(worker, DEST, lease=mine, renew=False)
        assert head is not None and head.item.id == a
        async with taker.transaction():
            await taker.execute(
                "UPDATE inturn_lease SET epoch = epoch + 1, holder = 'b' WHERE destination = %s",
                (DEST,),
            )
            marking = asyncio.create_task(
                delivery.succeeded_next(worker, head.item, 1, lease=mine, renew=False)
            )
            await asyncio.sleep(0.3)
            assert not marking.done()  # waiting for the takeover's row lock
        with pytest.raises(LeaseLost, match=f"marking id={a} delivered"):
            await asyncio.wait_for(marking, 10)
        assert await _row(worker, a) == ("pending", 0)


async def test_an_expired_lease_nobody_took_is_renewed_by_its_holder(
    conn: AsyncConnection[Any],
) -> None:
    """Nobody else can have sent: a takeover would have raised the epoch. So the late mark of
    a paused holder is kept rather than sent again."""
    [a] = await queue.enqueue(conn, [_item(1)])
    mine = await lease.acquire(conn, DEST, "a", 0.1)
    assert mine is not None
    await asyncio.sleep(0.2)
    # a statement that only checks (no renewal) does not act on an expired lease
    with pytest.raises(LeaseLost, match="reading the head"):
        await delivery.next_head(conn, DEST, lease=mine, renew=False)
    assert await delivery.succeeded(conn, a, 1, lease=mine) is not None
    info = await lease.holder(conn, DEST)
    assert info is not None and info.epoch == 1 and info.seconds_left > 0


async def test_a_lease_covers_its_own_destination_only(conn: AsyncConnection[Any]) -> None:
    mine = await lease.acquire(conn, "hospital/rad", "a", 30)
    assert mine is not None
    with pytest.raises(ValueError, match="does not cover"):
        await delivery.next_head(conn, DEST, lease=mine)
    [a] = await queue.enqueue(conn, [_item(1)])  # hospital/lab's item
    assert await delivery.succeeded(conn, a, 1, lease=mine) is None  # not its destination's
    assert await _row(conn, a) == ("pending", 0)


def test_the_guarded_head_query_still_walks_the_pending_index(dsn: str) -> None:
    """The statements as composed (the guard fragment in place): the lease by its primary key
    (renewed, or checked only), the head and the lanes' window by the pending index."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for renew in (True, False):
            params = {
                "destination": DEST, "holder": "a", "epoch": 1, "renew": renew, "after": 0,
                "limit": 8,
            }  # fmt: skip
            for name in ("head", "pending_window"):
                rows = c.execute(f"EXPLAIN {delivery.Q[name]}", params).fetchall()  # type: ignore[call-overload]
                plan = "\n".join(r[0] for r in rows)
                assert "inturn_lease_pkey" in plan, plan
                assert "Seq Scan on inturn_delivery" not in plan, plan


async def test_every_guarded_statement_commits_synchronously(conn: AsyncConnection[Any]) -> None:
    """Whatever the session's synchronous_commit (a pooler's backend may have it off), the
    guard sets it on for the transaction: the one-lane and the lanes' statements alike."""
    [a, b] = await queue.enqueue(conn, [_item(1), _item(2)])
    mine = await lease.acquire(conn, DEST, "a", 30)
    assert mine is not None

    async def setting_after(statement: Any) -> str:
        async with conn.transaction():
            await conn.execute("SET LOCAL synchronous_commit = off")
            await statement
            cur = await conn.execute("SHOW synchronous_commit")
            row = await cur.fetchone()
        assert row is not None
        return str(row[0])

    head, _ = await delivery.next_head(conn, DEST, lease=mine)
    assert head is not None
    settings = {
        "head": await setting_after(delivery.next_head(conn, DEST, lease=mine)),
        "pending_window": await setting_after(
            delivery.pending_window(conn, DEST, limit=8, lease=mine)
        ),
        "take": await setting_after(
            delivery.take(conn, DEST, [b], delivered=[delivery.Delivered(head.item, 1)], lease=mine)
        ),
        "retry": await setting_after(delivery.retry(conn, b, 1, 60, "timeout", lease=mine)),
        "sender_changed": await setting_after(delivery.sender_changed(conn, DEST, "f", lease=mine)),
        "succeeded": await setting_after(delivery.succeeded(conn, b, 2, lease=mine)),
    }
    assert settings == dict.fromkeys(settings, "on")
    assert [await _row(conn, a), await _row(conn, b)] == [("delivered", 1), ("delivered", 2)]


# --- a holder on a direct connection: its lease records its backend (migration 0025) ----------


async def _direct_holder(dsn: str, holder: str) -> tuple[AsyncConnection[Any], Lease]:
    """A session that takes the destination's worker lock, then its lease (as the worker does)."""
    c = await AsyncConnection.connect(dsn, autocommit=True)
    assert await locks.try_component_lock(c, "worker", DEST)
    got = await lease.acquire(c, DEST, holder, 30, direct=True)
    assert got is not None
    return c, got


async def test_a_dead_direct_holders_lease_is_taken_over_at_once(fresh_db: str) -> None:
    """While the holder's session lives its lease is kept; once the session ends (a killed
    worker) a taker holding the worker lock takes over at once, the epoch raised, long before
    the 30 s lease expires."""
    a, held = await _direct_holder(fresh_db, "a")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as b:
        info = await lease.holder(b, DEST)
        pid = (await (await a.execute("SELECT pg_backend_pid()")).fetchone() or [0])[0]
        assert info is not None and info.backend_pid == pid  # the holder's backend, recorded
        assert not await locks.try_component_lock(b, "worker", DEST)  # its session holds it
        assert await lease.acquire(b, DEST, "b", 30, direct=True) is None  # live: kept
        await a.close()  # the session ends (as when the kernel closes a killed worker's socket)
        async with asyncio.timeout(10):
            while not await locks.try_component_lock(b, "worker", DEST):
                await asyncio.sleep(0.05)
        got = await lease.acquire(b, DEST, "b", 30, direct=True)
        assert got == Lease(DEST, "b", held.epoch + 1)
        info = await lease.holder(b, DEST)
        assert info is not None and info.seconds_left > 25  # taken before the old one expired
        with pytest.raises(LeaseLost):
            await lease.renew(b, held, 30)  # the dead holder's epoch matches nothing


async def test_a_pooled_holder_records_no_backend_and_waits_for_expiry(fresh_db: str) -> None:
    """A holder behind a pooler (direct=False) records no backend: its session's end lets
    nobody in early; only the expiry does."""
    a = await AsyncConnection.connect(fresh_db, autocommit=True)
    assert await lease.acquire(a, DEST, "a", 1.0) is not None
    await a.close()
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as b:
        info = await lease.holder(b, DEST)
        assert info is not None and info.backend_pid is None
        assert await locks.try_component_lock(b, "worker", DEST)
        assert await lease.acquire(b, DEST, "b", 30, direct=True) is None  # still live
        await asyncio.sleep(1.1)
        assert await lease.acquire(b, DEST, "b", 30, direct=True) == Lease(DEST, "b", 2)


async def test_a_backend_is_recorded_only_when_it_holds_the_worker_lock(
    conn: AsyncConnection[Any],
) -> None:
    """direct=True without the worker lock records nothing (its session's end would otherwise
    let a taker in while it lives), so a successor waits for the expiry."""
    assert await lease.acquire(conn, DEST, "a", 30, direct=True) is not None
    info = await lease.holder(conn, DEST)
    assert info is not None and info.backend_pid is None


async def test_a_live_direct_holder_is_kept_from_a_pooled_taker(fresh_db: str) -> None:
    """A taker behind a pooler (no worker lock) takes nothing from a live direct holder; once
    that holder's session is gone it may take over at once too."""
    a, held = await _direct_holder(fresh_db, "a")
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as b:
        assert await lease.acquire(b, DEST, "b", 30) is None
        await a.close()
        async with asyncio.timeout(10):
            while (got := await lease.acquire(b, DEST, "b", 30)) is None:
                await asyncio.sleep(0.05)
        assert got == Lease(DEST, "b", held.epoch + 1)


async def test_purge_gone_repeats_its_batches_and_refuses_bad_bounds(
    conn: AsyncConnection[Any],
) -> None:
    """Three never-registered destinations' rows expired a day ago go in batches of one; a
    live lease of one of them and the singletons' rows stay."""
    for d in ("a/one", "a/two", "a/three", "a/held"):
        assert await lease.acquire(conn, d, "w", 30) is not None
    await conn.execute(
        "UPDATE inturn_lease SET expires_at = now() - interval '1 day'"
        " WHERE destination <> 'a/held'"
    )
    await conn.execute(
        "INSERT INTO inturn_lease (destination, holder, epoch, expires_at, ttl_seconds)"
        " VALUES ('inturn:purge', 'p', 1, now() - interval '9 days', 60)"
    )
    assert await lease.purge_gone(conn, 3600, batch=1) == ["a/one", "a/three", "a/two"]
    assert await lease.purge_gone(conn, 0) == []
    cur = await conn.execute("SELECT destination FROM inturn_lease ORDER BY 1")
    assert await cur.fetchall() == [("a/held",), ("inturn:purge",)]
    with pytest.raises(Invalid):
        await lease.purge_gone(conn, -1)
    with pytest.raises(Invalid):
        await lease.purge_gone(conn, 60, batch=5001)
