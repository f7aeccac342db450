"""The key store in Postgres: a second database, apart from the queue's (``--key-dsn``).

Why apart: a key kept in the queue's database comes back with every restored backup of it, and
erasure by key destruction would then reach nothing. This database is small (one row of about
150 bytes per patient identifier and destination), is backed up on its own with a retention
shorter than the erasure deadline, and is reached with its own role. It holds wrapped keys only
(:class:`inturn.worker.crypto.keystore.StoredKey`); unwrapping is the codec's.

:class:`PgKeyStore` keeps one connection (a worker has no pool), opened on first use, replaced
once when a call finds it broken; calls are serialised on it, which is fine because the codec
calls it only on a cache miss. A seal's hold (:meth:`PgKeyStore.hold`, one per batch ingest
stores) runs on a connection of its own, in a transaction that lasts until after the batch's
queue COMMIT; those connections are kept for reuse, at most :data:`IDLE_HOLDS` idle (as many run at
once as the caller stores batches at once: ingest's pool bounds it). Statements are in
``sql/keystore.sql``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, LiteralString

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from inturn.worker.crypto.keystore import NewKey, StoredKey
from inturn.worker.store.connect import session_kwargs
from inturn.worker.store.faults import KeyStoreUnavailable
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("keystore.sql")
IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS
#: A hold's lock: the first of a hold begins its transaction in the same simple query.
LOCK: LiteralString = Q["lock"]
LOCK_FIRST: LiteralString = "BEGIN;\n" + LOCK
#: ... and releases the hold before on its connection first (:meth:`PgKeyStore.hold`).
LOCK_AFTER: LiteralString = "COMMIT;\nBEGIN;\n" + LOCK
#: Most seconds a finished hold's locks stay on an idle connection before they are released
#: by a COMMIT of their own; the next hold on it releases them sooner, in its first lock.
HOLD_RELEASE_SECONDS = 0.05

#: The key store's environment variable (``--key-dsn``).
KEY_DSN_ENV = "INTURN_KEY_DSN"
#: Most idle connections kept for seals' holds (more are opened while more batches seal at once).
IDLE_HOLDS = 4
#: Most milliseconds a hold's ``lock`` waits for a key another session locks (an erasure's
#: DELETE, a rotation's re-wrap): past it the seal fails (KeyStoreUnavailable, ingest answers
#: AE) rather than wait. It bounds the one wait cycle the two databases can make and neither
#: sees: batch A holds a key and waits for a destination's enqueue lock, which batch B holds
#: while its ``lock`` of that key queues behind an erasure's DELETE that waits for A.
HOLD_LOCK_TIMEOUT_MS = 2000


def create_schema(dsn: str) -> None:
    """Make the key store's tables at ``dsn`` (idempotent; ``inturn migrate --key-dsn``).

    Raises:
        psycopg.Error: the database cannot be reached or the role may not create tables.
    """
    with psycopg.connect(dsn, autocommit=True, **session_kwargs(dsn, writes=True)) as conn:
        conn.execute(Q["schema"].encode())


def ensure_database(server_dsn: str, name: str) -> str:
    """The DSN of database ``name`` on ``server_dsn``'s server, made when missing (``inturn
    local --encrypt``'s key store in its embedded server).

    Raises:
        psycopg.Error: unreachable, or the role may not create databases.
    """
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        if conn.execute(Q["database_exists"], {"name": name}).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(server_dsn, dbname=name)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _stored(row: Mapping[str, Any]) -> StoredKey:
    return StoredKey(bytes(row["ref"]), str(row["master_id"]), bytes(row["wrapped"]))


class _PgHold:
    """One seal's hold: a transaction on its own connection (:meth:`PgKeyStore.hold`)."""

    def __init__(self, owner: PgKeyStore, conn: AsyncConnection[Any]) -> None:
        self.owner = owner
        self.conn = conn
        self.begun = False

    async def lock(self, refs: Sequence[bytes]) -> Mapping[bytes, StoredKey]:
        params = {"refs": list(refs), "ms": HOLD_LOCK_TIMEOUT_MS}
        if self.begun:
            query, skip = LOCK, 0
        elif self.conn.info.transaction_status == IDLE:
            query, skip = LOCK_FIRST, 1
        else:  # the hold before on this connection, still to release (PgKeyStore.hold)
            query, skip = LOCK_AFTER, 2
        try:
            self.owner.round_trips += 1
            # One simple query, its values bound here, with what the transaction needs in
            # front of the hold's first lock (BEGIN; COMMIT of the hold before): one round
            # trip, and about half the client's CPU of the extended protocol's pipeline
            # (issue 43). Its values are bytes and an int: nothing quoted from outside.
            async with AsyncClientCursor(self.conn, row_factory=dict_row) as cur:
                await cur.execute(query, params)
                self.begun = True
                for _ in range(skip):
                    cur.nextset()  # past COMMIT's and BEGIN's empty results
                rows = await cur.fetchall()
        except psycopg.errors.LockNotAvailable as exc:  # reachable: not a failing key store
            raise KeyStoreUnavailable(
                f"key store: a key stayed locked past {HOLD_LOCK_TIMEOUT_MS} ms (an erasure"
                " or a rotation in progress); nothing was stored"
            ) from exc
        except psycopg.OperationalError as exc:
            raise self.owner._failed(exc) from exc
        self.owner.failing_since = None
        return {k.ref: k for k in map(_stored, rows)}


class PgKeyStore:
    """The :class:`~inturn.worker.crypto.keystore.KeyStore` on a Postgres database.

    Args:
        dsn: the key store's DSN (not the queue's).
        application_name: as Postgres shows the session.
        release_after: None (the default): a hold's block commits its transaction as it
            ends. Seconds (ingest: :data:`HOLD_RELEASE_SECONDS`): the block leaves it to the
            next hold on its connection, or to :meth:`release` after that long idle; for a
            process that calls :meth:`close` at its end (see :meth:`hold`).
    """

    def __init__(
        self,
        dsn: str,
        *,
        application_name: str = "inturn-keys",
        release_after: float | None = None,
    ) -> None:
        self.dsn = dsn
        self.release_after = release_after
        self.application_name = application_name
        self._conn: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._idle: list[AsyncConnection[Any]] = []
        self._release: asyncio.Task[None] | None = None
        self.round_trips = 0
        #: Since when (``time.monotonic()``) every call failed, and the last failure's line;
        #: None once a call succeeds (:meth:`health`).
        self.failing_since: float | None = None
        self.failure = ""

    async def _connection(self) -> AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                application_name=self.application_name,
                **session_kwargs(self.dsn, writes=True),
            )
        return self._conn

    async def _rows(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run one statement, once more on a fresh connection if the first one is broken.

        Raises:
            KeyStoreUnavailable: the key store could not be reached (or connected to) twice.
            psycopg.Error: the statement itself failed (a missing schema, a refused grant).
        """
        async with self._lock:
            for attempt in (1, 2):
                conn: AsyncConnection[Any] | None = None
                try:
                    conn = await self._connection()
                    self.round_trips += 1
                    rows = await fetch_all(conn, Q[name], params, row=dict_row)
                except psycopg.OperationalError as exc:
                    if conn is not None:
                        await conn.close()
                    if attempt == 2:
                        raise self._failed(exc) from exc
                else:
                    self.failing_since = None
                    return rows
        raise AssertionError("unreachable")  # pragma: no cover

    def _failed(self, exc: BaseException) -> KeyStoreUnavailable:
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.failure = f"{type(exc).__name__}: {_first_line(exc)}"
        return KeyStoreUnavailable(f"key store unreachable (--key-dsn): {self.failure}")

    def health(self) -> str | None:
        """None while the key store answers, else a one-line reason with how long every call
        has failed (ingest's ``/readyz``)."""
        if self.failing_since is None:
            return None
        age = time.monotonic() - self.failing_since
        return f"key store unreachable for {age:.0f} s (--key-dsn): {self.failure}"

    async def ping(self) -> None:
        """One round trip (``SELECT 1``): clears :meth:`health` when the key store is back.

        Raises:
            KeyStoreUnavailable: still unreachable.
        """
        await self._rows("ping", {})

    async def close(self) -> None:
        """Close the connections (opened again on next use)."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        if self._release is not None and not self._release.done():
            self._release.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._release
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()  # releases a finished hold's locks too

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[_PgHold]:
        """A transaction on a connection of its own whose ``lock`` takes FOR SHARE row locks on
        keys: the :meth:`erase` statement's DELETE of one of them waits until the block has
        ended (its caller's queue COMMIT is done). A block that raises rolls it back; one
        that ends normally commits it (one round trip besides the locks'), or, with
        ``release_after``, leaves it to release (it wrote nothing): the next hold on the
        connection commits it in front of its first lock, in the same round trip, or
        :meth:`release` does after ``release_after`` seconds idle. A hold then costs one round
        trip, its lock, and no COMMIT in its caller's way (issue 43); an erasure waits that
        much longer at most.

        Raises:
            KeyStoreUnavailable: the key store could not be reached.
        """
        conn = self._idle.pop() if self._idle else None
        try:
            if conn is None or conn.closed:
                conn = await AsyncConnection.connect(  # autocommit: the lock sends its BEGIN
                    self.dsn,
                    autocommit=True,
                    application_name=self.application_name,
                    **session_kwargs(self.dsn, writes=True),
                )
        except psycopg.OperationalError as exc:
            raise self._failed(exc) from exc
        kept = False
        try:
            yield _PgHold(self, conn)
            if self.release_after is None:
                try:
                    await conn.commit()
                except psycopg.OperationalError as exc:
                    raise self._failed(exc) from exc
            kept = True
        finally:
            if not kept and not conn.closed:
                try:
                    await conn.rollback()  # ends the hold before too: it wrote nothing either
                except psycopg.Error:
                    await conn.close()
            if (
                not conn.closed
                and conn.info.transaction_status in (IDLE, INTRANS)
                and len(self._idle) < IDLE_HOLDS
            ):
                self._idle.append(conn)
                if conn.info.transaction_status == INTRANS:
                    self._release_soon()
            else:
                await conn.close()

    def _release_soon(self) -> None:
        if self._release is None or self._release.done():
            self._release = asyncio.get_running_loop().create_task(
                self.release(self.release_after or 0.0), name="inturn-key-hold-release"
            )

    async def release(self, after: float = 0.0) -> None:
        """Release the locks of finished holds (:meth:`hold`) on idle connections, after
        ``after`` seconds; a connection that fails to is closed (which releases them too)."""
        if after:
            await asyncio.sleep(after)
        waiting = [c for c in self._idle if c.info.transaction_status != IDLE]
        for conn in waiting:
            if conn not in self._idle:  # taken by a hold meanwhile: its first lock releases
                continue
            self._idle.remove(conn)
            try:
                await conn.commit()
            except psycopg.Error:
                await conn.close()
                continue
            if len(self._idle) < IDLE_HOLDS:
                self._idle.append(conn)
            else:
                await conn.close()

    async def setting(self, name: str, default: str) -> str:
        rows = await self._rows("setting", {"name": name, "value": default})
        return str(rows[0]["value"])

    async def replace_setting(self, name: str, expected: str, value: str) -> bool:
        rows = await self._rows(
            "replace_setting", {"name": name, "expected": expected, "value": value}
        )
        return bool(rows)

    async def fetch(self, refs: Sequence[bytes]) -> Mapping[bytes, StoredKey]:
        rows = await self._rows("fetch", {"refs": list(refs)})
        return {k.ref: k for k in map(_stored, rows)}

    async def create(self, keys: Sequence[NewKey]) -> Mapping[bytes, StoredKey]:
        params = {
            "refs": [k.ref for k in keys],
            "masters": [k.master_id for k in keys],
            "wrapped": [k.wrapped for k in keys],
            "lookups": [",".join(k.lookups) for k in keys],
        }
        out = {k.ref: k for k in map(_stored, await self._rows("create", params))}
        raced = [k.ref for k in keys if k.ref not in out]
        if raced:  # another process stored these first: theirs stand
            out.update(await self.fetch(raced))
        return out

    async def erase(self, lookups: Sequence[str], *, actor: str, reason: str) -> int:
        params = {"lookups": list(lookups), "actor": actor, "reason": reason}
        rows = await self._rows("erase", params)
        return int(rows[0]["keys"])

    async def not_under(self, master_id: str, *, after: bytes, limit: int) -> list[StoredKey]:
        params = {"master_id": master_id, "after": after, "limit": limit}
        return [_stored(r) for r in await self._rows("not_under", params)]

    async def rewrap(self, old: StoredKey, master_id: str, wrapped: bytes) -> bool:
        async with self._lock:
            conn = await self._connection()
            self.round_trips += 1
            cur = await conn.execute(
                Q["rewrap"],
                {
                    "ref": old.ref,
                    "old_master": old.master_id,
                    "old_wrapped": old.wrapped,
                    "master_id": master_id,
                    "wrapped": wrapped,
                },
            )
            return cur.rowcount == 1

    async def settings(self, names: Sequence[str]) -> dict[str, str]:
        """The recorded values of ``names`` (absent ones left out)."""
        rows = await self._rows("settings", {"names": list(names)})
        return {str(r["name"]): str(r["value"]) for r in rows}

    async def begin_index_rotation(self, old: str, new: str, check: str, generation: int) -> bool:
        """Make ``new`` (a wrapped index key) the current index key and ``old`` the previous
        one, in one statement, if ``old`` is still the current one; False when it was not."""
        params = {"old": old, "new": new, "check": check, "generation": str(generation)}
        rows = await self._rows("begin_index_rotation", params)
        return bool(rows and int(rows[0]["changed"]))

    async def set_lookups(self, ref: bytes, lookups: Sequence[str], generation: int) -> bool:
        """Replace a key's erasure lookups by ones computed under index ``generation``."""
        params = {"ref": ref, "lookups": ",".join(lookups), "generation": generation}
        async with self._lock:
            conn = await self._connection()
            self.round_trips += 1
            cur = await conn.execute(Q["set_lookups"], params)
            return cur.rowcount == 1

    async def unreached(self, settled: str, generation: int) -> int:
        """Patient keys made before ``settled`` whose lookups are under an older generation."""
        rows = await self._rows("unreached", {"settled": settled, "generation": generation})
        return int(rows[0]["keys"])

    async def end_index_rotation(self) -> bool:
        """Destroy the previous index key (its setting) and the rotation's state."""
        return bool(await self._rows("end_index_rotation", {}))

    async def masters(self) -> Mapping[str, int]:
        return {str(r["master_id"]): int(r["keys"]) for r in await self._rows("masters", {})}

    async def erasures(self, limit: int = 20) -> list[dict[str, Any]]:
        """The latest erasures recorded (id, erased_at, actor, reason, keys), newest first."""
        return await self._rows("erasures", {"limit": limit})


async def probe(dsn: str) -> None:
    """Connect to the key store and read one setting table row (its schema exists).

    Raises:
        psycopg.Error: unreachable, or the schema is missing (``inturn migrate --key-dsn``).
    """
    async with await AsyncConnection.connect(
        dsn, autocommit=True, **session_kwargs(dsn, writes=True)
    ) as conn:
        await fetch_one(conn, Q["masters"], {}, row=dict_row)
