"""One rule, one worklist, place and clear: what every level-triggered sweep rule does.

A rule's stale query returns ``record_key`` and ``why`` per pending item to clear (the note a
person reads); items are cleared in one :func:`~inturn.worker.store.worklist.clear_where` per
distinct note, audited like every clear (:func:`clear_stale`). :class:`RuleWorklist` holds what a
rule's items share (queue, record kind, reason, who places them) and runs the whole turn
(:meth:`RuleWorklist.place_and_clear`): clear what no longer holds, place what is due in one
statement, count what was already there, change nothing in a dry run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg import AsyncConnection

from inturn.worker.store.worklist import NewPlacement, clear_where, place_many
from inturn.worker.worklist.rules import RuleOutcome

R = TypeVar("R")


async def clear_stale(
    conn: AsyncConnection[Any],
    rows: Iterable[Mapping[str, Any]],
    *,
    record_kind: str,
    queue: str,
    reason: str,
) -> int:
    """Clear the pending ``queue``/``reason`` items of ``rows`` (``record_key``, ``why``) by
    ``system`` with ``why`` as the note; return how many were cleared (an item cleared by
    someone meanwhile is not counted)."""
    by_why: dict[str, list[str]] = {}
    for row in rows:
        by_why.setdefault(str(row["why"]), []).append(str(row["record_key"]))
    cleared = 0
    for why, keys in sorted(by_why.items()):
        done = await clear_where(
            conn, record_kind=record_kind, record_keys=keys, queue=queue, reason=reason, note=why
        )
        cleared += len(done)
    return cleared


@dataclass(frozen=True)
class RuleWorklist:
    """What the items of one rule share: its worklist (``queue``), the kind of record it names,
    its reason code and who places them.

    Attributes:
        queue: the worklist, e.g. ``feeds``.
        record_kind: what an item's ``record_key`` names, e.g. ``feed``.
        reason: the rule's reason code, e.g. ``feed-silent``.
        placed_by: who places the items (``sweeper``).
    """

    queue: str
    record_kind: str
    reason: str
    placed_by: str = "sweeper"

    def placement(self, record_key: str, details: Mapping[str, Any]) -> NewPlacement:
        """The item to place for ``record_key``, with ``details`` (a small JSON object)."""
        return NewPlacement(
            queue=self.queue,
            record_kind=self.record_kind,
            record_key=record_key,
            reason=self.reason,
            details=dict(details),
            placed_by=self.placed_by,
        )

    async def place_and_clear(
        self,
        conn: AsyncConnection[Any],
        *,
        dry_run: bool,
        stale: Sequence[Mapping[str, Any]],
        pending: int,
        due: Sequence[R],
        item: Callable[[R], tuple[str, Mapping[str, Any]]],
        then: Callable[[Sequence[R]], Awaitable[None]] | None = None,
    ) -> RuleOutcome:
        """One turn of the rule, from what its queries found.

        Args:
            stale: the pending items whose condition no longer holds (``record_key``,
                ``why``), cleared by ``system`` with ``why`` as the note.
            pending: the rule's pending items before this turn (``already`` counts those
                not cleared now).
            due: the records to place, most overdue first (the query's ``limit`` applied).
            item: ``(record_key, details)`` of a due record.
            then: run with ``due`` in the transaction that places them (e.g. marking the
                records raised), so both commit or neither does.

        Returns:
            What it placed, found already there and cleared; in a dry run what it would
            have placed and cleared, changing nothing.
        """
        outcome = RuleOutcome()
        if dry_run:
            outcome.placed, outcome.cleared, outcome.already = len(due), len(stale), pending
            return outcome
        cleared = await clear_stale(
            conn, stale, record_kind=self.record_kind, queue=self.queue, reason=self.reason
        )
        outcome.cleared, outcome.already = cleared, pending - cleared
        if not due:
            return outcome
        async with conn.transaction():
            placements = await place_many(conn, [self.placement(*item(r)) for r in due])
            if then is not None:
                await then(due)
        for placement in placements:
            outcome.add(placement)
        return outcome
