"""One sweep: every selected rule once, under the sweep lock, announcing what it created.

Two sweeps never overlap: a sweep holds a session advisory lock for its whole run on its own
connection, and a second one finds it taken and does nothing (a CronJob run that overlaps the
previous one is not an error). Each rule runs on its own; one that fails is reported and the
others still run. A run killed half-way leaves only whole transactions behind, and the next run
(level-triggered) finishes the job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import faults, locks
from inturn.worker.store.lease import holder_id
from inturn.worker.worklist.publish import Publisher, announce
from inturn.worker.worklist.rules import Rule, RuleOutcome

log = logging.getLogger("inturn.worklist.sweep")

#: Records handled per rule and run, at most, unless ``--limit`` says otherwise.
DEFAULT_LIMIT = 500


@dataclass
class RuleResult:
    """One rule's run: its outcome, or the error that stopped it."""

    rule: Rule
    outcome: RuleOutcome = field(default_factory=RuleOutcome)
    error: str | None = None

    def summary(self, dry_run: bool) -> str:
        """One line: ``<rule>: placed N, already there N, cleared N`` (or ``failed: ...``)."""
        if self.error is not None:
            return f"{self.rule.name}: failed: {self.error}"
        o = self.outcome
        verb = "would place" if dry_run else "placed"
        clear = "would clear" if dry_run else "cleared"
        return (
            f"{self.rule.name}: {verb} {o.placed}, already there {o.already}, {clear} {o.cleared}"
        )


@dataclass
class SweepReport:
    """What a sweep did. ``locked`` is False when another sweep was running (nothing ran)."""

    locked: bool
    results: list[RuleResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No rule failed."""
        return all(r.error is None for r in self.results)


async def sweep(
    conn: AsyncConnection[Any],
    rules: list[Rule],
    *,
    limit: int = DEFAULT_LIMIT,
    dry_run: bool = False,
    publishers: list[Publisher] | None = None,
    holder: str | None = None,
) -> SweepReport:
    """Run ``rules`` once each, in order, under the sweep lock.

    Args:
        conn: an autocommit connection; it carries the lock and every rule's transactions.
        limit: records per rule, most overdue first (1 or more).
        dry_run: change nothing; report what would be placed and cleared.
        publishers: told of every created item after its COMMIT.
        holder: the sweep singleton's holder (:func:`~inturn.worker.store.lease.holder_id`
            when None); a sweep tried again with the same one takes its own singleton again.

    Raises:
        ValueError: ``limit`` below 1.
        psycopg.OperationalError: the database went away (the lock goes with it).
        psycopg.Error: a rule met a refusal that waiting can end (the database read-only, a
            lock or statement timeout: :func:`inturn.worker.store.faults.refusal`): the sweep
            stops there, to be tried again whole (the next rules would meet it too).
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    holder = holder or holder_id("sweep")
    held = await locks.take_singleton(conn, "sweep", holder)
    if held is None:
        return SweepReport(locked=False)
    report = SweepReport(locked=True)
    try:
        for rule in rules:
            # renewed per rule: a sweep that died holds the singleton no longer than its ttl
            renewed = await locks.take_singleton(conn, "sweep", holder)
            if renewed is None:
                break  # another sweep took over meanwhile: it runs the rest
            held = renewed
            result = RuleResult(rule)
            try:
                result.outcome = await rule(conn, limit=limit, dry_run=dry_run)
            except Exception as exc:  # one rule's failure must not hide the others' work
                if conn.closed or conn.broken or faults.refusal(exc) is not None:
                    raise
                log.exception("sweep rule %s failed", rule.name)
                result.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            report.results.append(result)
            await announce(result.outcome.placements, publishers or [])
    finally:
        if not (conn.closed or conn.broken):
            await locks.release_singleton(conn, held)
    return report
