"""The Destination fields of the rule packs: each pack declares its own, this module gathers them.

A pack that reads a field of ``Destination.spec`` (the orders pack's ``replies``, the
reservations pack's ``carriers``) declares it as a :class:`SpecField`, its schema and CEL rules
included, in :attr:`inturn.worker.worklist.pack.Pack.spec_fields`. :func:`pack_fields` finds
them through the packs' entry points (group :data:`ENTRY_POINT_GROUP`, ``inturn.packs``), so
:mod:`.schema` builds ``spec``, the worker configuration's schema and the CRD from whatever
packs are installed, and a pack of another distribution adds its fields without a change here.
The API layer never imports a pack: it reads what the installation's metadata names, once, on
first use.

Which packs: every registered one, whether or not its extra is installed (an inactive pack's
fields are declarations and need none of its dependencies). The generated CRD files are then
the same whichever extras the generating environment has, and a manifest written for a cluster
with a pack stays valid where the pack is not active (its fields are ignored there).

Pure data apart from that one look-up; no I/O library.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from inturn.worker.spec.openapi import Rule, Schema

log = logging.getLogger("inturn.spec.packs")

#: The entry-point group every pack is registered under (see :mod:`inturn.worker.worklist.pack`).
ENTRY_POINT_GROUP = "inturn.packs"

#: Fields that belong to inturn's API itself: no pack may declare one of these.
CORE_FIELDS = frozenset(
    {
        "channel",
        "filter",
        "sender",
        "retry",
        "ackPolicy",
        "idleSeconds",
        "suspend",
        "worker",
        "alerting",
        "schedule",
        "throttle",
        "lanes",
        "expireAfterSeconds",
    }
)


@dataclass(frozen=True)
class SpecField:
    """One field of ``Destination.spec`` that a pack reads.

    Attributes:
        name: its key in ``spec`` (camelCase, e.g. ``replies``); not one of :data:`CORE_FIELDS`.
        schema: builds its structural OpenAPI v3 schema (a fresh dict each call; defaults,
            bounds and descriptions on the nodes, as :mod:`.openapi` builds them).
        rules: CEL rules on the whole ``spec`` that concern this field (``!has(self.x) ||
            ...``), each with its Python twin (:class:`~.openapi.Rule`); placed in ``spec``'s
            ``x-kubernetes-validations`` after inturn's own.
        worker: the worker or ingest needs it: it is copied into the rendered worker
            configuration (``worker.json``) under the same name and declared in its schema, and
            registered with the destination (:func:`pack_spec_of`), where ingest's hooks see it.
    """

    name: str
    schema: Callable[[], Schema]
    rules: tuple[Rule, ...] = ()
    worker: bool = True


#: Pack fields with a place of their own in the worker configuration and the registry (older
#: than the packs' hooks): the orders pack's ``replies``, the reservations pack's ``carriers``.
TYPED_FIELDS = frozenset({"replies", "carriers"})


def pack_spec_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The other pack fields ``spec`` (a Destination's, or a rendered worker configuration)
    sets, by name, as it writes them: those of :func:`pack_fields` with ``worker``, apart from
    :data:`TYPED_FIELDS` (``WorkerConfig.pack_spec``, the registry's ``pack_spec``)."""
    return {
        f.name: spec[f.name]
        for f in pack_fields()
        if f.worker and f.name in spec and f.name not in TYPED_FIELDS
    }


@functools.cache
def pack_fields() -> tuple[SpecField, ...]:
    """The :class:`SpecField` of every registered pack, in pack name order then as each pack
    lists them (a fresh interpreter sees newly installed packs; this one keeps what it found).

    A pack that cannot be loaded, a field that is not a :class:`SpecField`, a name of
    :data:`CORE_FIELDS` or one that another pack declared already is logged and left out: one
    broken plug-in must not take the API down. (The registry of :mod:`inturn.worker.operations.
    packs` logs the pack itself.)
    """
    found: dict[str, tuple[str, SpecField]] = {}
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            plugin = point.load()
        except Exception:  # a broken plug-in: the registry says why
            continue
        for item in getattr(plugin, "spec_fields", ()):
            if not isinstance(item, SpecField):
                log.error("pack %s: spec field %r is not a SpecField", point.name, item)
            elif item.name in CORE_FIELDS:
                log.error("pack %s: spec.%s is inturn's own field", point.name, item.name)
            elif item.name in found:
                other = found[item.name][0]
                log.error(
                    "pack %s: spec.%s is declared by %s already", point.name, item.name, other
                )
            else:
                found[item.name] = (point.name, item)
    return tuple(item for _, item in found.values())
