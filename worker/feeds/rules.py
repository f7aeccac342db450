"""The sweeper's ``feeds`` pack: ``feed-silent``.

``feed-silent``
    A declared feed (a channel, or one sender of a per-sender channel) that has received no
    message for longer than its ``silentAfterSeconds`` is placed on the ``feeds`` worklist
    (record kind ``feed``, key ``<channel>`` or ``<channel>/<MSH-3.1>^<MSH-4.1>``). With a
    schedule, only time inside it counts: a feed is judged only while its schedule is open,
    from the later of its last message and the opening (a lab that is quiet every night is not
    work every morning). The item is cleared by ``system`` when messages flow again, when the
    schedule closes, or when the feed is no longer declared. A person who clears it while the
    silence goes on is not handed it again for the same silence.

Predicates are in the query (``store/sql/feed_rules.sql``), in database time, most overdue
first, at most ``limit`` per run. Last-message times are as ingest last flushed them (every 30
seconds by default), so a feed is judged up to that much late, never early.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection

from inturn.worker.store import feeds as store
from inturn.worker.worklist.pack import Pack
from inturn.worker.worklist.rules import Rule, RuleOutcome, RulePack
from inturn.worker.worklist.stale import RuleWorklist
from inturn.worker.worklist.windows import open_windows

if TYPE_CHECKING:
    from inturn.worker.feeds.recorder import FeedRecorder
    from inturn.worker.worklist.hooks import IngestOptions

#: The pack (``inturn sweep --only feeds``) and the rule's group.
GROUP = "feeds"
#: The rule's worklist: silent feeds on ``feeds``, reason ``feed-silent``.
SILENT = RuleWorklist(queue="feeds", record_kind="feed", reason="feed-silent")
#: The reason code.
REASON = SILENT.reason


def _silent_item(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return r["record_key"], {
        "channel": r["channel"],
        "sender": r["sender"] or None,
        "lastMessageAt": r["last_message_at"].isoformat() if r["last_message_at"] else None,
        "silentSince": r["quiet_since"].isoformat(),
        "silentSeconds": round(r["silent_seconds"]),
        "silentAfterSeconds": r["silent_after_seconds"],
    }


async def feed_silent(conn: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
    """Place silent feeds on ``feeds``; clear those that are no longer silent (see the module
    docstring)."""
    windows = open_windows(await store.rule_schedules(conn), await store.rule_now(conn))
    stale = await store.silent_stale(conn, limit=limit, windows=windows)
    pending = await store.silent_pending(conn)
    due = await store.silent_due(conn, limit=limit, windows=windows)
    return await SILENT.place_and_clear(
        conn, dry_run=dry_run, stale=stale, pending=pending, due=due, item=_silent_item
    )


PACK: RulePack[None] = RulePack(
    name=GROUP,
    about="feeds (channels) silent longer than declared, within their busy hours",
    rules=lambda _: (Rule(REASON, GROUP, feed_silent),),
    settings=None,
)


#: This pack as an installation finds it (entry point ``inturn.packs``).
def recorder(options: IngestOptions) -> FeedRecorder | None:
    """The pack's ``record`` hook (:func:`inturn.worker.feeds.recorder.recorder`), imported
    when ingest calls it: the declarations' parser (YAML, JSON schema) is never loaded by a
    process that only discovers the packs, such as a worker."""
    from inturn.worker.feeds.recorder import recorder as make

    return make(options)


PLUGIN = Pack(name="feeds", sweep=PACK, record=recorder)
