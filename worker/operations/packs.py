"""The rule packs of this installation, found once: their sweep rules, commands and hooks.

Packs are found through the entry-point group ``inturn.packs``
(:data:`~inturn.worker.worklist.pack.ENTRY_POINT_GROUP`): each entry point names a
:class:`~inturn.worker.worklist.pack.Pack`. inturn's own four are declared in its
``pyproject.toml``; a pack of another distribution declares its own entry point and needs no
change here or in any front end. A pack whose required modules are missing (its extra is not
installed) is kept apart in :data:`INACTIVE`: its rules do not run, its options and commands
are not offered, and asking for it says which extra to install. Nothing else names a pack:
``inturn sweep``, ``inturn local``'s sweeper and ``inturn``'s command list ask this module, so
do ingest (:func:`answerers`, :func:`answer`: what it computes for a message it stores;
:func:`recorder`: what it notes about every message it accepts) and the worker
(:func:`marker`: what it adds to a delivered mark). How to write a pack, with a worked
example of one in another distribution: ``docs/howto/write-a-pack.md``.

Adding a pack (e.g. ``feeds``):

1. Write its rules in the package of its subject (``worker/<subject>/...``), each an
   ``async def run(conn, *, limit, dry_run, <settings...>) -> RuleOutcome`` that is
   level-triggered, idempotent, most overdue first and bounded by ``limit`` (see
   :mod:`inturn.worker.worklist.rules`); their statements go in
   ``store/sql/<pack>_rules.sql`` and run from functions of ``store/<pack>.py`` (only the
   store runs SQL: an import contract says so).
2. In that module declare ``PACK = RulePack(name=..., about=..., rules=..., settings=...,
   options=(PackOption(...), ...), default=...)`` (``rules`` binds the settings to the run
   functions, ``options`` lists what ``inturn sweep --only <name>`` takes, ``default`` says
   whether a plain ``inturn sweep`` runs it) and ``PLUGIN = Pack(name=..., sweep=PACK, ...)``
   with its command groups, required modules and extra, its ``spec`` fields (``SpecField``s
   in ``worker/<subject>/fields.py``: the schema and the CRDs take them; regenerate the CRDs)
   and its hooks (:mod:`inturn.worker.worklist.hooks`: ``ingest``, ``mark``, ``record``), if any.
3. Name ``PLUGIN`` in the ``[project.entry-points."inturn.packs"]`` table of
   ``pyproject.toml`` (then reinstall: entry points are package metadata).
4. Tests: ``tests/integration/test_<pack>_sweep.py`` (the rules on a real Postgres), and a
   line in ``tests/unit/test_sweep_packs.py`` if the pack has options.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from inturn.worker.errors import Invalid
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store.model import ExpectedReply
from inturn.worker.worklist.hooks import (
    Answerer,
    Answers,
    IngestOptions,
    KeyDigest,
    Marker,
    Recorder,
    Registered,
)
from inturn.worker.worklist.pack import ENTRY_POINT_GROUP, Pack
from inturn.worker.worklist.publish import Publisher
from inturn.worker.worklist.rules import Rule, RulePack
from inturn.worker.worklist.sweep import DEFAULT_LIMIT, SweepReport
from inturn.worker.worklist.sweep import sweep as run_rules

log = logging.getLogger("inturn.operations.packs")


class PacksMissing(RuntimeError):
    """No pack is registered: the installed metadata of inturn predates its entry points (an
    editable install made before they were added); reinstalling fixes it."""


def discover() -> tuple[tuple[Pack, ...], dict[str, Pack]]:
    """Load every entry point of ``inturn.packs``: ``(active packs in run order, inactive
    packs by name)``. The delivery rules run first, the others in name order.

    An entry point that fails to load, or names something that is not a
    :class:`~inturn.worker.worklist.pack.Pack`, is logged and left out (one broken plug-in
    must not take the sweeper down).

    Raises:
        PacksMissing: the group is empty (stale metadata: reinstall inturn).
    """
    found: dict[str, Pack] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = point.load()
        except Exception as exc:  # a broken plug-in, not ours to crash on
            log.error("rule pack %s (%s) cannot be loaded: %s", point.name, point.value, exc)
            continue
        if not isinstance(plugin, Pack) or plugin.name != point.name:
            log.error("entry point %s (%s) is not a Pack of that name", point.name, point.value)
            continue
        found.setdefault(plugin.name, plugin)
    if not found:
        raise PacksMissing(
            f"no rule pack is registered under the entry-point group {ENTRY_POINT_GROUP}: this"
            " installation's metadata is older than its code; reinstall inturn"
            " (pip install -e . or make .venv/.installed)"
        )
    ordered = sorted(found.values(), key=lambda p: (p.name != "delivery", p.name))
    active = tuple(p for p in ordered if not p.missing())
    inactive = {p.name: p for p in ordered if p.missing()}
    return active, inactive


#: The active packs, in the order ``inturn sweep`` runs them.
PLUGINS, INACTIVE = discover()
#: Their sweep rules, in run order.
PACKS: tuple[RulePack[Any], ...] = tuple(p.sweep for p in PLUGINS if p.sweep is not None)

_BY_NAME: dict[str, RulePack[Any]] = {pack.name: pack for pack in PACKS}


def commands() -> dict[str, str]:
    """The command groups of the active packs: ``{name: "module:attribute"}``."""
    return {name: target for p in PLUGINS for name, target in p.commands.items()}


def inactive_command(name: str) -> Pack | None:
    """The inactive pack whose command ``name`` is, or None."""
    return next((p for p in INACTIVE.values() if name in p.commands), None)


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
        raise UnknownPack(_unknown([name]))
    return pack


def chosen(only: Sequence[str] = ()) -> tuple[RulePack[Any], ...]:
    """The packs a sweep runs: those named in ``only`` (in run order), or, when it is empty,
    those that run by default.

    Raises:
        UnknownPack: a name no pack has.
    """
    unknown = sorted(set(only) - set(_BY_NAME))
    if unknown:
        raise UnknownPack(_unknown(unknown))
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
    holder: str | None = None,
) -> SweepReport:
    """One sweep, the sweeper's action: the rules of the :func:`chosen` packs (with
    ``settings``, see :func:`select`) once each under the sweep lock, announcing what they
    created (:func:`inturn.worker.worklist.sweep.sweep`). ``inturn sweep`` and ``inturn
    local``'s sweeper call it and only format the report. ``holder``: the sweep singleton's
    holder (one per process, so that a sweep tried again takes its own singleton again).

    Raises:
        UnknownPack: a name no pack has.
        ValueError: ``limit`` below 1.
        psycopg.OperationalError: the database went away.
    """
    rules = select(only, settings)
    return await run_rules(
        conn, rules, limit=limit, dry_run=dry_run, publishers=publishers, holder=holder
    )


def answerers(destinations: Sequence[Registered]) -> dict[str, tuple[Answerer, ...]]:
    """What ingest computes for the messages of each channel: the active packs' ingest hooks
    (:data:`~inturn.worker.worklist.hooks.IngestHook`) given every registered destination,
    gathered by channel in run order. A channel absent has none (most channels): ingest then
    computes nothing for its messages. Ingest's routing table calls this once per refresh.

    A hook that raises is logged and left out (this table, until the next refresh).
    """
    out: dict[str, list[Answerer]] = {}
    for plugin in PLUGINS:
        if plugin.ingest is None:
            continue
        try:
            found = plugin.ingest(destinations)
        except Exception:  # a broken plug-in must not stop routing
            log.exception("rule pack %s: its ingest hook failed; left out", plugin.name)
            continue
        for channel, answerer in found.items():
            out.setdefault(channel, []).append(answerer)
    return {channel: tuple(found) for channel, found in out.items()}


def answer(
    answering: Sequence[Answerer], message_type: str, payload: bytes, digests: Sequence[KeyDigest]
) -> Answers | None:
    """What the ``answering`` of a channel (from :func:`answerers`) compute for one message of
    ``message_type`` (``CODE^TRIGGER``), together (:meth:`Answers.__or__`); None when none of
    them has anything. An answerer that raises is logged and counts as none."""
    result: Answers | None = None
    for answerer in answering:
        try:
            got = answerer(message_type, payload, digests)
        except Exception:  # the message is stored all the same, without that pack's answers
            log.exception("a rule pack's ingest hook failed on a %s message", message_type)
            continue
        if got is not None:
            result = got if result is None else result | got
    return result


@dataclass(frozen=True)
class _Unkeyed:
    """An expected reply recorded without its key in clear (payload keys given): only the
    keyed digest a reply is matched by is stored; the key itself stays in the sealed message."""

    key: str
    digest: str
    channel: str
    reply_types: tuple[str, ...]
    within_seconds: int


def marker(config: WorkerConfig, digest: KeyDigest, *, keys_in_clear: bool = True) -> Marker | None:
    """What the worker of ``config``'s destination adds to each delivered mark: the markers
    of the active packs' mark hooks (:data:`~inturn.worker.worklist.hooks.MarkHook`) that apply
    to it, as one (their expected replies in run order); None when none applies (most
    destinations): the worker then computes nothing per message. Called once per worker.

    ``keys_in_clear`` False (the worker has payload keys): each expected reply is recorded with
    an empty ``key``, so that no order number of a sealed message is stored in clear (its keyed
    ``digest`` still matches the reply; the number is read from the message when needed).

    A hook that raises is logged and left out (a broken plug-in must not stop delivery).
    """
    found: list[Marker] = []
    for plugin in PLUGINS:
        if plugin.mark is None:
            continue
        try:
            made = plugin.mark(config, digest)
        except Exception:
            log.exception("rule pack %s: its mark hook failed; left out", plugin.name)
            continue
        if made is not None:
            found.append(made)
    if not found:
        return None
    markers = tuple(found)
    if len(markers) == 1 and keys_in_clear:
        return markers[0]

    def every(message_type: str, payload: bytes) -> list[ExpectedReply]:
        found = [e for m in markers for e in m(message_type, payload)]
        if keys_in_clear:
            return found
        return [
            _Unkeyed("", e.digest, e.channel, tuple(e.reply_types), e.within_seconds) for e in found
        ]

    return every


def recorder(options: IngestOptions) -> Recorder | None:
    """What ingest notes about every message it accepts: the recorders of the active packs'
    record hooks (:data:`~inturn.worker.worklist.hooks.RecordHook`) given ingest's ``options``,
    as one; None when none records anything (no ``--feeds``): ingest then spends nothing per
    message. Called once per ingest start.

    A hook that raises is logged and left out (a broken plug-in must not stop ingest).
    """
    found: list[Recorder] = []
    for plugin in PLUGINS:
        if plugin.record is None:
            continue
        try:
            made = plugin.record(options)
        except Exception:
            log.exception("rule pack %s: its record hook failed; left out", plugin.name)
            continue
        if made is not None:
            found.append(made)
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    return _Recorders(tuple(found))


class _Recorders:
    """Several packs' recorders as one :class:`~inturn.worker.worklist.hooks.Recorder` (each
    told of every message, flushed in run order; a flush that raises does not stop the
    others, and the first error is raised after them)."""

    def __init__(self, recorders: tuple[Recorder, ...]) -> None:
        self.recorders = recorders

    def seen(self, channel: str, sending_application: str, sending_facility: str) -> None:
        for r in self.recorders:
            r.seen(channel, sending_application, sending_facility)

    async def declare(self, pool: AsyncConnectionPool) -> None:
        for r in self.recorders:
            await r.declare(pool)

    async def flush(self, pool: AsyncConnectionPool) -> int:
        written, failed = 0, None
        for r in self.recorders:
            try:
                written += await r.flush(pool)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return written

    async def run(self, pool: AsyncConnectionPool, every: float) -> None:
        async with asyncio.TaskGroup() as group:
            for r in self.recorders:
                group.create_task(r.run(pool, every))

    async def close(self, pool: AsyncConnectionPool) -> None:
        for r in self.recorders:
            await r.close(pool)


def _unknown(names_asked: Sequence[str]) -> str:
    """Why ``names_asked`` name no pack: the active ones, and the extra of an inactive one."""
    text = f"unknown rule pack {', '.join(names_asked)}; expected one of {', '.join(names())}"
    for name in names_asked:
        if name in INACTIVE:
            text += f" ({name} is not installed: {INACTIVE[name].install_hint()})"
    return text
