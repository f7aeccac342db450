"""What a rule pack plugs into inturn, and how an installation finds its packs.

A pack is one subject's worklist rules and what goes with them: the delivery rules, feeds,
orders, airline reservations. Each declares one :class:`Pack`, named by an entry point of the
group :data:`ENTRY_POINT_GROUP` (``inturn.packs``) in the metadata of the distribution that
ships it, so that a pack can live in a distribution of its own::

    [project.entry-points."inturn.packs"]
    reservations = "inturn.worker.reservations.sweep:PLUGIN"

The registry (:mod:`inturn.worker.operations.packs`) loads every entry point of the group and
keeps the packs whose :attr:`Pack.requires` can be imported: a pack whose extra is not
installed (``pip install 'inturn[reservations]'``) is not active, so its commands are not
offered, its sweep options are not shown and its dependencies are never imported. Front ends
name no pack: ``inturn sweep`` runs the active packs' rules, ``inturn``'s command list adds
their command groups, ingest and the worker call their hooks (:mod:`.hooks`), and the
Destination schema takes their ``spec`` fields (:mod:`inturn.worker.spec.schema_packs`, which
reads the same entry points). How to write one: ``docs/howto/write-a-pack.md``.

Layer: worklists (the packs above it import it; it imports none of them).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inturn.worker.spec.schema_packs import ENTRY_POINT_GROUP, SpecField
from inturn.worker.worklist.hooks import IngestHook, MarkHook, RecordHook
from inturn.worker.worklist.rules import RulePack

__all__ = ["ENTRY_POINT_GROUP", "Pack", "SpecField"]


@dataclass(frozen=True)
class Pack:
    """One pack's hooks; each is optional.

    Attributes:
        name: the pack's name (``inturn sweep --only NAME``); its entry point's name too.
        sweep: its sweep rules, settings and options (:class:`~.rules.RulePack`), or None.
        commands: command groups it adds to ``inturn``: ``{name: "module:attribute"}`` of a
            click command, imported only when that command runs (``bookings``).
        requires: top-level modules it needs that inturn's own dependencies do not bring
            (``airportsdata``); when one cannot be imported the pack is not active.
        extra: the extra that installs ``requires`` (``pip install 'inturn[EXTRA]'``).
        spec_fields: the ``spec`` fields of a Destination it reads (``replies``,
            ``carriers``), each with its schema and CEL rules
            (:class:`~inturn.worker.spec.schema_packs.SpecField`): the Destination schema, the
            worker configuration's and the CRD take them from here.
        ingest: what ingest computes for a message it stores (:data:`~.hooks.IngestHook`;
            the orders pack's reply keys), or None.
        mark: what the worker adds to a delivered mark (:data:`~.hooks.MarkHook`; the
            orders pack's expected replies), or None.
        record: what ingest notes about every message it accepts (:data:`~.hooks.RecordHook`;
            the feeds pack's last-message times), or None.
    """

    name: str
    sweep: RulePack[Any] | None = None
    commands: Mapping[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    extra: str | None = None
    spec_fields: tuple[SpecField, ...] = ()
    ingest: IngestHook | None = None
    mark: MarkHook | None = None
    record: RecordHook | None = None

    def missing(self) -> list[str]:
        """The modules of :attr:`requires` that cannot be imported here (empty: active)."""
        return [m for m in self.requires if not _importable(m)]

    def install_hint(self) -> str:
        """How to make this pack active (``pip install 'inturn[reservations]'``)."""
        if self.extra:
            return f"pip install 'inturn[{self.extra}]'"
        return "install " + ", ".join(self.requires)


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it (a finder that refuses
    it, or ``sys.modules[module] = None``, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
