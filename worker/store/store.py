"""``Store``: the queue operations over two pools, for ingest, the CLI and the operator.

Writes borrow a connection from the write pool; listings, payload reads and depth use the
read-only pool (short statement timeout). The worker does not use this class: it calls
:mod:`inturn.worker.store.queue` on its single dedicated connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from psycopg_pool import AsyncConnectionPool

from inturn.worker.store import queue
from inturn.worker.store.connect import open_pools
from inturn.worker.store.model import DepthRow, Item, NewItem, ScannedPayload


class Store:
    """The delivery queue over a write pool and a read-only pool.

    Use ``async with await Store.open(dsn) as store:``. Methods mirror
    :mod:`inturn.worker.store.queue` (see there for semantics and errors).
    """

    def __init__(self, write: AsyncConnectionPool, read: AsyncConnectionPool) -> None:
        self.write = write
        self.read = read

    @classmethod
    async def open(cls, dsn: str, *, write_size: int = 4, read_size: int = 2) -> Store:
        """Open both pools against ``dsn``.

        Raises:
            psycopg_pool.PoolTimeout: the database could not be reached.
        """
        write, read = await open_pools(dsn, write_size=write_size, read_size=read_size)
        return cls(write, read)

    async def close(self) -> None:
        """Close both pools."""
        await self.write.close()
        await self.read.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def enqueue(self, items: Sequence[NewItem]) -> list[int]:
        """Store items durably (one transaction); ids are returned only after COMMIT."""
        async with self.write.connection() as conn:
            return await queue.enqueue(conn, items)

    async def blocked(self, destination: str) -> bool:
        """Whether anything is pending for ``destination``, due or not."""
        async with self.read.connection() as conn:
            return await queue.blocked(conn, destination)

    async def retry_now(
        self,
        *,
        who: str,
        item_id: int | None = None,
        destination: str | None = None,
        why: str | None = None,
    ) -> list[int]:
        """Make one item or a whole destination due now, attempts reset; audited."""
        async with self.write.connection() as conn:
            return await queue.retry_now(
                conn, who=who, item_id=item_id, destination=destination, why=why
            )

    async def skip(self, item_id: int, *, who: str, why: str | None = None) -> bool:
        """Abandon one pending item; audited."""
        async with self.write.connection() as conn:
            return await queue.skip(conn, item_id, who=who, why=why)

    async def drain(self, destination: str, *, who: str, why: str | None = None) -> list[int]:
        """Skip every pending item of a destination; audited."""
        async with self.write.connection() as conn:
            return await queue.drain(conn, destination, who=who, why=why)

    async def remove(
        self, item_ids: Sequence[int], *, who: str, why: str | None = None
    ) -> list[int]:
        """Delete finished items only."""
        async with self.write.connection() as conn:
            return await queue.remove(conn, item_ids, who=who, why=why)

    async def erase(
        self, item_ids: Sequence[int], *, who: str, why: str | None = None
    ) -> list[int]:
        """Delete items in any state; audited."""
        async with self.write.connection() as conn:
            return await queue.erase(conn, item_ids, who=who, why=why)

    async def resend(self, item_id: int, *, who: str, why: str | None = None) -> int | None:
        """Copy a finished item to the tail of its queue; audited."""
        async with self.write.connection() as conn:
            return await queue.resend(conn, item_id, who=who, why=why)

    async def purge(
        self, cutoffs: dict[str, datetime], *, batch: int = queue.PURGE_BATCH_MAX
    ) -> dict[str, int] | None:
        """Delete finished items older than their cutoff, in batches; None if another runs."""
        async with self.write.connection() as conn:
            return await queue.purge(conn, cutoffs, batch=batch)

    async def scan_payloads(self) -> AsyncIterator[ScannedPayload]:
        """Every held item with its payload (read pool, keyset pages)."""
        async with self.read.connection() as conn:
            async for scanned in queue.scan_payloads(conn):
                yield scanned

    async def list_items(
        self,
        *,
        destination: str | None = None,
        channel: str | None = None,
        state: str | None = None,
        control_id: str | None = None,
        patient_key: str | None = None,
        limit: int = queue.LIST_LIMIT_DEFAULT,
        offset: int = 0,
    ) -> tuple[list[Item], int]:
        """Items newest first, never payloads, and the total count (read pool)."""
        async with self.read.connection() as conn:
            return await queue.list_items(
                conn,
                destination=destination,
                channel=channel,
                state=state,
                control_id=control_id,
                patient_key=patient_key,
                limit=limit,
                offset=offset,
            )

    async def get_item(self, item_id: int) -> Item | None:
        """One item without payload (read pool)."""
        async with self.read.connection() as conn:
            return await queue.get_item(conn, item_id)

    async def payload(self, item_id: int) -> bytes | None:
        """One item's stored bytes (read pool)."""
        async with self.read.connection() as conn:
            return await queue.payload(conn, item_id)

    async def depth(self, destination: str | None = None) -> list[DepthRow]:
        """Per-destination summary (read pool)."""
        async with self.read.connection() as conn:
            return await queue.depth(conn, destination)

    async def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest audit entries (read pool)."""
        async with self.read.connection() as conn:
            return await queue.audit_log(conn, limit)

    async def pending_destinations(self) -> list[str]:
        """Destinations with work waiting (read pool)."""
        async with self.read.connection() as conn:
            return await queue.pending_destinations(conn)
