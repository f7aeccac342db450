"""The feeds pack (feed-silent) on a real Postgres, and ingest recording through MLLP.

Thresholds are checked one second before, at and after, inside one transaction: there
``now()`` stands still. Schedules are built around the database's now in several time zones.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from psycopg import AsyncConnection

from inturn.worker.feeds.declare import parse_feeds
from inturn.worker.feeds.rules import feed_silent
from inturn.worker.hl7.mllp import frame
from inturn.worker.ingest.service import Ingest
from inturn.worker.operations import packs
from inturn.worker.spec.schedule import DAYS
from inturn.worker.store import feeds as store
from inturn.worker.worklist import clear
from tests.support.ingest import Client, config, msg
from tests.support.pipeline import register

pytestmark = pytest.mark.store


async def declare(conn: AsyncConnection[Any], *feeds: store.DeclaredFeed) -> None:
    await store.declare(conn, list(feeds))


def feed(channel: str = "adt", silent_after: int = 600, **kw: Any) -> store.DeclaredFeed:
    return store.DeclaredFeed(
        channel, silent_after, kw.get("per_sender", False), kw.get("schedule")
    )


async def quiet_for(conn: AsyncConnection[Any], seconds: float, channel: str = "adt") -> None:
    """The channel's last message ``seconds`` before now() (this transaction's)."""
    await conn.execute(
        "UPDATE inturn_feed SET last_message_at = now() - make_interval(secs => %s),"
        " declared_at = now() - interval '30 days' WHERE channel = %s",
        (seconds, channel),
    )


async def db_now(conn: AsyncConnection[Any]) -> datetime:
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def opened_ago(now: datetime, minutes: int, zone: str) -> dict[str, Any]:
    """Open every day from ``minutes`` ago (wall time in ``zone``, to the minute) for 2 h."""
    local = now.astimezone(ZoneInfo(zone))
    start = (local - timedelta(minutes=minutes)).replace(second=0, microsecond=0)
    end = start + timedelta(hours=2)
    return {
        "timeZone": zone,
        "windows": [
            {"days": list(DAYS), "start": start.strftime("%H:%M"), "end": end.strftime("%H:%M")}
        ],
    }


def closed_now(now: datetime, zone: str) -> dict[str, Any]:
    """Open only the whole day after tomorrow (local to ``zone``)."""
    day = DAYS[(now.astimezone(ZoneInfo(zone)).weekday() + 2) % 7]
    return {"timeZone": zone, "windows": [{"days": [day], "start": "00:00", "end": "24:00"}]}


async def items(conn: AsyncConnection[Any]) -> list[tuple[str, str, str | None, str | None]]:
    cur = await conn.execute(
        "SELECT record_key, state, cleared_by, note FROM inturn_worklist_item"
        " WHERE queue = 'feeds' AND reason = 'feed-silent' ORDER BY id"
    )
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


@pytest.mark.parametrize(
    ("quiet", "due"), [(599.0, False), (600.0, True), (601.0, True)], ids=["before", "at", "after"]
)
async def test_silent_after_threshold(conn: AsyncConnection[Any], quiet: float, due: bool) -> None:
    await declare(conn, feed())
    async with conn.transaction():
        await quiet_for(conn, quiet)
        outcome = await feed_silent(conn, limit=10, dry_run=False)
    assert outcome.placed == (1 if due else 0)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"])
async def test_only_time_inside_the_schedule_counts(conn: AsyncConnection[Any], zone: str) -> None:
    now = await db_now(conn)
    # silent for a day, may be silent 10 minutes
    await declare(conn, feed(schedule=closed_now(now, zone)))
    async with conn.transaction():
        await quiet_for(conn, 86400)
        assert (await feed_silent(conn, limit=10, dry_run=False)).placed == 0  # closed
    await declare(conn, feed(schedule=opened_ago(now, 5, zone)))
    async with conn.transaction():
        await quiet_for(conn, 86400)
        assert (await feed_silent(conn, limit=10, dry_run=False)).placed == 0  # 5 min inside
    await declare(conn, feed(schedule=opened_ago(now, 15, zone)))
    async with conn.transaction():
        await quiet_for(conn, 86400)
        outcome = await feed_silent(conn, limit=10, dry_run=False)
    assert outcome.placed == 1
    details = outcome.placements[0].item.details
    opened = datetime.fromisoformat(details["silentSince"])
    assert timedelta(minutes=14) < now - opened <= timedelta(minutes=16)
    # the schedule closes: cleared by system, as the silence is expected now
    await declare(conn, feed(schedule=closed_now(now, zone)))
    outcome = await feed_silent(conn, limit=10, dry_run=False)
    assert outcome.cleared == 1
    assert await items(conn) == [("adt", "cleared", "system", "outside its busy hours (schedule)")]


async def test_messages_flowing_again_clear_it_and_a_person_is_not_handed_it_twice(
    conn: AsyncConnection[Any],
) -> None:
    await declare(conn, feed(), feed("lab", 300))
    await quiet_for(conn, 3600)
    await quiet_for(conn, 3600, "lab")
    first = await feed_silent(conn, limit=10, dry_run=False)
    assert (first.placed, first.cleared) == (2, 0)
    # most overdue first: lab may be silent 5 minutes, adt 10
    assert [p.item.record_key for p in first.placements] == ["lab", "adt"]
    again = await feed_silent(conn, limit=10, dry_run=False)
    assert (again.placed, again.already) == (0, 2)  # idempotent
    # a person clears lab while it is still silent: not placed again for this silence
    lab = next(p.item for p in first.placements if p.item.record_key == "lab")
    await clear(conn, lab.id, who="nurse", note="called the lab")
    assert (await feed_silent(conn, limit=10, dry_run=False)).placed == 0
    # adt receives a message: cleared by system
    await quiet_for(conn, 1)
    outcome = await feed_silent(conn, limit=10, dry_run=False)
    assert outcome.cleared == 1
    # lab hears again, then falls silent again: a new silence is work again
    await quiet_for(conn, 1, "lab")
    await feed_silent(conn, limit=10, dry_run=False)
    await conn.execute("UPDATE inturn_worklist_item SET placed_at = placed_at - interval '1 hour'")
    await quiet_for(conn, 400, "lab")
    assert (await feed_silent(conn, limit=10, dry_run=False)).placed == 1
    assert sorted((k, s, w or "") for k, s, w, _ in await items(conn)) == [
        ("adt", "cleared", "system"),
        ("lab", "cleared", "nurse"),
        ("lab", "pending", ""),
    ]


async def test_limit_and_undeclared(conn: AsyncConnection[Any]) -> None:
    await declare(conn, *(feed(f"c{n}") for n in range(5)))
    for n in range(5):
        await quiet_for(conn, 1000 + n, f"c{n}")
    outcome = await feed_silent(conn, limit=2, dry_run=False)
    assert [p.item.record_key for p in outcome.placements] == ["c4", "c3"]
    dry = await feed_silent(conn, limit=10, dry_run=True)
    assert (dry.placed, dry.already) == (3, 2)
    await declare(conn, feed("c0"))
    outcome = await feed_silent(conn, limit=10, dry_run=False)
    assert outcome.cleared == 2
    assert {n for _, _, _, n in await items(conn)} == {"the feed is no longer declared", None}


async def test_the_feeds_pack_is_registered() -> None:
    assert "feeds" in packs.names()
    assert [r.name for r in packs.get("feeds").configured()] == ["feed-silent"]


async def test_ingest_records_last_message_times_and_the_sweeper_follows(fresh_db: str) -> None:
    register(fresh_db, "hospital/adt-out", "adt")
    declared = parse_feeds(
        {"feeds": [{"channel": "adt", "silentAfterSeconds": 600, "perSender": True}]}
    )
    cfg = config(feeds=tuple(declared), feed_flush_seconds=3600)
    async with Ingest(cfg, dsn=fresh_db) as ingest:
        c = await Client.connect(ingest.mllp_ports["adt"])
        for n in range(20):
            assert (await c.send(msg(f"F{n}"))).code == "AA"
        await c.close()
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            [row] = await store.overview(conn)
            assert row.last_message_at is None  # nothing written per message
            assert ingest.recorder is not None
            assert await ingest.recorder.flush(ingest.pools.write) == 2  # channel and sender
            rows = await store.overview(conn)
        assert [(r.channel, r.sender) for r in rows] == [("adt", ""), ("adt", "SENDAPP^SENDFAC")]
        assert all(r.last_message_at is not None for r in rows)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await conn.execute("UPDATE inturn_feed SET last_message_at = now() - interval '1 hour'")
            await conn.execute(
                "UPDATE inturn_feed_sender SET last_message_at = now() - interval '1 hour'"
            )
            placed = await feed_silent(conn, limit=10, dry_run=False)
            assert sorted(p.item.record_key for p in placed.placements) == [
                "adt",
                "adt/SENDAPP^SENDFAC",
            ]
            c = await Client.connect(ingest.mllp_ports["adt"])
            await c.write(frame(msg("F-again")))
            await c.reply()
            await c.close()
            await ingest.recorder.flush(ingest.pools.write)
            cleared = await feed_silent(conn, limit=10, dry_run=False)
            assert cleared.cleared == 2
            assert {(s, w, n) for _, s, w, n in await items(conn)} == {
                ("cleared", "system", "messages flow again")
            }
