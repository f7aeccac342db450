"""The identifier index: finding a message by MSH-10 or by patient without reading payloads.

Each ``inturn_delivery`` row carries, in ``patient_keys``, the index keys of the patient
identifiers its message names (:func:`inturn.worker.hl7.pid.index_keys`), written by the same
statement that stores the row (ingest's ``store``, the queue's ``enqueue_insert``); MSH-10 is the
``control_id`` column, hash-indexed. Migration 0004 adds both; rows stored before it (or by an
older ingest during a rolling upgrade) have ``patient_keys`` NULL until :func:`backfill` (run by
every ``inturn migrate``) fills them in, and :func:`find_patient` reads those few rows' payloads
so that they are found meanwhile. A message naming more identifiers than ingest indexes
(``--max-indexed-identifiers``) keeps the first ones and the ``capped`` key; lookups by patient
read the payloads of those rows too (:func:`beyond_index`), so no identifier is missed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import Invalid
from inturn.worker.hl7.pid import has_patient_id, index_keys, lookup_key
from inturn.worker.store.model import Item
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("queue.sql")

#: Rows read and indexed per backfill transaction.
BACKFILL_BATCH = 1000


def keys_text(payload: bytes) -> str:
    """The index keys of ``payload`` as one comma-separated string ('' when it names nobody).

    The form the store statements take (``string_to_array(keys, ',')``): keys are hex digits,
    so a comma never occurs inside one.
    """
    return ",".join(index_keys(payload))


def _backfill_params(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    ids: list[int] = []
    keys: list[str] = []
    for row in rows:
        ids.append(int(row["id"]))
        keys.append(keys_text(bytes(row["payload"])))
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
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["unindexed_batch"], {"after": after, "batch": batch}).fetchall()
        if not rows:
            return done
        with conn.transaction():
            written = conn.execute(Q["set_patient_keys"], _backfill_params(rows))
        done += written.rowcount
        after = int(rows[-1]["id"])


async def unindexed_count(conn: AsyncConnection[Any]) -> int:
    """How many rows are not indexed yet (0 once ``inturn migrate`` has run on a current ingest)."""
    row = await fetch_one(conn, Q["unindexed_count"], row=dict_row)
    return int(row["unindexed"]) if row else 0


def lookup_text(
    ident: str, authority: str | None = None, payloads: PayloadCodec | None = None
) -> str:
    """The ``patient_key`` parameter of the listings and :func:`find_patient`: every stored
    form of the identifier's index key, comma-separated (with payload keys, the blind one and
    the plain one of rows indexed before the keys were given)."""
    if payloads is None:
        return lookup_key(ident, authority)
    return ",".join(payloads.lookup_keys(ident, authority))


async def _read_matches(
    conn: AsyncConnection[Any],
    query: str,
    params: dict[str, Any],
    ident: str,
    authority: str | None,
    codec: PayloadCodec,
    batch: int,
) -> list[Item]:
    """The rows of ``query`` (keyset pages of ``batch``, with their payload) whose opened
    payload names ``ident`` (``authority``), oldest first."""
    found: list[Item] = []
    after = 0
    while True:
        rows = await fetch_all(
            conn, query, {**params, "after": after, "batch": batch}, row=dict_row
        )
        for r in rows:
            plain = await codec.open(int(r["seal_id"]), str(r["seal_scope"]), bytes(r["payload"]))
            if has_patient_id(plain, ident, authority):
                found.append(Item.from_row(r))
        if len(rows) < batch:
            return found
        after = int(rows[-1]["id"])


async def beyond_index(
    conn: AsyncConnection[Any],
    ident: str,
    authority: str | None = None,
    *,
    batch: int = 500,
    payloads: PayloadCodec | None = None,
    unindexed: bool = True,
) -> list[Item]:
    """The held items naming ``ident`` (``authority``) that the identifier index cannot find:
    rows whose message named more identifiers than ingest indexed (``--max-indexed-identifiers``;
    the :data:`~inturn.worker.hl7.pid.CAPPED_KEY` among their keys, found by the same GIN
    index) and whose indexed keys miss it, and with ``unindexed`` the rows not indexed yet.
    Only those rows' payloads are read (opened with ``payloads``), ``batch`` at a time, and
    matched with :func:`inturn.worker.hl7.pid.has_patient_id` (no cap). Oldest first.

    Raises:
        PayloadKeysMissing: such a row is an envelope and ``payloads`` has no keys.
    """
    codec = payloads or PayloadCodec()
    key = {"key": lookup_text(ident, authority, payloads)}
    found = await _read_matches(conn, Q["capped_batch"], key, ident, authority, codec, batch)
    if unindexed:
        found += await _read_matches(conn, Q["unindexed_batch"], {}, ident, authority, codec, batch)
    return sorted(found, key=lambda i: i.id)


async def find_patient(
    conn: AsyncConnection[Any],
    ident: str,
    authority: str | None = None,
    *,
    batch: int = 500,
    payloads: PayloadCodec | None = None,
) -> list[Item]:
    """Every held item whose message names ``ident`` (assigned by ``authority``, when given) in
    PID-2, PID-3, PID-4 or MRG-1, oldest first, without payloads.

    Indexed rows are found by their key (one GIN probe, every stored form of it); the rows the
    index cannot answer for (:func:`beyond_index`: identifiers cut at ingest's cap, rows not
    indexed yet) are read, opened with ``payloads`` and matched, ``batch`` at a time.

    Raises:
        Invalid: ``ident`` is empty.
        PayloadKeysMissing: such a row is an envelope and ``payloads`` has no keys.
    """
    if not ident.strip():
        raise Invalid("the patient ID is empty")
    key = {"key": lookup_text(ident, authority, payloads)}
    found = {i.id: i for i in await fetch_all(conn, Q["find_patient"], key, row=class_row(Item))}
    for item in await beyond_index(conn, ident, authority, batch=batch, payloads=payloads):
        found[item.id] = item
    return [found[i] for i in sorted(found)]


async def scan_estimate(conn: AsyncConnection[Any]) -> tuple[int, int]:
    """What a payload scan would read, from the planner's statistics: (rows, bytes)."""
    row = await fetch_one(conn, Q["scan_estimate"], row=dict_row)
    return (int(row["rows"]), int(row["bytes"])) if row else (0, 0)
