"""The sweeper's rules and rule packs: what places work because time passed, as plug-ins.

A rule has a name (``destination-stuck``), the name of its pack (``delivery``) and a run
function over a connection, a limit and a dry-run flag. A rule pack (:class:`RulePack`) is the
rules of one subject (delivery, reservations, ...) with their settings; the registry
:mod:`inturn.worker.operations.packs` lists every pack once, and ``inturn sweep --only PACK``
selects packs by name.

A run function is level-triggered and idempotent: it places an item for every record whose
condition holds now (most overdue first, at most ``limit``), and clears, as ``system`` with a
note, the pending items it placed earlier whose condition no longer holds. Its due-date
conditions are in its SQL and use database time. With ``dry_run`` it changes nothing and reports
what it would have placed and cleared. It returns the placements it created so the sweeper
announces them after they committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from psycopg import AsyncConnection

from inturn.worker.store.worklist_model import Placement

S = TypeVar("S")


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
    """One sweeper rule: its name, the name of its pack (``group``) and its run function."""

    name: str
    group: str
    run: RunFunction

    async def __call__(
        self, conn: AsyncConnection[Any], *, limit: int, dry_run: bool
    ) -> RuleOutcome:
        """Run the rule once (see the module docstring for what a run must do)."""
        return await self.run(conn, limit=limit, dry_run=dry_run)


@dataclass(frozen=True)
class PackOption:
    """One setting of a rule pack, as ``inturn sweep`` takes it.

    ``inturn sweep`` offers a pack's options (and shows them in ``--help``) only when that pack
    runs: by default for a pack with ``default=True``, otherwise when ``--only`` names it. So
    a pack's vocabulary stays out of the help and the output of those who do not run it.

    Attributes:
        field: the attribute of the pack's settings this option sets.
        flag: the long option, e.g. ``--pending-after``.
        help: one sentence for ``--help``.
        kind: ``duration`` (seconds, from ``90``, ``30m``, ``6h``, ``7d``), ``switch``
            (``--flag/--no-flag``) or ``many`` (repeatable text; space-separated in the
            environment).
        default: the default as typed on the command line (``"6h"``, ``False``, ``()``).
        envvar: the environment variable read when the option is not given.
        check: normalises the parsed value (a whole tuple for ``many``); raises ValueError
            with a one-line message for a bad one.
    """

    field: str
    flag: str
    help: str
    kind: Literal["duration", "switch", "many"]
    default: str | bool | tuple[str, ...]
    envvar: str | None = None
    check: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class RulePack(Generic[S]):
    """The rules of one subject for ``inturn sweep``, their settings and their options.

    Attributes:
        name: what ``inturn sweep --only`` takes, and each rule's ``group``.
        about: one line for ``inturn sweep --help``.
        rules: the pack's rules, run with the given settings, in the order they run.
        settings: the default settings (a frozen dataclass, or None for a pack without any).
        options: each setting a user may change from the command line or the environment.
        default: whether ``inturn sweep`` without ``--only`` runs the pack. A pack that only
            some installations use (reservations) says False and runs when it is named.
    """

    name: str
    about: str
    rules: Callable[[S], Sequence[Rule]]
    settings: S
    options: tuple[PackOption, ...] = ()
    default: bool = True

    def configured(self, **values: Any) -> list[Rule]:
        """The pack's rules with the settings named in ``values`` changed (option fields).

        Raises:
            TypeError: a value for a field the settings do not have.
        """
        settings = dataclasses.replace(self.settings, **values) if values else self.settings  # type: ignore[type-var]
        return list(self.rules(settings))
