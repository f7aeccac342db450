"""Feeds in the store: declarations, last-message times, and what the console lists.

Ingest writes (:func:`declare`, :func:`record_seen`); the sweeper and the console read
(:func:`overview`). Every function runs in the caller's transaction when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row, tuple_row
from psycopg.types.json import Jsonb

from inturn.worker.store.queries import fetch_all, load

Q = load("feeds.sql")
R = load("feed_rules.sql")


@dataclass(frozen=True)
class DeclaredFeed:
    """One feed as ingest declares it (spec form of its schedule, or None)."""

    channel: str
    silent_after_seconds: int
    per_sender: bool
    schedule: dict[str, Any] | None
    #: Most senders the table keeps for a per-sender feed (ingest's ``--max-feed-senders``).
    max_senders: int = 100


async def declare(conn: AsyncConnection[Any], feeds: Sequence[DeclaredFeed]) -> None:
    """Make the declared feeds exactly ``feeds`` (in one transaction): new ones are added,
    changed ones updated (their last message time kept), others removed with their senders."""
    async with conn.transaction():
        await conn.execute(
            Q["declare"],
            {
                "channels": [f.channel for f in feeds],
                "silent_after": [f.silent_after_seconds for f in feeds],
                "per_sender": [f.per_sender for f in feeds],
                "schedules": [None if f.schedule is None else Jsonb(f.schedule) for f in feeds],
                "max_senders": [f.max_senders for f in feeds],
            },
        )
        await conn.execute(Q["undeclare"], {"channels": [f.channel for f in feeds]})


async def record_seen(
    conn: AsyncConnection[Any],
    seen: Sequence[tuple[str, str, datetime]],
    *,
    counts: Mapping[tuple[str, str], int] | None = None,
) -> list[tuple[str, str]]:
    """Record last message times ``(channel, sender, at)``; sender ``''`` is the channel as a
    whole. Two statements in one transaction; times only move forward.

    Args:
        counts: messages per ``(channel, sender)`` since the last record (1 when absent): a
            sender whose total stays 1 is noise (never raised as silent, and the first to give
            its place to a newcomer over the bound).

    Returns:
        The ``(channel, sender)`` pairs not recorded: new senders over their channel's
        ``max_senders``, which the table refuses whichever process or replica sends them
        (migration 0017).
    """
    channels = [(c, at) for c, sender, at in seen if not sender]
    senders = [(c, sender, at) for c, sender, at in seen if sender]
    refused: list[tuple[str, str]] = []
    async with conn.transaction():
        if channels:
            await conn.execute(
                Q["seen_channels"],
                {"channels": [c for c, _ in channels], "ats": [at for _, at in channels]},
            )
        if senders:
            rows = await fetch_all(
                conn,
                Q["seen_senders"],
                {
                    "channels": [c for c, _, _ in senders],
                    "senders": [s for _, s, _ in senders],
                    "ats": [at for _, _, at in senders],
                    "counts": [(counts or {}).get((c, s), 1) for c, s, _ in senders],
                },
                row=tuple_row,
            )
            written = {(str(r[0]), str(r[1])) for r in rows}
            refused = [(c, s) for c, s, _ in senders if (c, s) not in written]
    return refused


@dataclass(frozen=True)
class FeedRow:
    """One feed (a channel, or one sender of a per-sender channel) as listed.

    Attributes:
        channel, sender: the feed (sender ``''``: the channel as a whole).
        last_message_at: when it last received a message (as last flushed), or None.
        declared_at: when it was declared (the channel) or first seen (a sender).
        silent_after_seconds: how long it may stay silent.
        schedule: when it should be busy (spec form), or None.
        per_sender: its channel is declared per sender.
    """

    channel: str
    sender: str
    last_message_at: datetime | None
    declared_at: datetime
    silent_after_seconds: int
    schedule: dict[str, Any] | None
    per_sender: bool


async def overview(conn: AsyncConnection[Any]) -> list[FeedRow]:
    """Every declared feed and each seen sender of per-sender feeds, by channel and sender."""
    return await fetch_all(conn, R["overview"], {}, row=class_row(FeedRow))


# --- the feeds rule pack's queries (``feed_rules.sql``; the rule is ``feeds/rules.py``) -------


async def _rule_rows(
    conn: AsyncConnection[Any], query: LiteralString, params: dict[str, Any]
) -> list[dict[str, Any]]:
    return await fetch_all(conn, query, params, row=dict_row)


async def rule_now(conn: AsyncConnection[Any]) -> datetime:
    """The database's clock, which the feeds' due-date conditions use."""
    [row] = await _rule_rows(conn, R["now"], {})
    return row["now"]  # type: ignore[no-any-return]


async def rule_schedules(conn: AsyncConnection[Any]) -> list[Any]:
    """Every distinct schedule of a declared feed (JSON documents)."""
    return [r["schedule"] for r in await _rule_rows(conn, R["schedules"], {})]


async def silent_due(
    conn: AsyncConnection[Any], *, limit: int, windows: dict[str, Any]
) -> list[dict[str, Any]]:
    """Declared feeds silent past their ``silentAfterSeconds`` inside their window, most
    overdue first, at most ``limit``."""
    return await _rule_rows(conn, R["silent_due"], {**windows, "limit": limit})


async def silent_stale(
    conn: AsyncConnection[Any], *, limit: int, windows: dict[str, Any]
) -> list[dict[str, Any]]:
    """Pending ``feed-silent`` items whose feed is no longer silent, each with ``why``."""
    return await _rule_rows(conn, R["silent_stale"], {**windows, "limit": limit})


async def silent_pending(conn: AsyncConnection[Any]) -> int:
    """How many ``feed-silent`` items are pending."""
    [row] = await _rule_rows(conn, R["pending_count"], {})
    return int(row["n"])
