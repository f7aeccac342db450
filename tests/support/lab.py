"""The destination most worker tests drain, ``ward/lab`` on channel ``adt``: its numbered
ADT^A01 messages (MSH-10 ``MSGnnnnn``), enqueued; its rows' states; a worker for it with quick
retries (``from tests.support.lab import ...``)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support.pipeline import worker, worker_config

DEST = "ward/lab"

#: A worker of :func:`config` running in the background: :func:`tests.support.pipeline.worker`.
running = worker


def message(n: int) -> bytes:
    """An ADT^A01 of patient ``P<n>`` whose MSH-10 is ``MSG<n>`` (five digits)."""
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|MSG{n:05d}|P|2.5\r"
        f"PID|1||P{n}^^^HOSP^MR||DOE^JOHN\r"
    ).encode()


def config(port: int, **changes: Any) -> WorkerConfig:
    """The worker configuration of :data:`DEST` for an MLLP receiver on ``port`` of 127.0.0.1:
    :func:`tests.support.pipeline.worker_config` on channel ``adt``, ``changes`` applied."""
    return worker_config(DEST, port, channel="adt", **changes)


async def enqueue(dsn: str, numbers: list[int], destination: str = DEST) -> list[int]:
    """Enqueue :func:`message` ``n`` for each of ``numbers`` (for ``destination``); their ids."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await queue.enqueue(
            conn,
            [NewItem(destination, "adt", f"MSG{n:05d}", "ADT^A01", message(n)) for n in numbers],
        )


async def states(dsn: str) -> list[tuple[int, str, int]]:
    """``(id, state, attempts)`` of every delivery row, oldest first."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT id, state, attempts FROM inturn_delivery ORDER BY id")
        return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def all_delivered(dsn: str, n: int) -> bool:
    """Whether there are ``n`` delivery rows, every one delivered."""
    rows = await states(dsn)
    return len(rows) == n and all(r[1] == "delivered" for r in rows)
