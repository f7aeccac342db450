"""The delivery side's sweeper rules: the rule pack ``delivery`` (:data:`PACK`).

``destination-stuck``
    A live destination whose head has waited at least ``spec.alerting.stuckAfterSeconds``
    (default 900) is placed on ``delivery-stuck``; the item is cleared by ``system`` once the
    head is within its threshold again (or nothing waits, or the Destination is gone). With a
    delivery window (``spec.schedule``) only time inside it counts: a destination is judged
    only while its window is open, from the later of its head's enqueue and the opening, and
    an item is cleared when the window closes (holding the queue then is deliberate).
``orphaned-queue``
    A destination with pending messages that is no longer registered (its Destination was
    deleted) is placed on ``delivery-stuck``; cleared when it is registered again or nothing
    is pending any more.
``delivery-expired``
    Only for Destinations that set ``spec.expireAfterSeconds``: pending messages older than that
    are skipped by ``sweeper`` (audited like any skip) and each is placed on
    ``delivery-expired``, in the same transaction. Those items are for people to review (and
    perhaps resend); the sweeper never clears them.
``resent-delivered``
    Places nothing. A ``delivery-failed`` item whose message was resent (``inturn queue
    resend``, the console) is cleared by ``system`` once the last copy in its chain of resends
    is delivered: nothing is left for a person to do. Until then it stays, so a copy that fails
    again still shows the original's history; that copy has its own item.

Each rule takes the most overdue first, at most ``limit`` per run. Before judging, the
stuck, orphaned and expiry rules pull for each destination whose messages have waited in its
channel's log unpulled for :data:`~inturn.worker.store.sweep.PULL_AFTER_SECONDS` (its worker is
stopped, missing or far behind), so that they judge those messages as rows (not in a dry run,
which writes nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import actions as delivery_actions
from inturn.worker.store import sweep as store
from inturn.worker.store.worklist import NewPlacement, clear_where, place_many
from inturn.worker.worklist.pack import Pack
from inturn.worker.worklist.rules import Rule, RuleOutcome, RulePack
from inturn.worker.worklist.windows import open_windows

#: The group these rules belong to (``inturn sweep --only delivery``).
GROUP = "delivery"
#: Who the sweeper is, in ``placed_by``, ``decided_by`` and the audit.
SWEEPER = "sweeper"
#: Queue of stuck and orphaned destinations.
STUCK_QUEUE = "delivery-stuck"
#: Queue of messages skipped because they expired.
EXPIRED_QUEUE = "delivery-expired"
#: Messages skipped (and placed) per transaction by ``delivery-expired``.
EXPIRE_BATCH = 100


Rows = Callable[[AsyncConnection[Any]], Awaitable[list[dict[str, Any]]]]


async def _destination_rule(
    conn: AsyncConnection[Any],
    *,
    reason: str,
    due: Rows,
    stale: Rows,
    details: Callable[[dict[str, Any]], dict[str, Any]],
    note: str,
    dry_run: bool,
) -> RuleOutcome:
    """Place the ``due`` destinations on ``delivery-stuck`` for ``reason`` (one statement),
    then clear, as ``system`` with ``note``, the ``stale`` items (condition no longer holds)."""
    outcome = RuleOutcome()
    due_rows = await due(conn)
    keys = [r["record_key"] for r in await stale(conn)]
    if dry_run:
        due_keys = [r["destination"] for r in due_rows]
        there = await store.pending_keys(
            conn, queue=STUCK_QUEUE, reason=reason, record_kind="destination", keys=due_keys
        )
        outcome.already += len(there)
        outcome.placed += len(due_keys) - len(there)
        outcome.cleared += len(keys)
        return outcome
    new = [
        NewPlacement(
            queue=STUCK_QUEUE,
            record_kind="destination",
            record_key=r["destination"],
            reason=reason,
            details=details(r),
            placed_by=SWEEPER,
        )
        for r in due_rows
    ]
    for placement in await place_many(conn, new):
        outcome.add(placement)
    cleared = await clear_where(
        conn,
        record_kind="destination",
        record_keys=keys,
        queue=STUCK_QUEUE,
        reason=reason,
        note=note,
    )
    outcome.cleared += len(cleared)
    return outcome


def _head(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "headId": r["head_id"],
        "headEnqueuedAt": r["enqueued_at"].isoformat(),
        "waitingSeconds": round(r["waiting_seconds"]),
    }


async def destination_stuck(
    conn: AsyncConnection[Any], *, limit: int, dry_run: bool
) -> RuleOutcome:
    """Raise destinations whose head waited past their threshold, counting only time inside
    their delivery window; clear those that recovered or whose window closed."""
    if not dry_run:
        await store.pull_behind(conn, limit=limit)
    windows = open_windows(await store.schedules(conn), await store.now(conn))
    reason = "destination-stuck"
    return await _destination_rule(
        conn,
        reason=reason,
        due=partial(store.stuck_due, limit=limit, windows=windows),
        stale=partial(
            store.stuck_stale, queue=STUCK_QUEUE, reason=reason, limit=limit, windows=windows
        ),
        details=lambda r: {
            **_head(r),
            "stuckAfterSeconds": r["stuck_after_seconds"],
            "headAttempts": r["attempts"],
            "suspended": r["suspended"],
            **({"lanes": r["lanes"]} if r["lanes"] > 1 else {}),
        },
        note=(
            "no longer stuck: the head is within its threshold, nothing waits, or its delivery"
            " window is closed"
        ),
        dry_run=dry_run,
    )


async def orphaned_queue(conn: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
    """Raise pending messages of unregistered destinations; clear those registered again."""
    if not dry_run:
        await store.pull_behind(conn, limit=limit)
    reason = "orphaned-queue"
    return await _destination_rule(
        conn,
        reason=reason,
        due=partial(store.orphaned_due, limit=limit),
        stale=partial(store.orphaned_stale, queue=STUCK_QUEUE, reason=reason, limit=limit),
        details=lambda r: {
            **_head(r),
            "deletedAt": r["deleted_at"].isoformat() if r["deleted_at"] else None,
        },
        note="no longer orphaned: the destination is registered again, or nothing waits",
        dry_run=dry_run,
    )


#: The queue of given-up messages (as :mod:`inturn.worker.worklist.delivery_failed` places).
FAILED_QUEUE = "delivery-failed"


async def resent_delivered(conn: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
    """Clear ``delivery-failed`` items whose message was resent and whose copy was delivered."""
    outcome = RuleOutcome()
    keys = await delivery_actions.resent_delivered(conn, limit)
    if dry_run:
        outcome.cleared = len(keys)
        return outcome
    cleared = await clear_where(
        conn,
        record_kind="delivery",
        record_keys=keys,
        queue=FAILED_QUEUE,
        note="resent, and the copy was delivered",
    )
    outcome.cleared += len(cleared)
    return outcome


async def delivery_expired(conn: AsyncConnection[Any], *, limit: int, dry_run: bool) -> RuleOutcome:
    """Skip (as ``sweeper``) and place messages older than their ``expireAfterSeconds``."""
    outcome = RuleOutcome()
    if not dry_run:
        await store.pull_behind(conn, limit=limit)
    due = await store.expired_due(conn, limit=limit)
    if dry_run:
        outcome.placed = len(due)
        return outcome
    for start in range(0, len(due), EXPIRE_BATCH):
        batch = due[start : start + EXPIRE_BATCH]
        async with conn.transaction():
            skipped = await store.skip_expired(
                conn,
                [r["id"] for r in batch],
                who=SWEEPER,
                why="expired: pending longer than spec.expireAfterSeconds",
            )
            limits = {r["id"]: r["expire_after_seconds"] for r in batch}
            placements = await place_many(
                conn,
                [
                    NewPlacement(
                        queue=EXPIRED_QUEUE,
                        record_kind="delivery",
                        record_key=str(row["id"]),
                        reason="expired",
                        details={
                            "destination": row["destination"],
                            "channel": row["channel"],
                            "controlId": row["control_id"],
                            "messageType": row["message_type"],
                            "attempts": row["attempts"],
                            "enqueuedAt": row["enqueued_at"].isoformat(),
                            "expireAfterSeconds": limits[row["id"]],
                        },
                        placed_by=SWEEPER,
                    )
                    for row in skipped
                ],
            )
            for placement in placements:
                outcome.add(placement)
    return outcome


#: The delivery rules: run by every ``inturn sweep`` unless ``--only`` names other packs; no
#: settings of their own (each Destination sets its thresholds in its spec).
PACK: RulePack[None] = RulePack(
    name=GROUP,
    about="stuck destinations, orphaned queues, expired messages, resent failures delivered",
    rules=lambda _: (
        Rule("destination-stuck", GROUP, destination_stuck),
        Rule("orphaned-queue", GROUP, orphaned_queue),
        Rule("delivery-expired", GROUP, delivery_expired),
        Rule("resent-delivered", GROUP, resent_delivered),
    ),
    settings=None,
)

#: This pack as an installation finds it (entry point ``inturn.packs``).
PLUGIN = Pack(name="delivery", sweep=PACK)
