"""The sweeper's rule packs, listed once.

``inturn sweep`` (and anything else that sweeps) asks this module which packs exist, which run
by default, what options each takes and which rules they contribute; nothing else names a pack.
Each pack is a :class:`~inturn.worker.worklist.rules.RulePack` named ``PACK`` in the module
that holds its rules, imported here as an object (import-linter and mypy follow it).

Adding a pack (e.g. ``feeds``):

1. Write its rules in the package of its subject (``worker/<subject>/...``), each an
   ``async def run(conn, *, limit, dry_run, <settings...>) -> RuleOutcome`` that is
   level-triggered, idempotent, most overdue first and bounded by ``limit`` (see
   :mod:`inturn.worker.worklist.rules`); their statements go in ``store/sql/<pack>_rules.sql``
   and run from functions of ``store/<pack>.py`` (only the store runs SQL: an import
   contract says so).
2. In that module declare ``PACK = RulePack(name=..., about=..., rules=..., settings=...,
   options=(PackOption(...), ...), default=...)``: ``rules`` binds the settings to the run
   functions (``functools.partial``), ``options`` lists what ``inturn sweep --only <name>``
   takes (flag, environment variable, default), ``default`` says whether a plain
   ``inturn sweep`` runs it.
3. Add ``<module>.PACK`` to :data:`PACKS` below.
4. Tests: ``tests/integration/test_<pack>_sweep.py`` (the rules on a real Postgres), and a
   line in ``tests/unit/test_sweep_packs.py`` if the pack has options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.errors import Invalid
from inturn.worker.feeds import rules as feed_rules
from inturn.worker.orders import rules as order_rules
from inturn.worker.reservations import sweep as reservation_rules
from inturn.worker.worklist import delivery_rules
from inturn.worker.worklist.publish import Publisher
from inturn.worker.worklist.rules import Rule, RulePack
from inturn.worker.worklist.sweep import DEFAULT_LIMIT, SweepReport
from inturn.worker.worklist.sweep import sweep as run_rules

#: Every rule pack, in the order ``inturn sweep`` runs them.
PACKS: tuple[RulePack[Any], ...] = (
    delivery_rules.PACK,
    feed_rules.PACK,
    order_rules.PACK,
    reservation_rules.PACK,
)

_BY_NAME: dict[str, RulePack[Any]] = {pack.name: pack for pack in PACKS}


class UnknownPack(Invalid):
    """A rule pack no registered pack is named (``inturn sweep --only nope``)."""


def names() -> tuple[str, ...]:
    """Every pack's name, in run order."""
    return tuple(_BY_NAME)


def get(name: str) -> RulePack[Any]:
    """The pack named ``name``.

    Raises:
        UnknownPack: no pack has that name.
    """
    pack = _BY_NAME.get(name)
    if pack is None:
        raise UnknownPack(f"unknown rule pack {name}; expected one of {', '.join(names())}")
    return pack


def chosen(only: Sequence[str] = ()) -> tuple[RulePack[Any], ...]:
    """The packs a sweep runs: those named in ``only`` (in run order), or, when it is empty,
    those that run by default.

    Raises:
        UnknownPack: a name no pack has.
    """
    unknown = sorted(set(only) - set(_BY_NAME))
    if unknown:
        raise UnknownPack(
            f"unknown rule pack {', '.join(unknown)}; expected one of {', '.join(names())}"
        )
    return tuple(p for p in PACKS if (p.name in only if only else p.default))


def select(
    only: Sequence[str] = (), settings: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Rule]:
    """The rules of :func:`chosen` packs, with ``settings[pack name]`` applied to each pack's
    settings (fields of its options; a pack not in ``settings`` runs with its defaults).

    Raises:
        UnknownPack: a name no pack has.
        TypeError: a setting the pack does not have.
    """
    given = settings or {}
    return [r for p in chosen(only) for r in p.configured(**given.get(p.name, {}))]


async def sweep(
    conn: AsyncConnection[Any],
    only: Sequence[str] = (),
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    dry_run: bool = False,
    publishers: list[Publisher] | None = None,
) -> SweepReport:
    """One sweep, the sweeper's action: the rules of the :func:`chosen` packs (with
    ``settings``, see :func:`select`) once each under the sweep lock, announcing what they
    created (:func:`inturn.worker.worklist.sweep.sweep`). ``inturn sweep`` and ``inturn
    local``'s sweeper call it and only format the report.

    Raises:
        UnknownPack: a name no pack has.
        ValueError: ``limit`` below 1.
        psycopg.OperationalError: the database went away.
    """
    rules = select(only, settings)
    return await run_rules(conn, rules, limit=limit, dry_run=dry_run, publishers=publishers)
