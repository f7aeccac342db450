"""A destination's wake-up channel: its worker LISTENs (:func:`listen`), and whoever makes its
work due NOTIFYs it (:func:`wake`: an enqueue, a resend, a retry-now, a resume, the sweeper's
cancellation notices). The one sender of a destination's NOTIFY.

A notification is a wake-up, never a fact: a worker that missed one finds the work at its next
head query (or poll, behind a pooler).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection, sql

from inturn.worker.store.queries import load

Q = load("queue.sql")


def notify_channel(destination: str) -> str:
    """Return the LISTEN/NOTIFY channel name of a destination (a valid identifier, 30 bytes).

    Each destination has its own channel so that a thousand idle workers are not all woken by
    every enqueue.
    """
    return "inturn_q_" + hashlib.sha1(destination.encode()).hexdigest()[:21]


async def listen(conn: AsyncConnection[Any], destination: str) -> None:
    """LISTEN on the destination's channel (:func:`notify_channel`) on ``conn``."""
    await listen_channel(conn, notify_channel(destination))


async def listen_channel(conn: AsyncConnection[Any], channel: str) -> None:
    """LISTEN on ``channel`` on ``conn``.

    A utility statement with an identifier, composed here rather than a named query (there is
    nothing in it to plan).
    """
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


async def wake(conn: AsyncConnection[Any], destinations: Iterable[str]) -> None:
    """NOTIFY each destination's worker (delivered at COMMIT of the caller's transaction)."""
    for destination in sorted(set(destinations)):
        await conn.execute(
            Q["notify"], {"channel": notify_channel(destination), "destination": destination}
        )
