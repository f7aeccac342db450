"""The sweeper's rules: what places work because time passed, as plug-ins.

A rule has a name (``destination-stuck``), a group (``delivery``, ``reservations``) and a run
function over a connection, a limit and a dry-run flag. A module declares its rules with
:func:`rule` and is listed in :data:`RULE_MODULES`; ``inturn sweep --only GROUP`` selects groups.

A run function is level-triggered and idempotent: it places an item for every record whose
condition holds now (most overdue first, at most ``limit``), and clears, as ``system`` with a
note, the pending items it placed earlier whose condition no longer holds. Its due-date
conditions are in its SQL and use database time. With ``dry_run`` it changes nothing and reports
what it would have placed and cleared. It returns the placements it created so the sweeper
announces them after they committed.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.worklist.model import Placement

#: Modules whose import registers rules. Add a line to plug in another module's rules.
RULE_MODULES: tuple[str, ...] = (
    "inturn.worker.worklist.delivery_rules",
    "inturn.worker.reservations.sweep",
)


@dataclass
class RuleOutcome:
    """What one rule did in one run.

    Attributes:
        placed: items created (in a dry run: that would have been created).
        already: items whose condition holds and that were already pending.
        cleared: pending items cleared because their condition no longer holds.
        placements: the created placements, to announce after COMMIT (empty in a dry run).
    """

    placed: int = 0
    already: int = 0
    cleared: int = 0
    placements: list[Placement] = field(default_factory=list)

    def add(self, placement: Placement) -> None:
        """Count one placement (created or already there) and keep it for announcing."""
        if placement.created:
            self.placed += 1
            self.placements.append(placement)
        else:
            self.already += 1


RunFunction = Callable[..., Awaitable[RuleOutcome]]
"""``async def run(conn: AsyncConnection, *, limit: int, dry_run: bool) -> RuleOutcome``."""


@dataclass(frozen=True)
class Rule:
    """One sweeper rule: its name, its group and its run function."""

    name: str
    group: str
    run: RunFunction

    async def __call__(
        self, conn: AsyncConnection[Any], *, limit: int, dry_run: bool
    ) -> RuleOutcome:
        """Run the rule once (see the module docstring for what a run must do)."""
        return await self.run(conn, limit=limit, dry_run=dry_run)


_REGISTRY: dict[str, Rule] = {}


def rule(name: str, group: str) -> Callable[[RunFunction], RunFunction]:
    """Decorator registering ``run`` as the rule ``name`` in ``group``.

    Raises:
        ValueError: a rule of that name is already registered by another function.
    """

    def register(run: RunFunction) -> RunFunction:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.run is not run:
            raise ValueError(f"sweeper rule {name!r} is registered twice")
        _REGISTRY[name] = Rule(name, group, run)
        return run

    return register


def all_rules() -> list[Rule]:
    """Every registered rule, after importing :data:`RULE_MODULES`: in the order of that list,
    then in the order each module declares them (whatever imported a module first)."""
    for module in RULE_MODULES:
        importlib.import_module(module)
    rules = list(_REGISTRY.values())
    modules = list(RULE_MODULES)

    def place_of(r: Rule) -> int:
        name = getattr(r.run, "__module__", "")
        return modules.index(name) if name in modules else len(modules)

    return sorted(rules, key=place_of)  # stable: declaration order within a module


def groups() -> list[str]:
    """The rule groups, sorted."""
    return sorted({r.group for r in all_rules()})


def select(only: tuple[str, ...] = ()) -> list[Rule]:
    """The rules of the groups in ``only`` (all rules when empty).

    Raises:
        ValueError: a group no rule belongs to.
    """
    rules = all_rules()
    known = {r.group for r in rules}
    unknown = sorted(set(only) - known)
    if unknown:
        raise ValueError(
            f"unknown rule group {', '.join(unknown)}; expected one of {', '.join(sorted(known))}"
        )
    return [r for r in rules if not only or r.group in only]
