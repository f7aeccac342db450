"""Putting items on the delivery queue, for ingest and every other enqueuer (the resend, the
sweeper's notices through their SQL function, the tests and benches that fill a queue):
:func:`enqueue` and the pieces of it that ingest's store statement runs inside its own
transaction (:func:`lock_for_enqueue`, :func:`draw_ids`, :func:`enqueue_in_transaction`).

Every function takes an open ``psycopg.AsyncConnection`` in autocommit mode. Destinations are
identified as ``namespace/name``; every statement is a named query of ``sql/queue.sql``. The
worker's statements (the head, its marks, the lanes' window) are
:mod:`inturn.worker.store.delivery`; people's actions :mod:`inturn.worker.store.actions`;
listings and reads :mod:`inturn.worker.store.reads`.

Enqueues for one destination are serialised until COMMIT by a transaction-level advisory lock
(taken in sorted order for fan-out), so identity order equals commit order: the order the
worker delivers in (:func:`enqueue`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.hl7.pid import index_keys
from inturn.worker.store.model import NewItem
from inturn.worker.store.notify import wake
from inturn.worker.store.queries import fetch_all, fetch_one, load
from inturn.worker.store.sealing import mark_in_use

Q = load("queue.sql")


async def lock_for_enqueue(conn: AsyncConnection[Any], destinations: Iterable[str]) -> None:
    """Take each destination's enqueue lock (transaction level, held until COMMIT), in sorted
    order so that two fan-outs never deadlock: enqueues for one destination then commit in
    the order of their ids."""
    for destination in sorted(set(destinations)):
        await conn.execute(Q["enqueue_lock"], {"destination": destination})


async def draw_ids(conn: AsyncConnection[Any], n: int) -> list[int]:
    """``n`` new row IDs of ``inturn_delivery``, increasing. Call it after taking the
    destinations' enqueue locks (:func:`lock_for_enqueue`), so that ID order stays commit
    order."""
    rows = await fetch_all(conn, Q["draw_ids"], {"n": n}, row=dict_row)
    return [int(r["id"]) for r in rows]


async def enqueue_in_transaction(
    conn: AsyncConnection[Any], items: Sequence[NewItem], payloads: PayloadCodec | None = None
) -> list[int]:
    """Insert ``items`` inside the caller's open transaction; return their ids in input order.

    Takes each touched destination's enqueue lock in sorted order (no deadlock between two
    fan-outs), inserts (each row with its identifier index keys, see
    :mod:`inturn.worker.store.identifiers`), and queues one NOTIFY per destination, delivered at
    COMMIT. The caller
    commits, and must only acknowledge the sender after its COMMIT has returned.

    With ``payloads`` that seal (payload keys given), the row IDs are drawn first
    (:func:`draw_ids`, under the locks) and each payload is stored as the envelope the codec
    makes for its row; its index keys are the codec's (blind). The store hands the codec
    plaintext and row IDs and stores what it returns: it never holds a key.
    """
    destinations = sorted({item.destination for item in items})
    await lock_for_enqueue(conn, destinations)
    sealing = payloads is not None and payloads.enabled
    stored = [item.payload for item in items]
    drawn: list[int] = []
    if sealing:
        assert payloads is not None
        await mark_in_use(conn)  # lookups by patient without the keys refuse from now on
        drawn = await draw_ids(conn, len(items))
        stored = await payloads.seal_many(
            [(i, item.destination, item.payload) for i, item in zip(drawn, items, strict=True)]
        )
    ids: list[int] = []
    async with conn.cursor(row_factory=dict_row) as cur:
        for n, item in enumerate(items):
            params = {
                "destination": item.destination,
                "channel": item.channel,
                "control_id": item.control_id,
                "message_type": item.message_type,
                "payload": stored[n],
                "size": len(item.payload),
                "patient_keys": (
                    payloads.index_keys(item.payload) if payloads else index_keys(item.payload)
                ),
            }
            if sealing:
                params["id"] = drawn[n]
            await cur.execute(Q["enqueue_insert_with_id" if sealing else "enqueue_insert"], params)
            row = await cur.fetchone()
            assert row is not None
            ids.append(int(row["id"]))
    await wake(conn, destinations)
    return ids


async def enqueue(
    conn: AsyncConnection[Any], items: Sequence[NewItem], payloads: PayloadCodec | None = None
) -> list[int]:
    """Store ``items`` durably in one transaction and return their ids, after COMMIT.

    ``synchronous_commit`` is forced on for the transaction: when this returns, the rows survive
    a database crash, so the caller may answer AA.

    Raises:
        psycopg.Error: nothing was stored.
    """
    if not items:
        return []
    # with payload keys, the keys sealed under stay live until the COMMIT (PayloadCodec.sealing)
    scope = payloads.sealing() if payloads is not None else contextlib.nullcontext()
    async with scope, conn.transaction():
        await conn.execute(Q["synchronous_commit"])
        return await enqueue_in_transaction(conn, items, payloads)


async def blocked(conn: AsyncConnection[Any], destination: str) -> bool:
    """Whether anything is pending for ``destination``, due or not (an item backing off counts)."""
    row = await fetch_one(conn, Q["blocked"], {"destination": destination}, row=dict_row)
    return bool(row and row["blocked"])
