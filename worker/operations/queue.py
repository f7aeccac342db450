"""Every action a person or a robot takes on the delivery queues, one rule each.

``inturn queue ...``, ``inturn purge``, the console and the sweeper call these functions and
only format what they return; what an action needs (its role, a reason: the table
:data:`~inturn.worker.operations.actor.ACTIONS`), what it refuses and why nothing changed are
decided here once. The model is procrastinate's ``JobManager``: one place between the front
ends and the store.

Each action takes an open autocommit connection, the
:class:`~inturn.worker.operations.actor.Actor` who acts (the name recorded in the audit) and,
where it has one, the reason; it returns a result that says what happened and raises an
:class:`~inturn.worker.errors.InturnError`:

* :class:`~inturn.worker.errors.NotFound`: no such item or destination;
* :class:`~inturn.worker.errors.Conflict`: its state does not allow the action (the message
  says why: ``item 7 is delivered, not pending: nothing to skip``);
* :class:`~inturn.worker.errors.ReasonRequired`: skip, drain, erase and viewing a payload need
  a reason, whoever asks;
* :class:`~inturn.worker.errors.Forbidden`: the actor lacks the action's role;
* :class:`~inturn.worker.errors.Invalid`: a reason too long or holding a NUL character.

Adding an action: its rule in :data:`~inturn.worker.operations.actor.ACTIONS`, a function here
that calls :func:`~inturn.worker.operations.actor.permit` first, its store function
(``store/queue.py`` with a named query in ``store/sql/queue.sql``), and the front ends that
format it (``cli/queue.py``, ``console/operations.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import Conflict, Invalid, NotFound
from inturn.worker.operations.actor import Actor, permit
from inturn.worker.store import actions, audit, history, lease, reads, registry, restore
from inturn.worker.store import worklist as worklist_store


@dataclass(frozen=True)
class Changed:
    """What an action changed: the items (ids, sorted) and, for a destination, its name."""

    action: str
    ids: tuple[int, ...]
    destination: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"action", "ids", "destination"}``."""
        return {"action": self.action, "ids": list(self.ids), "destination": self.destination}


@dataclass(frozen=True)
class Resent:
    """A resend: the original item and its copy at the tail of the queue."""

    original: int
    copy: int


@dataclass(frozen=True)
class ResentMany:
    """A resend of several items, in the original order.

    Attributes:
        copies: ``(original, copy)`` pairs, oldest original first (the copies' ids grow in the
            same order, so they are delivered in the original order).
        refused: ``(id, why)`` for items not resent (pending, already resent, no such item).
    """

    copies: tuple[tuple[int, int], ...]
    refused: tuple[tuple[int, str], ...]
    left_out: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """``{"copies": [{"original", "copy"}], "refused": [{"id", "why"}],
        "leftOut": [{"kind", "count"}]}``."""
        return {
            "copies": [{"original": o, "copy": c} for o, c in self.copies],
            "refused": [{"id": i, "why": w} for i, w in self.refused],
            "leftOut": [{"kind": k, "count": n} for k, n in self.left_out],
        }

    def left_out_lines(self) -> list[str]:
        """One line per kind a range left out, e.g. ``left out: 2 items of other
        destinations``."""
        lines = []
        for kind, n in self.left_out:
            noun = "item" if n == 1 else "items"
            what = {
                "of other destinations": f"{n} {noun} of other destinations",
                "no such item": f"{n} {'id' if n == 1 else 'ids'} with no item",
                "already resent": f"{n} {noun} already resent",
                "pending": f"{n} pending {noun}",
            }.get(kind, f"{n} {kind} {noun} (--include-delivered resends them)")
            lines.append(f"left out: {what}")
        return lines


#: Items one bulk resend takes at most (a list, a range or a destination's failed items).
RESEND_MAX = 10_000


@dataclass(frozen=True)
class Removed:
    """A removal: the ids deleted, and those kept (pending, in history, or no such item),
    each kept one with the sentence saying why (:func:`why_not`), in ``reasons``."""

    removed: tuple[int, ...]
    kept: tuple[int, ...]
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Held:
    """A destination suspended (``suspended`` True) or resumed.

    ``changed`` is False when it already was so (held already, or not held: nothing written,
    nothing audited); ``held_by`` names who holds it after a suspend that found a hold;
    ``by_manifest`` says its manifest's ``spec.suspend`` holds it still (a resume lifts only
    the person's hold: the manifest's is lifted by editing the Destination)."""

    destination: str
    suspended: bool
    changed: bool = True
    held_by: str | None = None
    by_manifest: bool = False

    def describe(self) -> str:
        """One line for the CLI: what changed, or why nothing did."""
        verb = "suspended" if self.suspended else "resumed"
        if self.suspended:
            line = (
                f"{verb} {self.destination}"
                if self.changed
                else f"{self.destination} was already held (by {self.held_by}): nothing changed"
            )
        else:
            line = (
                f"{verb} {self.destination}"
                if self.changed
                else f"{self.destination} was not held: nothing to resume"
            )
        if self.by_manifest:
            line += (
                "; its manifest suspends it too (spec.suspend: true), so it sends nothing until"
                " that is lifted"
            )
        return line


@dataclass(frozen=True)
class Purged:
    """A purge: rows deleted per state (and ``worklist cleared``), or ``ran`` False when
    another purge held the lock and nothing was done; with history settings, what the
    partition work did (``upkeep``) or, in a dry run, would do (``would``)."""

    ran: bool
    counts: dict[str, int] = field(default_factory=dict)
    upkeep: history.Upkeep | None = None
    would: history.Would | None = None


async def why_not(conn: AsyncConnection[Any], item_id: int, action: str) -> NotFound | Conflict:
    """The error that says why ``action`` changed nothing on ``item_id``: NotFound when there
    is no such item, else a Conflict naming its state (and, for a failed item that cannot be
    retried, the resend that can)."""
    item = await reads.get_item(conn, item_id)
    if item is None:
        return NotFound(f"no item {item_id}")
    if item_id < 0:  # a message of the channel log not pulled yet, as the lookups list it
        return Conflict(
            f"{item_id} is message {-item_id} of channel {item.channel}'s log, not pulled yet by"
            f" {item.destination} (nor, it may be, by others): nothing to {action} until its"
            " worker pulls it (`inturn queue drain` skips it with the rest; `inturn queue erase`"
            " takes this id)"
        )
    if item.state == "failed" and action == "retry":
        return Conflict(
            f"item {item_id} failed (it is not pending): `inturn queue resend {item_id} --who ...`"
            " queues a copy of it"
        )
    if action == "remove" and item.state != "pending":
        # finished, yet not removed: it has moved to history, which leaves by the day
        return Conflict(
            f"item {item_id} is {item.state} and in history, which leaves by the day (`inturn"
            " purge` drops its day after the retention; `inturn queue erase` takes a patient's"
            " messages now)"
        )
    if action in ("remove", "resend"):
        return Conflict(f"item {item_id} is {item.state}, not finished: nothing to {action}")
    return Conflict(f"item {item_id} is {item.state}, not pending: nothing to {action}")


async def known_destination(conn: AsyncConnection[Any], destination: str) -> bool:
    """Whether ``destination`` is registered or has items in any state."""
    if any(r.destination == destination for r in await registry.list_all(conn)):
        return True
    items, _ = await reads.list_items(conn, destination=destination, limit=1)
    return bool(items)


async def _no_destination(conn: AsyncConnection[Any], destination: str) -> None:
    if not await known_destination(conn, destination):
        raise NotFound(
            f"no destination {destination} (names are namespace/name; see `inturn queue depth`)"
        )


async def retry_item(
    conn: AsyncConnection[Any], actor: Actor, item_id: int, why: str | None = None
) -> Changed:
    """Make one pending item due now, its attempts reset to 0; audited, wakes its worker.

    Raises:
        NotFound, Conflict: nothing changed (see :func:`why_not`).
    """
    reason = permit(actor, "retry", why)
    ids = await actions.retry_now(conn, who=actor.name, item_id=item_id, why=reason)
    if not ids:
        raise await why_not(conn, item_id, "retry")
    return Changed("retry", tuple(ids))


async def retry_destination(
    conn: AsyncConnection[Any], actor: Actor, destination: str, why: str | None = None
) -> Changed:
    """Make every pending item of ``destination`` due now (attempts reset); audited. An empty
    result means nothing was pending."""
    reason = permit(actor, "retry", why)
    ids = await actions.retry_now(conn, who=actor.name, destination=destination, why=reason)
    return Changed("retry", tuple(ids), destination)


async def skip(conn: AsyncConnection[Any], actor: Actor, item_id: int, why: str | None) -> Changed:
    """Abandon one pending item on purpose (state ``skipped``); audited with the reason.

    Raises:
        ReasonRequired: no reason.
        NotFound, Conflict: nothing changed (see :func:`why_not`).
    """
    reason = permit(actor, "skip", why)
    if not await actions.skip(conn, item_id, who=actor.name, why=reason):
        raise await why_not(conn, item_id, "skip")
    return Changed("skip", (item_id,))


async def mark_delivered(
    conn: AsyncConnection[Any],
    actor: Actor,
    destination: str,
    through: int | None,
    why: str | None,
) -> Changed:
    """Mark ``destination``'s pending items delivered: after the queue database was restored
    from a backup, the ones its receiver already has. Without ``through``, those the
    operator's recorded finding names (its ``status.restore``); with it, the items with an id
    up to it. Either way, with a finding recorded, never a message accepted after the last
    delivery the operator saw before the restore. Audited (``mark-delivered``) with the
    reason; an empty result means none was pending.

    Raises:
        Forbidden, ReasonRequired: the rule of ``mark-delivered`` refuses the actor or reason.
        Invalid: ``through`` is not positive, or it is missing and no restore was found for
            ``destination``.
    """
    reason = permit(actor, "mark-delivered", why)
    if through is not None and through < 1:
        raise Invalid("--through is the id of the last message the receiver has (positive)")
    if through is None and await restore.finding(conn, destination) is None:
        raise Invalid(
            f"no restore was found for {destination}: name the last message its receiver has"
            " with --through ID"
        )
    ids = await restore.mark_delivered(conn, destination, through, who=actor.name, why=reason)
    return Changed("mark-delivered", tuple(ids), destination)


class ConfirmationMismatch(Invalid):
    """A drain whose typed confirmation is not the destination's name; nothing changed."""

    kind = "confirmation_mismatch"


async def drain(
    conn: AsyncConnection[Any],
    actor: Actor,
    destination: str,
    why: str | None,
    *,
    confirm: str | None = None,
) -> Changed:
    """Skip every pending item of ``destination``; audited. An empty result means nothing was
    pending. ``confirm``, when given (the console asks the person to type the name), must be
    the destination's name; it is checked after the role and the reason.

    Raises:
        Forbidden, ReasonRequired: the rule of ``drain`` refuses the actor or the reason.
        ConfirmationMismatch: ``confirm`` is given and is not ``destination``.
        NotFound: nothing was pending and the destination is neither registered nor has items.
    """
    reason = permit(actor, "drain", why)
    if confirm is not None and confirm.strip() != destination:
        raise ConfirmationMismatch("type the destination's name exactly to drain it")
    ids = await actions.drain(conn, destination, who=actor.name, why=reason)
    if not ids:
        await _no_destination(conn, destination)
    return Changed("drain", tuple(ids), destination)


async def resend(
    conn: AsyncConnection[Any],
    actor: Actor,
    item_id: int,
    why: str | None = None,
    payloads: PayloadCodec | None = None,
    *,
    include_delivered: bool = False,
) -> Resent:
    """Queue a copy of a failed item (any finished one with ``include_delivered``) at the
    tail of its destination's queue; audited.

    Raises:
        NotFound: no such item.
        Conflict: the item is still pending (it will be sent anyway), already resent, or
            delivered/skipped without ``include_delivered``.
    """
    reason = permit(actor, "resend", why)
    copy = await actions.resend(
        conn,
        item_id,
        who=actor.name,
        why=reason,
        payloads=payloads,
        include_delivered=include_delivered,
    )
    if copy is None:
        raise NotFound(f"no item {item_id}")
    return Resent(item_id, copy)


async def resend_many(
    conn: AsyncConnection[Any],
    actor: Actor,
    item_ids: Sequence[int],
    why: str | None = None,
    payloads: PayloadCodec | None = None,
    *,
    ranges: Sequence[tuple[int, int]] = (),
    include_delivered: bool = False,
) -> ResentMany:
    """Queue copies of several failed items, in their original (id) order, in one
    transaction; audited once.

    ``item_ids`` are named one by one: one that is pending, already resent, missing, or
    delivered/skipped without ``include_delivered`` is refused (listed in the result) and does
    not stop the others. ``ranges`` (``(first, last)``, both ends included) cover the items of
    the destination of their ends only: what else they span (other destinations' items, other
    states) is left out, counted by kind in ``left_out``, and not changed.

    Raises:
        Invalid: no ids, more than :data:`RESEND_MAX`, or a range whose ends belong to two
            destinations.
        NotFound: none of the ids exists.
    """
    reason = permit(actor, "resend", why)
    return await _resend_many(conn, actor, item_ids, reason, payloads, ranges, include_delivered)


async def _resend_many(
    conn: AsyncConnection[Any],
    actor: Actor,
    item_ids: Sequence[int],
    reason: str | None,
    payloads: PayloadCodec | None,
    ranges: Sequence[tuple[int, int]] = (),
    include_delivered: bool = False,
) -> ResentMany:
    """:func:`resend_many` once ``permit`` has said yes (``reason`` is its answer)."""
    if not item_ids and not ranges:
        raise Invalid("nothing to resend: give item ids, a range, or a destination")
    count = len(set(item_ids).union(*(range(a, b + 1) for a, b in ranges)))
    if count > RESEND_MAX:
        raise Invalid(f"at most {RESEND_MAX} items per resend")
    outcome = await actions.resend_many(
        conn,
        item_ids,
        who=actor.name,
        why=reason,
        payloads=payloads,
        ranges=ranges,
        include_delivered=include_delivered,
    )
    nothing = not outcome.copies and all(w == "no such item" for _, w in outcome.refused)
    if nothing and all(k == "no such item" for k, _ in outcome.left_out):
        missing = [str(i) for i, _ in outcome.refused] + [f"{a}-{b}" for a, b in ranges]
        raise NotFound("no such item: " + ", ".join(missing))
    return ResentMany(outcome.copies, outcome.refused, outcome.left_out)


async def resend_failed(
    conn: AsyncConnection[Any],
    actor: Actor,
    destination: str,
    why: str | None = None,
    *,
    message_type: str | None = None,
    payloads: PayloadCodec | None = None,
) -> ResentMany:
    """Queue copies of every failed item of ``destination`` that was never resent (what
    still needs a person), oldest first; ``message_type`` narrows them by MSH-9 (``*`` and
    ``?`` wildcards, as a Destination's filter).

    Raises:
        NotFound: no such destination.
        Conflict: it has no failed item left to resend.
    """
    reason = permit(actor, "resend", why)
    await _no_destination(conn, destination)
    like = None
    if message_type:
        escaped = message_type.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = escaped.replace("*", "%").replace("?", "_")
    ids = await actions.resend_candidates(conn, destination, type_like=like, limit=RESEND_MAX)
    if not ids:
        which = f" of type {message_type}" if message_type else ""
        raise Conflict(f"{destination} has no failed item{which} left to resend")
    return await _resend_many(conn, actor, ids, reason, payloads)


async def remove(
    conn: AsyncConnection[Any], actor: Actor, item_ids: Sequence[int], why: str | None = None
) -> Removed:
    """Delete finished items; pending and missing ones are kept (listed in the result)."""
    reason = permit(actor, "remove", why)
    ids = await actions.remove(conn, list(item_ids), who=actor.name, why=reason)
    kept = tuple(sorted(set(item_ids) - set(ids)))
    # at most 20 reasons looked up: a person's list, not a bulk job
    reasons = tuple([str(await why_not(conn, i, "remove")) for i in kept[:20]])
    return Removed(tuple(ids), kept, reasons)


async def remove_item(
    conn: AsyncConnection[Any], actor: Actor, item_id: int, why: str | None = None
) -> Changed:
    """Delete one finished item.

    Raises:
        NotFound, Conflict: nothing changed (see :func:`why_not`).
    """
    done = await remove(conn, actor, [item_id], why)
    if not done.removed:
        raise await why_not(conn, item_id, "remove")
    return Changed("remove", done.removed)


async def _hold(
    conn: AsyncConnection[Any], actor: Actor, destination: str, why: str | None, verb: str
) -> Held:
    reason = permit(actor, verb, why)
    suspending = verb == "suspend"
    async with conn.transaction():
        state = await registry.hold_state(conn, destination)
        if state is None:
            raise NotFound(f"no registered destination {destination}")
        already = (state.held_at is not None) == suspending
        if not already:
            hold = registry.suspend if suspending else registry.resume
            await hold(conn, destination, who=actor.name, why=reason)
    return Held(
        destination,
        suspending,
        changed=not already,
        held_by=state.held_by if already else None,
        by_manifest=state.suspended,
    )


async def suspend(
    conn: AsyncConnection[Any], actor: Actor, destination: str, why: str | None = None
) -> Held:
    """Hold ``destination``'s delivery (its worker sends nothing after the attempt in flight);
    audited. A destination held already keeps its first hold (``changed`` False, not audited).

    Raises:
        NotFound: the destination is not registered.
    """
    return await _hold(conn, actor, destination, why, "suspend")


async def resume(
    conn: AsyncConnection[Any], actor: Actor, destination: str, why: str | None = None
) -> Held:
    """Lift the hold on ``destination`` and wake its worker; audited. A destination not held
    is left as it is (``changed`` False, not audited); ``by_manifest`` says whether its
    manifest's ``spec.suspend`` still holds it.

    Raises:
        NotFound: the destination is not registered.
    """
    return await _hold(conn, actor, destination, why, "resume")


async def purge(
    conn: AsyncConnection[Any],
    actor: Actor,
    cutoffs: dict[str, datetime],
    *,
    worklist_cleared_after: int,
    batch: int,
    leases_expired_after: int | None = None,
    dry_run: bool = False,
    partitions: history.Settings | None = None,
    holder: str | None = None,
) -> Purged:
    """The maintenance job: finished items of the hot table older than their state's cutoff
    are deleted; with ``partitions``, the partition work follows
    (:func:`inturn.worker.store.history.upkeep`: finished rows past the hot window move to
    history, the epoch turns with its partitions made ahead, days past the retention are
    dropped whole once what a person still needs is out of them, each drop audited with its
    counts, action ``drop-day``); then cleared worklist items cleared more than
    ``worklist_cleared_after`` seconds ago, in batches; pending items and pending worklist
    items are never touched, nor a finished item that a pending worklist item names (a
    given-up message still to resend: migration 0031). With ``leases_expired_after``
    (seconds), the lease rows of deleted destinations whose lease expired longer ago go too
    (counted as ``leases``: :func:`inturn.worker.store.lease.purge_gone`). ``ran`` is False
    when another purge runs. A real purge records its counts in the audit (action ``purge``,
    who ``actor.name``); ``dry_run`` counts what would go and changes and records nothing.
    ``holder``: the purge singleton's holder (one per process; see
    :func:`inturn.worker.store.actions.purge_held`).

    Raises:
        Invalid: a cutoff for ``pending`` or an unknown state, or a batch out of range.
        psycopg.errors.LockNotAvailable: the move or an ATTACH was refused by its lock
            timeout every try (the rest is left for the next run).
    """
    permit(actor, "purge", None)
    if dry_run:
        would = await actions.purge_count(conn, cutoffs)
        would["worklist cleared"] = await worklist_store.purge_count(conn, worklist_cleared_after)
        if leases_expired_after is not None:
            would["leases"] = await lease.purge_gone_count(conn, leases_expired_after)
        plan = None
        if partitions is not None:
            plan = await history.would(conn, partitions)
            # the rows past their age are deleted before the move (the same rule keeps rows)
            past_age = sum(would[state] for state in cutoffs)
            plan = replace(plan, movable=max(plan.movable - past_age, 0))
        return Purged(ran=True, counts=would, would=plan)
    try:
        async with actions.purge_held(conn, holder) as renew:
            if renew is None:
                return Purged(ran=False)
            # rows past their age first (rows stored before the channel log, kept rows no
            # longer kept): deleted where they are rather than copied to history to be dropped
            counts = await actions.purge_rows(conn, cutoffs, batch=batch, renew=renew)
            upkeep = None
            if partitions is not None:
                upkeep = await history.upkeep(conn, partitions, renew, actor.name)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    counts["worklist cleared"] = await worklist_store.purge(
        conn, worklist_cleared_after, batch=batch
    )
    if leases_expired_after is not None:
        gone = await lease.purge_gone(conn, leases_expired_after, batch=batch)
        counts["leases"] = len(gone)
    async with conn.transaction():
        await audit.record(conn, who=actor.name, action="purge", why=purge_summary(counts))
    return Purged(ran=True, counts=counts, upkeep=upkeep)


def purge_summary(counts: dict[str, int]) -> str:
    """``delivered 3, failed 0, ...``: a purge's counts as one line (the CLI's and the audit's)."""
    return ", ".join(f"{what} {n}" for what, n in counts.items())
