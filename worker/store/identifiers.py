"""The identifier index: finding a message by MSH-10 or by patient without reading payloads.

Each ``inturn_delivery`` row carries, in ``patient_keys``, the index keys of the patient
identifiers its message names (:func:`inturn.worker.hl7.pid.index_keys`), written by the same
statement that stores the row (ingest's ``store``, the queue's ``enqueue_insert``); MSH-10 is the
``control_id`` column, hash-indexed. Migration 0004 adds both; rows stored before it (or by an
older ingest during a rolling upgrade) have ``patient_keys`` NULL until :func:`backfill` (run by
every ``inturn migrate``) fills them in, and :func:`find_patient` reads those few rows' payloads
so that they are found meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection

from inturn.worker.hl7.pid import has_patient_id, index_keys, lookup_key
from inturn.worker.store.model import Item
from inturn.worker.store.queries import load

Q = load("queue.sql")

#: Rows read and indexed per backfill transaction.
BACKFILL_BATCH = 1000

_ITEM_COLUMNS = 15


def keys_text(payload: bytes) -> str:
    """The index keys of ``payload`` as one comma-separated string ('' when it names nobody).

    The form the store statements take (``string_to_array(keys, ',')``): keys are hex digits,
    so a comma never occurs inside one.
    """
    return ",".join(index_keys(payload))


def _backfill_params(rows: Iterable[Sequence[Any]]) -> dict[str, list[Any]]:
    ids: list[int] = []
    keys: list[str] = []
    for row in rows:
        ids.append(int(row[0]))
        keys.append(keys_text(bytes(row[_ITEM_COLUMNS])))
    return {"ids": ids, "keys": keys}


def backfill(conn: psycopg.Connection[Any], *, batch: int = BACKFILL_BATCH) -> int:
    """Index every row whose ``patient_keys`` is still NULL, ``batch`` rows per transaction.

    Args:
        conn: an autocommit connection.

    Returns:
        The number of rows indexed.

    Raises:
        psycopg.Error: the batch in progress is rolled back; batches before it stay indexed.
    """
    done = 0
    after = 0
    while True:
        rows = conn.execute(Q["unindexed_batch"], {"after": after, "batch": batch}).fetchall()
        if not rows:
            return done
        with conn.transaction():
            cur = conn.execute(Q["set_patient_keys"], _backfill_params(rows))
        done += cur.rowcount
        after = int(rows[-1][0])


async def unindexed_count(conn: AsyncConnection[Any]) -> int:
    """How many rows are not indexed yet (0 once ``inturn migrate`` has run on a current ingest)."""
    cur = await conn.execute(Q["unindexed_count"])
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def find_patient(
    conn: AsyncConnection[Any],
    ident: str,
    authority: str | None = None,
    *,
    batch: int = 500,
) -> list[Item]:
    """Every held item whose message names ``ident`` (assigned by ``authority``, when given) in
    PID-2, PID-3, PID-4 or MRG-1, oldest first, without payloads.

    Indexed rows are found by their key (one GIN probe); rows not indexed yet are read and
    matched with :func:`inturn.worker.hl7.pid.has_patient_id`, ``batch`` at a time.

    Raises:
        ValueError: ``ident`` is empty.
    """
    if not ident.strip():
        raise ValueError("the patient ID is empty")
    cur = await conn.execute(Q["find_patient"], {"key": lookup_key(ident, authority)})
    found = {int(r[0]): Item(*r[:_ITEM_COLUMNS]) for r in await cur.fetchall()}
    after = 0
    while True:
        cur = await conn.execute(Q["unindexed_batch"], {"after": after, "batch": batch})
        rows = await cur.fetchall()
        for r in rows:
            if has_patient_id(bytes(r[_ITEM_COLUMNS]), ident, authority):
                found[int(r[0])] = Item(*r[:_ITEM_COLUMNS])
        if len(rows) < batch:
            break
        after = int(rows[-1][0])
    return [found[i] for i in sorted(found)]


async def scan_estimate(conn: AsyncConnection[Any]) -> tuple[int, int]:
    """What a payload scan would read, from the planner's statistics: (rows, bytes)."""
    cur = await conn.execute(Q["scan_estimate"])
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)
