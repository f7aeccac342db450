"""``inturn local``: ingest and one worker per Destination manifest, in one process.

The way to try inturn without a cluster. Manifests are the same YAML files ``kubectl apply``
takes, validated the same way. Without ``--dsn``/``INTURN_DSN`` an embedded Postgres is started
under ``--data-dir`` and kept between runs, so a restarted ``inturn local`` resumes its
backlog. Manifest files are polled: a changed one restarts its worker with the new
configuration, a removed one (gone for :data:`REMOVAL_GRACE_SECONDS`) stops its worker and keeps
its messages (they resume when it comes back). Ctrl-C stops the listeners first, then each
worker (finishing or abandoning its attempt), then the embedded Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import click
import psycopg
import psycopg.errors
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.drain import shutdown
from inturn.worker.drain.health import lanes_text
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.permits import PERMITS_ENV, StatementPermits, permits_from_env
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.errors import Conflict
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.local import budget
from inturn.worker.local import witness as witness_file
from inturn.worker.local.manifests import fingerprint, load_all, manifest_files
from inturn.worker.operations.payload_keys import close_codec, open_codec
from inturn.worker.senders import registry as senders
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.spec.destination import ManifestError
from inturn.worker.spec.replies import to_spec as reply_spec
from inturn.worker.spec.schedule import to_spec
from inturn.worker.store import capacity, faults, locks, reads, registry
from inturn.worker.store.connect import announce_pooling, connect_worker, detect_pooling
from inturn.worker.store.lease import holder_id
from inturn.worker.store.periodic import Periodic
from inturn.worker.text.conditions import Condition
from inturn.worker.worklist.publish import Publisher
from inturn.worker.worklist.publishers import close_all, from_env

log = logging.getLogger("inturn.local")

#: Seconds between two looks at the manifest files.
POLL_SECONDS = 2.0
#: How long a destination's manifest must stay gone before ``inturn local`` removes it (seconds):
#: a file replaced by an editor, ``git checkout`` or a sync tool is missing for a moment, and a
#: removed destination is no longer routed, so the messages of that moment would not reach it.
#: Until then its worker runs and ingest keeps queueing for it.
REMOVAL_GRACE_SECONDS = 10.0
#: Lifetime of the database's ``inturn local`` lease, renewed every :data:`POLL_SECONDS`; a run
#: that died on a direct connection is replaced at once (its session is gone), behind a pooler
#: after this.
LOCAL_LEASE_SECONDS = 30.0
#: How often ``inturn local`` runs the sweeper's default rule packs, by default (seconds):
#: often enough that a stuck destination reaches its worklist within a minute of its threshold.
SWEEP_EVERY_SECONDS = 60.0


def sender_summary(cfg: WorkerConfig) -> str:
    """The sender's credential-free one-line description for the registry (empty when the
    sender cannot be built; that is reported when its worker starts)."""
    try:
        return senders.make_sender(cfg.sender).describe()
    except (OSError, ValueError, TypeError):
        return ""


def _ended(destination: str, task: asyncio.Task[None]) -> None:
    """A worker's task ended: an error it ended with is said here, in one line (its
    exception retrieved: asyncio would print it only at exit)."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    log.error(
        "destination %s: its worker stopped (%s: %s); nothing more is delivered to it"
        " (its messages stay pending) until `inturn local` is started again",
        destination,
        type(exc).__name__,
        text,
    )


@dataclass
class _Running:
    config: WorkerConfig
    worker: DestinationWorker
    stop: asyncio.Event
    task: asyncio.Task[None]


class LocalRunner:
    """Workers for the destinations of a set of manifests, kept in line with the files.

    Args:
        dsn: the database.
        paths: manifest files or directories.
        secrets_dir: where ``<secret>/<key>`` files of secretRefs are (relative: to each file).
        publishers: told of messages placed on ``delivery-failed`` (after COMMIT).
        skip: folders the search of ``paths`` leaves out (the data directory).
        removal_grace: seconds a destination's manifest must stay gone before the destination
            is removed (:data:`REMOVAL_GRACE_SECONDS`; 0: at the first look without it).
        permits: the bound on statements at once that every worker of the process shares
            (:mod:`inturn.worker.drain.permits`); None: no bound.
        room: how many workers the connection budget lets run (:mod:`.budget`); a destination
            beyond it is registered (its messages are queued and kept) but gets no worker, is
            named by :meth:`not_ready` and :meth:`unrun`, and starts when room is made; None:
            no bound.
        over: the one-line cure said for a destination beyond ``room``.
    """

    def __init__(
        self,
        dsn: str,
        paths: list[Path],
        secrets_dir: Path | None = None,
        channels: frozenset[str] | None = None,
        publishers: Sequence[Publisher] = (),
        payloads: PayloadCodec | None = None,
        skip: Sequence[Path] = (),
        removal_grace: float = REMOVAL_GRACE_SECONDS,
        permits: StatementPermits | None = None,
        room: int | None = None,
        over: str = "",
    ) -> None:
        self.dsn = dsn
        self.room = room
        self.over = over
        #: destinations registered whose worker does not run for want of connections -> why
        self._unrun: dict[str, WorkerConfig] = {}
        #: destinations removed (their workers stopped) whose registry row is still to be
        #: marked deleted: the database was away or full when they were removed
        self._unrouted: set[str] = set()
        self.permits = permits
        self.removal_grace = removal_grace
        #: destination -> monotonic time its manifest was first found gone (kept till the grace)
        self._missing: dict[str, float] = {}
        self.skip = tuple(skip)
        self.payloads = payloads
        self.publishers = publishers
        self.paths = paths
        self.secrets_dir = secrets_dir
        self.channels = channels  #: channels with an MLLP listener (None: not known)
        self._invalid = False  #: the last look at the manifests found an invalid one
        self.running: dict[str, _Running] = {}
        self.applied: dict[str, WorkerConfig] = {}
        self._seen: tuple[tuple[str, int, int], ...] = ()
        self.observer = PrometheusObserver()
        #: Workers registered but not started yet (``start(launch=False)``), until
        #: :meth:`launch`; None once launched.
        self._deferred: list[WorkerConfig] | None = None

    async def apply(self, desired: dict[str, WorkerConfig]) -> None:
        """Start, restart and stop workers (and register destinations) to match ``desired``.

        A destination whose carrier another registered destination still serves is not
        applied (logged); the next change of the files tries again.
        """
        desired = self._with_missing(desired)
        if not desired:
            log.warning(
                "no Destination manifest found in %s: nothing will be delivered",
                ", ".join(map(str, self.paths)),
            )
        for dest, cfg in sorted(desired.items()):
            before = self.applied.get(dest)
            unheard = self.channels is not None and cfg.channel not in self.channels
            if unheard and (before is None or before.channel != cfg.channel):
                log.warning(
                    "destination %s takes channel %s, which has no --listen: only HTTP"
                    " ingest can feed it",
                    dest,
                    cfg.channel,
                )
        # A removal needs no database: the worker stops (its connection freed) at once, and
        # the registry follows when the database answers (it may be away, or full).
        for dest in sorted(set(self.applied) - set(desired)):
            await self._stop(dest)
            self.observer.forget(dest)
            self._unrun.pop(dest, None)
            del self.applied[dest]
            self._unrouted.add(dest)
            log.info("destination %s removed: its worker stopped", dest)
        self._unrouted -= set(desired)
        self._fill()
        async with await AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for dest in sorted(self._unrouted):
                await registry.mark_deleted(conn, dest)
                self._unrouted.discard(dest)
                rows = await reads.depth(conn, dest)
                kept = rows[0].pending if rows else 0
                log.info("destination %s: no longer routed, %d pending kept", dest, kept)
            changed = {d: c for d, c in sorted(desired.items()) if self.applied.get(d) != c}
            for dest, cfg in changed.items():  # first let go, so that carriers can move
                await registry.release_carriers(conn, dest, keep=cfg.carriers)
            for dest, cfg in changed.items():
                current = self.running.get(dest)
                namespace, _, name = dest.partition("/")
                try:
                    await registry.register(
                        conn,
                        destination=dest,
                        namespace=namespace,
                        name=name,
                        channel=cfg.channel,
                        message_types=list(cfg.message_types),
                        generation=0,
                        suspended=cfg.suspend,
                        carriers=cfg.carriers,
                        sender_kind=senders.of_config(cfg.sender).name,
                        sender=sender_summary(cfg),
                        stuck_after_seconds=cfg.stuck_after_seconds,
                        expire_after_seconds=cfg.expire_after_seconds,
                        schedule=None if cfg.schedule is None else to_spec(cfg.schedule),
                        replies=[reply_spec(r) for r in cfg.replies] or None,
                        filter_fields=[c.to_spec() for c in cfg.field_conditions] or None,
                        lanes=cfg.lanes,
                        pack_spec=cfg.pack_spec,
                        profile=None if cfg.profile is None else cfg.profile.to_spec(),
                    )
                except registry.CarrierTaken as exc:
                    log.error("destination %s: not applied: %s", dest, exc)
                    desired.pop(dest)
                    continue
                if current is not None:
                    await self._stop(dest)
                    log.info("destination %s changed: worker restarted", dest)
                self._start(cfg)
        self.applied = dict(desired)

    def _with_missing(self, desired: dict[str, WorkerConfig]) -> dict[str, WorkerConfig]:
        """``desired`` plus the applied destinations whose manifest is gone for less than the
        grace (each logged once, when first found gone)."""
        out = dict(desired)
        now = time.monotonic()
        for dest in list(self._missing):
            if dest in desired or dest not in self.applied:
                del self._missing[dest]
        for dest in sorted(set(self.applied) - set(desired)):
            since = self._missing.get(dest)
            if since is None:
                since = self._missing[dest] = now
                if self.removal_grace > 0:
                    log.info(
                        "destination %s: its manifest is gone; removed in %.0f s unless it"
                        " comes back (its worker runs and it is routed meanwhile)",
                        dest,
                        self.removal_grace,
                    )
            if now - since < self.removal_grace:
                out[dest] = self.applied[dest]
            else:
                del self._missing[dest]
        return out

    def not_ready(self) -> str | None:
        """Why ``inturn local`` is not ready beyond ingest: each worker whose step keeps
        failing on a live session (the delivered mark on a full disk) or that has stopped, as
        ``destination: why`` joined by ``; ``; None when there is none (a receiver that is down
        is the worker's own business, not readiness)."""
        state = {
            dest: why
            for dest, running in self.running.items()
            if (
                why := running.worker.state.refused
                or running.worker.state.trouble
                or running.worker.state.failure
            )
        }
        state.update(self.unrun())
        return "; ".join(f"{dest}: {why}" for dest, why in sorted(state.items())) or None

    def unrun(self) -> dict[str, str]:
        """Destinations of the manifests that have no worker running for want of connections,
        each with why: registered beyond the connection budget (:attr:`room`), or a worker whose
        session the database refuses (too many connections)."""
        out = {dest: f"no worker: {self.over}" for dest in self._unrun}
        for dest, running in self.running.items():
            if running.worker.state.refused is not None:
                out[dest] = f"no worker session: {running.worker.state.refused}"
        return out

    def _fill(self) -> None:
        """Start the destinations waiting for room, in name order, as far as room allows."""
        for dest in sorted(self._unrun):
            if not self._has_room():
                return
            cfg = self._unrun.pop(dest)
            log.info("destination %s: room in the connection budget: its worker starts", dest)
            self._start(cfg)

    def _has_room(self) -> bool:
        taken = len(self.running) + len(self._deferred or ())
        return self.room is None or taken < self.room

    def _removal_due(self) -> bool:
        if self._invalid:  # all or nothing: the removal waits for valid manifests
            return False
        now = time.monotonic()
        return any(now - since >= self.removal_grace for since in self._missing.values())

    def _start(self, cfg: WorkerConfig) -> None:
        self._unrun.pop(cfg.destination, None)
        if not self._has_room():
            self._unrun[cfg.destination] = cfg
            log.error(
                "destination %s: no worker: %s (its messages are queued and kept; /readyz"
                " names it)",
                cfg.destination,
                self.over,
            )
            return
        if self._deferred is not None:
            self._deferred.append(cfg)
            return
        try:
            sender = senders.make_sender(cfg.sender, body_charset=cfg.body_charset)
        except (OSError, ValueError) as exc:  # e.g. a TLS file named by a secretRef is missing
            log.error(
                "destination %s: not started, its sender cannot be built: %s", cfg.destination, exc
            )
            return
        stop = asyncio.Event()
        worker = DestinationWorker(
            cfg,
            self.dsn,
            sender,
            self.observer,
            self.publishers,
            payloads=self.payloads,
            permits=self.permits,
        )
        task = asyncio.create_task(worker.run(stop), name=f"worker {cfg.destination}")
        task.add_done_callback(partial(_ended, cfg.destination))
        self.running[cfg.destination] = _Running(cfg, worker, stop, task)
        log.info(
            "destination %s: channel %s -> %s%s",
            cfg.destination,
            cfg.channel,
            worker.sender.describe(),
            " (suspended)" if cfg.suspend else "",
        )

    async def _stop(self, dest: str) -> None:
        self._unrun.pop(dest, None)
        running = self.running.pop(dest, None)
        if running is None:
            return
        running.stop.set()
        await running.task

    async def poll(self) -> None:
        """Reload the manifests if any file changed; an invalid file keeps the last good state."""
        seen = fingerprint(manifest_files(self.paths, self.skip))
        if seen == self._seen and not self._removal_due():
            return
        self._seen = seen
        try:
            desired = load_all(self.paths, self.secrets_dir, self.skip)
        except (ManifestError, click.ClickException, OSError) as exc:
            message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            log.error("manifests not applied: %s", message)
            self._invalid = True
            return
        if self._invalid:
            self._invalid = False
            log.info("manifests valid again: applying them")
        try:
            await self.apply(desired)
        except psycopg.OperationalError:  # the database is away: apply them at the next look
            self._seen = ()
            raise

    async def start(self, *, launch: bool = True) -> None:
        """Load the manifests (failing on an invalid one), register their destinations and start
        their workers (with ``launch`` False, only once :meth:`launch` is called: ``inturn
        local`` binds its listeners in between, so that a taken port stops it before any worker
        has sent anything).

        ``inturn local`` owns the destination registry of its database: destinations registered
        by an earlier run whose manifests are gone are marked deleted, so ingest stops queueing
        for them (their messages are kept and resume if the manifest comes back).
        """
        self._seen = fingerprint(manifest_files(self.paths, self.skip))
        desired = load_all(self.paths, self.secrets_dir, self.skip)
        async with await AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for row in await registry.list_all(conn):
                if not row.deleted and row.destination not in desired:
                    await registry.mark_deleted(conn, row.destination)
                    log.info(
                        "destination %s: no manifest any more, not routed (messages kept)",
                        row.destination,
                    )
        if not launch:
            self._deferred = []
        await self.apply(desired)

    def lanes(self) -> str:
        """What ``GET /lanes`` on ``--ops`` says: the running workers' lanes, as a worker's own
        HTTP port says it (:func:`inturn.worker.drain.health.lanes_text`)."""
        return lanes_text([r.worker for r in self.running.values()])

    def launch(self) -> None:
        """Start the workers :meth:`start` registered without starting (idempotent)."""
        deferred, self._deferred = self._deferred or [], None
        for cfg in deferred:
            self._start(cfg)

    async def stop(self, abandon: asyncio.Event | None = None) -> None:
        """Stop every worker: each finishes its attempt in flight (saying so), unless
        ``abandon`` is set meanwhile, which cancels them (the messages stay pending)."""
        for running in self.running.values():
            running.stop.set()
        await shutdown.finish(
            [(r.worker, r.task) for r in self.running.values()], abandon or asyncio.Event()
        )
        self.running.clear()


async def sweep_loop(
    dsn: str, every: float, stop: asyncio.Event, publishers: Sequence[Publisher]
) -> None:
    """Run the sweeper's default rule packs (``inturn sweep``) every ``every`` seconds until
    ``stop`` is set, the first time after one interval.

    What a run placed or cleared is logged, one line per rule that did something; a failing
    rule or an unreachable database is logged and the next run tries again. Two sweeps never
    overlap (the sweep lock), so an ``inturn sweep`` run by hand at the same time is harmless.
    """
    await sweeper(dsn, every, publishers).forever(stop)


def sweeper(dsn: str, every: float, publishers: Sequence[Publisher]) -> Periodic:
    """The sweep of :func:`sweep_loop` as a periodic statement: a refusal (the database
    read-only, a lock timeout, the connection gone) is said once when it begins and once when it
    ends, and tried again after a bounded backoff (:mod:`inturn.worker.store.periodic`)."""
    from inturn.worker.operations import packs

    async def once() -> None:
        async with await AsyncConnection.connect(
            dsn, autocommit=True, application_name="inturn-local-sweep"
        ) as conn:
            report = await packs.sweep(conn, publishers=list(publishers))
        for result in report.results:
            o = result.outcome
            if result.error is not None or o.placed or o.cleared:
                log.info("sweep: %s", result.summary(dry_run=False))

    return Periodic(log, "the sweep", every, once, cure=f"every {every:g}s")


class DatabaseInUse(Conflict):
    """Another ``inturn local`` already runs on this database (it owns its registry)."""


class OverBudget(Conflict):
    """The server does not let ``inturn local`` open the connections its destinations need
    (:mod:`.budget`); the message names the numbers and the setting to change."""


async def connection_room(
    conn: AsyncConnection[Any],
    dsn: str,
    plan: budget.Budget,
    destinations: int,
    *,
    embedded: bool,
) -> tuple[int, str]:
    """Hold the run's connection budget against the server's limit: how many workers fit
    beside everything else (``plan.fixed``), and the one-line cure for a destination beyond
    them. Logged at start.

    Raises:
        OverBudget: the ``destinations`` of the manifests do not fit.
        psycopg.Error: the limits could not be read.
    """
    limits = await capacity.limits(conn, dsn)
    need = plan.with_workers(destinations)
    over = budget.over_text(need, limits.max_connections, limits.usable, embedded=embedded)
    if need.total > limits.usable:
        raise OverBudget(over)
    log.info(
        "connection budget: %s of the %d the server lets it open (max_connections %d)",
        need.describe(),
        limits.usable,
        limits.max_connections,
    )
    room = limits.usable - plan.fixed
    where = f"{room} workers fit beside the rest (max_connections {limits.max_connections})"
    if embedded:
        return room, (
            f"over the connection budget: {where}; restart inturn local, which raises the"
            " embedded server's max_connections to fit"
        )
    return room, (
        f"over the connection budget: {where}; raise max_connections on the server, lower"
        f" {budget.SPARE_ENV}, or run fewer destinations"
    )


def in_use(pooled: bool) -> str:
    """Why a second ``inturn local`` is refused. On a direct connection the holder's session is
    alive (a dead one's ends with its process), so it runs. Behind a transaction-mode pooler no
    backend tells: the holder is judged by its lease alone, which a killed one leaves to expire
    :data:`LOCAL_LEASE_SECONDS` after its last renewal."""
    text = "this database is in use by another inturn local (it owns the destination registry)"
    if not pooled:
        return text + ": stop it, or give this one a database of its own"
    return (
        f"{text}, or was until lately: behind a pooler the holder is judged by its lease, which"
        f" expires within {LOCAL_LEASE_SECONDS:g} s of its last renewal (a killed inturn local's"
        " too): if none runs any more, wait that long and start again; else stop the other, or"
        " give this one a database of its own"
    )


async def run_local(
    dsn: str,
    paths: list[Path],
    ingest_config: IngestConfig,
    secrets_dir: Path | None,
    stop: asyncio.Event,
    abandon: asyncio.Event | None = None,
    sweep_every: float | None = SWEEP_EVERY_SECONDS,
    skip: Sequence[Path] = (),
    witness: Path | None = None,
    witness_keyed: bool = False,
    console: bool = False,
    embedded: bool = False,
    runners: list[LocalRunner] | None = None,
) -> None:
    """Run ingest, the workers and (every ``sweep_every`` seconds; None: never) the sweeper
    until ``stop`` is set, then shut them down in order (``abandon``, set while stopping,
    cancels the attempts still in flight). ``skip``: folders the manifest search leaves out
    (the data directory). ``witness``: the restore witness file (:mod:`.witness`; None: none
    kept): looked at before the workers start and once every ``INTURN_RESTORE_TICK_SECONDS``;
    ``witness_keyed``: it keeps one witness per database (a database ``--dsn`` names).

    The run holds the database's ``inturn local`` lease from start to end: a second
    ``inturn local`` on the same database would retire this one's destinations (they are not
    in its manifests), and messages for them would no longer be routed.

    The connections it opens are counted (:mod:`.budget`, ``console``: a console runs beside
    it) and held against the server's ``max_connections`` before anything starts; a
    destination the manifests add later beyond them gets no worker (``/readyz`` names it);
    ``embedded``: the server is ``inturn local``'s own (the cure said is a restart).
    ``runners``: the run's :class:`LocalRunner` is appended to it once made (the console
    beside it asks it which destinations have no worker).

    Raises:
        DatabaseInUse: another ``inturn local`` holds the lock; nothing was started.
        OverBudget: the manifests' destinations need more connections than the server lets it
            open; nothing was started.
    """
    announce_pooling()
    owner = await connect_worker(dsn, application_name="inturn-local")
    holder = holder_id("local")
    # this run's own (a process may run inturn local more than once: a test process)
    lease_condition = Condition(log, LEASE_WHAT)
    witness_condition = Condition(log, WITNESS_WHAT)
    held: locks.Singleton | None = None
    try:
        held = await locks.take_singleton(owner, "local", holder, LOCAL_LEASE_SECONDS)
        if held is None:
            raise DatabaseInUse(in_use((await detect_pooling(dsn)).pooled))
        channels = frozenset(listener.channel for listener in ingest_config.listeners)
        publishers = from_env(os.environ, dsn)
        payloads = await open_codec(
            ingest_config.payload_keys,
            ingest_config.key_dsn,
            application_name="inturn-local-keys",
        )
        plan = budget.budget(
            0,
            ingest_pool=ingest_config.pool_size,
            console=console,
            encrypted=bool(ingest_config.payload_keys),
        )
        room, over = await connection_room(
            owner, dsn, plan, len(load_all(paths, secrets_dir, skip)), embedded=embedded
        )
        permits = permits_from_env()
        if permits is not None:
            log.info(
                "worker statements at once: at most %d (%s; 0: no bound)",
                permits.limit,
                PERMITS_ENV,
            )
        runner = LocalRunner(
            dsn,
            paths,
            secrets_dir,
            channels,
            publishers,
            payloads,
            skip,
            removal_grace=removal_grace_seconds(),
            permits=permits,
            room=room,
            over=over,
        )
        if runners is not None:
            runners.append(runner)
        await runner.start(launch=False)  # registered: ingest routes to them from its start
        ingest = Ingest(ingest_config, dsn=dsn, lanes=runner.lanes, also_ready=runner.not_ready)
        sweeper = None
        if sweep_every is not None:
            sweeper = asyncio.create_task(
                sweep_loop(dsn, sweep_every, stop, publishers), name="sweeper"
            )
            log.info("the sweeper runs every %gs (--sweep-every)", sweep_every)
        try:
            await ingest.start()  # every listener bound (or AddressInUse) before any worker
            next_look = await _look_for_restore(
                owner, witness, 0.0, witness_condition, witness_keyed
            )
            runner.launch()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_SECONDS)
                if not stop.is_set():
                    owner, held = await _keep_local(dsn, owner, holder, held, stop, lease_condition)
                    next_look = await _look_for_restore(
                        owner, witness, next_look, witness_condition, witness_keyed
                    )
                    try:
                        await runner.poll()
                    except (*DATABASE_AWAY, psycopg.Error) as exc:  # _keep_local says why
                        if faults.refusal(exc) is None:
                            raise
            log.info("stopping: listeners first, then workers")
        finally:
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            await ingest.stop()
            await runner.stop(abandon)
            await close_all(publishers)
            await close_codec(payloads)
    finally:
        with contextlib.suppress(Exception):
            if held is not None:
                await locks.release_singleton(owner, held)
            await owner.close()


async def _look_for_restore(
    conn: AsyncConnection[Any],
    path: Path | None,
    due: float,
    condition: Condition,
    keyed: bool = False,
) -> float:
    """Look at the restore witness when ``due`` (a monotonic time) has come; the next due
    time. A failed look (the database, or the file's folder: a full disk) is logged and
    tried again at the next poll, the folder's failure as ``condition``; ``keyed``: the file
    keeps one witness per database (:func:`inturn.worker.local.witness.look`)."""
    now = time.monotonic()
    if path is None or now < due or conn.closed or conn.broken:
        return due
    try:
        await witness_file.look(conn, path, keyed=keyed)
    except psycopg.Error as exc:
        log.warning("restore witness: the database failed (%s); looked at again", exc)
        return due
    except OSError as exc:  # its own folder: a full disk must not end inturn local
        condition.failed(
            f"{path}: {exc.strerror or exc}", "free space there; the clock waits for it"
        )
        return due
    condition.succeeded()
    return now + restore_tick_seconds()


def removal_grace_seconds() -> float:
    """``INTURN_REMOVAL_GRACE_SECONDS`` (default :data:`REMOVAL_GRACE_SECONDS`; 0 or more)."""
    try:
        value = float(os.environ.get("INTURN_REMOVAL_GRACE_SECONDS", REMOVAL_GRACE_SECONDS))
    except ValueError:
        return REMOVAL_GRACE_SECONDS
    return value if value >= 0 else REMOVAL_GRACE_SECONDS


def restore_tick_seconds() -> float:
    """``INTURN_RESTORE_TICK_SECONDS`` (default 60, as the operator's)."""
    try:
        value = float(os.environ.get("INTURN_RESTORE_TICK_SECONDS", "60"))
    except ValueError:
        return 60.0
    return value if value > 0 else 60.0


#: The renewal of the ``inturn local`` lease, refused for a while: one line when it begins,
#: one when it ends (each run's :class:`inturn.worker.text.conditions.Condition`).
LEASE_WHAT = "renewing the inturn local lease"
#: Recording the restore witness in the data folder, refused by the file system (a full disk).
WITNESS_WHAT = "recording the restore witness"

#: What a lost or unreachable database raises here (the embedded Postgres restarting, a
#: failover): the run waits for it rather than ending.
DATABASE_AWAY = (psycopg.OperationalError, psycopg.errors.AdminShutdown)


async def _keep_local(
    dsn: str,
    owner: AsyncConnection[Any],
    holder: str,
    held: locks.Singleton | None,
    stop: asyncio.Event,
    condition: Condition,
) -> tuple[AsyncConnection[Any], locks.Singleton | None]:
    """Renew the database's ``inturn local`` lease (on a new connection when the last one was
    lost: the database restarted); stop the run if another took it over (this one stalled past
    its lifetime). A database that cannot be reached is logged and looked at again next time,
    as ``condition`` (the run's): ingest and the workers wait for it on their own."""
    try:
        if owner.closed or owner.broken:
            owner = await connect_worker(dsn, application_name="inturn-local")
        renewed = await locks.take_singleton(owner, "local", holder, LOCAL_LEASE_SECONDS)
    except (*DATABASE_AWAY, psycopg.Error) as exc:
        cause = faults.refusal(exc)
        if cause is None:
            raise
        if owner.broken:
            with contextlib.suppress(Exception):
                await owner.close()
        # A refusal (read-only for maintenance, a timeout, the database restarting): the lease
        # is kept until it expires, the listeners and workers go on, and this is tried again.
        condition.failed(
            cause, f"every {POLL_SECONDS:g}s; the lease lasts {LOCAL_LEASE_SECONDS:g}s"
        )
        return owner, held
    condition.succeeded()
    if renewed is None:
        log.error("another inturn local took this database over; stopping")
        stop.set()
        return owner, held
    return owner, renewed
