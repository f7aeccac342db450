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


def channel_wake_name(channel: str) -> str:
    """Return the LISTEN/NOTIFY name that wakes every worker of an ingest ``channel`` (30
    bytes): ingest appends a channel's messages to its log once, and one NOTIFY per channel
    and batch wakes all its destinations' workers to pull (migration 0033). Its prefix differs
    from :func:`notify_channel`'s, so it never equals a destination's name."""
    return "inturn_c_" + hashlib.sha1(channel.encode()).hexdigest()[:21]


async def listen(conn: AsyncConnection[Any], destination: str, channel: str | None = None) -> None:
    """LISTEN on the destination's name (:func:`notify_channel`; resend, retry-now and resume
    wake it there) and, given its ingest ``channel``, on the channel's wake-up name
    (:func:`channel_wake_name`), on ``conn``."""
    await listen_channel(conn, notify_channel(destination))
    if channel is not None:
        await listen_channel(conn, channel_wake_name(channel))


async def listen_channel(conn: AsyncConnection[Any], channel: str) -> None:
    """LISTEN on ``channel`` on ``conn``.

    A utility statement with an identifier, composed here rather than a named query (there is
    nothing in it to plan).
    """
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


async def wake_channels(conn: AsyncConnection[Any], channels: Iterable[str]) -> None:
    """NOTIFY every worker of each ingest channel (delivered at COMMIT of the caller's
    transaction): one notification per channel, however many destinations it feeds."""
    for channel in sorted(set(channels)):
        await conn.execute(Q["notify"], {"channel": channel_wake_name(channel), "destination": ""})


async def wake(conn: AsyncConnection[Any], destinations: Iterable[str]) -> None:
    """NOTIFY each destination's worker (delivered at COMMIT of the caller's transaction)."""
    for destination in sorted(set(destinations)):
        await conn.execute(
            Q["notify"], {"channel": notify_channel(destination), "destination": destination}
        )
