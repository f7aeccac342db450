"""Building the payload codec a process runs with, from its options (issue 31).

Every process that stores or reads payloads (ingest, the worker, the console, ``inturn queue
payload``, erasure, ``inturn local``) takes ``--payload-keys DIR`` (``INTURN_PAYLOAD_KEYS``)
and ``--key-dsn`` (``INTURN_KEY_DSN``); without them it stores plaintext and refuses every
envelope it meets with one line naming ``--payload-keys``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.crypto.cache import DEFAULT_CACHE_KEYS
from inturn.worker.crypto.codec import INDEX_ROTATION_SETTLED, PayloadCodec
from inturn.worker.crypto.errors import MasterKeyError, PayloadErased
from inturn.worker.errors import Conflict
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.store import audit, sealing
from inturn.worker.store.keystore import PgKeyStore

#: The environment variables of the two options.
PAYLOAD_KEYS_ENV = "INTURN_PAYLOAD_KEYS"
KEY_DSN_ENV = "INTURN_KEY_DSN"


async def open_codec(
    payload_keys: str | None,
    key_dsn: str | None,
    *,
    cache_keys: int = DEFAULT_CACHE_KEYS,
    max_identifiers: int = MAX_INDEXED_IDENTIFIERS,
    dual_index: bool = False,
    application_name: str = "inturn-keys",
    release_after: float | None = None,
) -> PayloadCodec:
    """The codec of ``--payload-keys`` and ``--key-dsn``: plaintext without keys, started
    (blind index key derived and checked) with them. ``release_after``: as
    :class:`PgKeyStore`'s (a long-running process that closes the codec at its end).

    Raises:
        MasterKeyError: keys without a key store, a key store without keys, a folder that is
            not one of keys, or keys that differ from the key store's.
        psycopg.Error: the key store cannot be reached or has no schema.
    """
    if not payload_keys:
        if key_dsn:
            raise MasterKeyError("--key-dsn is given without --payload-keys (the master keys)")
        return PayloadCodec(max_identifiers=max_identifiers)
    if not key_dsn:
        raise MasterKeyError(
            "--payload-keys needs --key-dsn (INTURN_KEY_DSN): the key store's database"
        )
    from inturn.worker.crypto.masterkeys import FileKeyProvider  # cryptography: only with keys

    codec = PayloadCodec(
        FileKeyProvider(payload_keys),
        PgKeyStore(key_dsn, application_name=application_name, release_after=release_after),
        cache_keys=cache_keys,
        max_identifiers=max_identifiers,
        dual_index=dual_index,
    )
    await codec.start()
    return codec


async def close_codec(codec: PayloadCodec) -> None:
    """Close the codec's key store connection, if it has one."""
    if isinstance(codec.store, PgKeyStore):
        await codec.store.close()


@dataclass(frozen=True)
class Sealed:
    """What ``inturn keys encrypt-existing`` did.

    Attributes:
        sealed: rows whose payload it encrypted (clear before), and messages of the channel
            log (each sealed once, whatever the number of its destinations).
        rekeyed: sealed rows whose plain index forms it dropped (the second pass).
        pending_in_clear: whether a pending row in clear remained at the end (ingest or a
            worker without keys still writing): run it again once every process has keys.
    """

    sealed: int
    rekeyed: int
    pending_in_clear: bool


async def encrypt_existing(
    conn: AsyncConnection[Any],
    codec: PayloadCodec,
    *,
    batch: int = 500,
    progress: Callable[[str], None] = lambda _: None,
    settle_seconds: float = sealing.INDEX_FORM_EVERY_SECONDS + 1,
) -> Sealed:
    """Seal every row stored in clear, ``batch`` rows per transaction, while ingest and the
    workers run; then drop the plain index forms once no pending row is in clear.

    Pass 1 reads rows in clear by id and stores each as the envelope sealed for its row ID
    and destination, with the blind index keys *and* the plain ones: a pending row sealed here
    still shares its keys with pending rows of the same patient not sealed yet (lanes compare
    keys; they must never see one patient under disjoint keys). Every reader opens both forms,
    so a message is readable throughout. Pass 2, only when no pending row is left in clear
    (then ingest, which watches for that, writes the blind form alone), rewrites the keys of
    sealed rows to the blind form alone, and keeps sweeping the rows stored since until
    ``settle_seconds`` have passed (ingest notices within
    :data:`~inturn.worker.store.sealing.INDEX_FORM_EVERY_SECONDS` that it may write the blind
    form alone) and a sweep changed nothing. Resumable: a run stopped anywhere is finished by the
    next (a row sealed is never sealed again; pass 2 is idempotent).

    Raises:
        MasterKeyError: ``codec`` has no keys.
        psycopg.Error: the batch in progress is rolled back; earlier ones stay done.
    """
    if not codec.enabled:
        raise MasterKeyError("encrypt-existing needs --payload-keys and --key-dsn")
    await sealing.mark_in_use(conn)  # before the first row is sealed: lookups need the keys
    plain = PayloadCodec(max_identifiers=codec.max_identifiers)
    sealed, after = 0, 0
    while True:
        rows = await sealing.plaintext_batch(conn, after=after, limit=batch)
        if not rows:
            break
        # the keys stay live in the key store until the rows commit (an erasure waits)
        async with codec.sealing():
            envelopes = await codec.seal_many(rows)
            keys = [
                ",".join(sorted({*codec.index_keys(p), *plain.index_keys(p)})) for _, _, p in rows
            ]
            async with conn.transaction():
                sealed += await sealing.seal_rows(
                    conn, [(r[0], e, k) for r, e, k in zip(rows, envelopes, keys, strict=True)]
                )
        after = rows[-1][0]
        progress(f"sealed {sealed} row(s), up to id {after}")
    sealed += await _seal_log(conn, codec, plain, batch=batch, progress=progress)
    if await sealing.plaintext_pending(conn):
        progress("pending rows in clear remain (a process without keys?): run it again later")
        return Sealed(sealed, 0, True)
    rekeyed, after = 0, 0
    codec.dual_index = False
    settled = time.monotonic() + settle_seconds
    changed_in_sweep = False
    while True:
        found = await sealing.sealed_batch(conn, after=after, limit=batch)
        if not found:
            # the channel log too, in every sweep: ingest may still write both forms meanwhile
            in_log = await _blind_log_keys(conn, codec, batch=batch)
            rekeyed += in_log
            changed_in_sweep = changed_in_sweep or in_log > 0
            if time.monotonic() >= settled and not changed_in_sweep:
                break
            changed_in_sweep = False
            await asyncio.sleep(min(1.0, settle_seconds))
            continue
        changes = []
        for item_id, destination, stored, keys_now in found:
            blind = ",".join(codec.index_keys(await codec.open(item_id, destination, stored)))
            if blind != keys_now:
                changes.append((item_id, blind))
        if changes:
            changed_in_sweep = True
            async with conn.transaction():
                rekeyed += await sealing.set_keys(conn, changes)
        after = found[-1][0]
    progress(f"index keys of {rekeyed} sealed row(s) now in the blind form alone")
    return Sealed(sealed, rekeyed, False)


async def _seal_log(
    conn: AsyncConnection[Any],
    codec: PayloadCodec,
    plain: PayloadCodec,
    *,
    batch: int,
    progress: Callable[[str], None],
) -> int:
    """encrypt_existing's first pass over the channel log (issue 43): each message in clear
    sealed once, bound to its log id and ``channel:<name>``, whatever the number of
    destinations that read it, with both index forms; then the slim rows take their log row's
    keys. Returns the messages sealed."""
    sealed, after = 0, 0
    while True:
        rows = await sealing.plaintext_log_batch(conn, after=after, limit=batch)
        if not rows:
            break
        async with codec.sealing():
            envelopes = await codec.seal_many(rows)
            keys = [
                ",".join(sorted({*codec.index_keys(p), *plain.index_keys(p)})) for _, _, p in rows
            ]
            async with conn.transaction():
                sealed += await sealing.seal_log_rows(
                    conn, [(r[0], e, k) for r, e, k in zip(rows, envelopes, keys, strict=True)]
                )
                await sealing.copy_slim_keys(conn)
        after = rows[-1][0]
        progress(f"sealed {sealed} message(s) of the channel log, up to log id {after}")
    return sealed


async def _blind_log_keys(conn: AsyncConnection[Any], codec: PayloadCodec, *, batch: int) -> int:
    """encrypt_existing's second pass over the channel log: each sealed message's index keys
    in the blind form alone (``codec.dual_index`` is off by then), the slim rows taking them.
    Returns the messages whose keys changed."""
    changed, after = 0, 0
    while True:
        found = await sealing.index_batch(conn, "message", after=after, limit=batch)
        if not found:
            return changed
        changes = []
        for log_id, seal_id, scope, stored, keys_now in found:
            blind = ",".join(codec.index_keys(await codec.open(seal_id, scope, stored)))
            if blind != keys_now:
                changes.append((log_id, blind))
        async with conn.transaction():
            changed += await sealing.set_table_keys(conn, "message", changes)
            await sealing.copy_slim_keys(conn)
        after = found[-1][0]


@dataclass(frozen=True)
class IndexRotation:
    """What ``inturn keys rotate-index`` did.

    Attributes:
        generation: the current blind index key's generation.
        rows: row index keys rewritten (both passes, every table, slim rows included).
        keys: patient keys whose erasure lookups were recomputed.
        unreached: patient keys made before the rotation that no stored message names any
            more: only the previous index key finds them for an erasure.
        open_orders: order replies still awaited that were recorded under the previous key.
        finished: the previous index key was destroyed (nothing needs it any more).
    """

    generation: int
    rows: int
    keys: int
    unreached: int
    open_orders: int
    finished: bool


async def _reindex(
    conn: AsyncConnection[Any],
    codec: PayloadCodec,
    *,
    batch: int,
    progress: Callable[[str], None],
) -> tuple[int, int]:
    """One pass over every sealed row (hot table, history, channel log, then the slim rows):
    each row's index keys as the codec computes them now, and the erasure lookups of every
    patient key a message names; ``(rows changed, keys recomputed)``."""
    assert codec.store is not None
    rows_changed = keys_changed = 0
    done: set[bytes] = set()
    for table in sealing.INDEXED_TABLES:
        after = 0
        while True:
            found = await sealing.index_batch(conn, table, after=after, limit=batch)
            if not found:
                break
            changes: list[tuple[int, str]] = []
            for row_id, seal_id, scope, stored, keys_now in found:
                try:
                    plaintext = await codec.open(seal_id, scope, stored)
                except PayloadErased:
                    continue  # its patient was erased: nothing left to find
                keys = ",".join(codec.index_keys(plaintext))
                if keys != keys_now:
                    changes.append((row_id, keys))
                for ref, lookups in codec.reindexed_keys(plaintext, stored).items():
                    if ref not in done:
                        done.add(ref)
                        keys_changed += await codec.store.set_lookups(
                            ref, lookups, codec.generation
                        )
            if changes:
                async with conn.transaction():
                    rows_changed += await sealing.set_table_keys(conn, table, changes)
            after = found[-1][0]
        progress(f"{table}: index keys of {rows_changed} row(s) rewritten so far")
    async with conn.transaction():
        rows_changed += await sealing.copy_slim_keys(conn)
    return rows_changed, keys_changed


async def rotate_index(
    conn: AsyncConnection[Any],
    codec: PayloadCodec,
    *,
    actor: str,
    batch: int = 500,
    progress: Callable[[str], None] = lambda _: None,
    settle_seconds: float = sealing.INDEX_FORM_EVERY_SECONDS + 1,
) -> IndexRotation:
    """Rotate the blind index key while ingest and the workers run (``inturn keys
    rotate-index``; docs/howto/encryption.md, "Rotating the blind index key").

    1. A new random index key becomes the current one (wrapped under the newest master key) and
       the old one the previous one; phase ``dual``: every process takes the new key within
       ``settle_seconds`` (their periodic key store check) and writes both forms of each
       patient's index key, so that one patient's pending rows always share a key (lanes).
    2. Every sealed row is opened and its index keys rewritten with both forms, and every
       patient key a stored message names gets its erasure lookups in both forms; phase
       ``single``: new rows get the current form alone.
    3. Once every process writes the current form alone, a second pass leaves the current form
       alone in every row and key; phase ``retired``.
    4. The previous index key is destroyed when nothing needs it: no patient key made before
       the rotation that no stored message names (only the previous key finds it for an
       erasure), no awaited order reply recorded under it. Otherwise it is kept, for those
       lookups only, and a later run destroys it once they are gone.

    Lookups by patient, erasure and reply matching search both forms throughout. Resumable: a
    run stopped anywhere is finished by the next one (the phase is kept in the key store, each
    pass is idempotent). Audited in the queue database (``index-rotated``, counts only).

    Raises:
        MasterKeyError: ``codec`` has no keys.
        Conflict: pending rows are still in clear (run ``inturn keys encrypt-existing``).
        psycopg.Error: the batch in progress is rolled back; what is done stays done.
    """
    if not codec.enabled or codec.store is None:
        raise MasterKeyError("rotate-index needs --payload-keys and --key-dsn")
    if await sealing.plaintext_pending(conn):
        raise Conflict("pending rows are still in clear: run `inturn keys encrypt-existing` first")
    rows = keys = 0
    if not codec.rotation:
        await codec.begin_index_rotation()
        progress(f"blind index key generation {codec.generation}: both forms written from now")
    if codec.rotation == "dual":
        await asyncio.sleep(settle_seconds)  # every process takes the new key meanwhile
        await codec.store.setting(
            INDEX_ROTATION_SETTLED, datetime.now(UTC).isoformat(timespec="microseconds")
        )
        r, k = await _reindex(conn, codec, batch=batch, progress=progress)
        rows, keys = rows + r, keys + k
        await codec.set_rotation_phase("single")
        progress("every row and key holds both forms: the new form alone from now")
    if codec.rotation == "single":
        await asyncio.sleep(settle_seconds)
        r, k = await _reindex(conn, codec, batch=batch, progress=progress)
        rows, keys = rows + r, keys + k
        await codec.set_rotation_phase("retired")
    settled = await codec.store.setting(
        INDEX_ROTATION_SETTLED, datetime.now(UTC).isoformat(timespec="microseconds")
    )
    unreached = await codec.store.unreached(settled, codec.generation)
    open_orders = await sealing.open_orders_before(conn, settled)
    finished = unreached == 0 and open_orders == 0
    if finished:
        await codec.end_index_rotation()
        progress("the previous blind index key is destroyed")
    else:
        progress(
            f"the previous blind index key is kept, only to find {unreached} patient key(s) no"
            f" stored message names and {open_orders} awaited order reply(ies): run it again"
            " once those are gone"
        )
    async with conn.transaction():
        await audit.record(
            conn,
            who=actor,
            action="index-rotated" if finished else "index-rotation-kept",
            why=(
                f"generation {codec.generation}: {rows} row(s), {keys} key(s) re-indexed;"
                f" {unreached} unreached key(s), {open_orders} open order(s)"
            ),
        )
    return IndexRotation(codec.generation, rows, keys, unreached, open_orders, finished)
