"""``inturn local``: ingest and one worker per Destination manifest, in one process.

The way to try inturn without a cluster. Manifests are the same YAML files ``kubectl apply``
takes, validated the same way. Without ``--dsn``/``INTURN_DSN`` an embedded Postgres is started
under ``--data-dir`` and kept between runs, so a restarted ``inturn local`` resumes its
backlog. Manifest files are polled: a changed one restarts its worker with the new
configuration, a removed one stops its worker and keeps its messages (they resume when it comes
back). Ctrl-C stops the listeners first, then each worker (finishing or abandoning its attempt),
then the embedded Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
from psycopg import AsyncConnection

from inturn.worker.cli.ingest import parse_address, parse_listen
from inturn.worker.cli.options import (
    DURATION,
    dsn_option,
    feeds_option,
    load_feeds_file,
    logging_options,
    start_tracing,
)
from inturn.worker.drain import shutdown
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.errors import Conflict
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest
from inturn.worker.local.embedded import DataDirInUse, DataDirLock, start_embedded
from inturn.worker.senders import registry as senders
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.spec.destination import ManifestError, load_file
from inturn.worker.spec.replies import to_spec as reply_spec
from inturn.worker.spec.schedule import to_spec
from inturn.worker.store import locks, reads, registry
from inturn.worker.store.connect import DsnError, connect_worker, normalize_dsn
from inturn.worker.store.migrate import migrate
from inturn.worker.text.logs import configure
from inturn.worker.worklist.publish import Publisher
from inturn.worker.worklist.publishers import close_all, from_env

if TYPE_CHECKING:
    from inturn.worker.console.auth import AuthConfig

log = logging.getLogger("inturn.local")

#: Seconds between two looks at the manifest files.
POLL_SECONDS = 2.0
#: How often ``inturn local`` runs the sweeper's default rule packs, by default (seconds):
#: often enough that a stuck destination reaches its worklist within a minute of its threshold.
SWEEP_EVERY_SECONDS = 60.0
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def check_sender(cfg: WorkerConfig) -> None:
    """Run the sender kind's start-up checks (its files exist, it can be built), so that a
    missing TLS file or key is reported before anything starts.

    Raises:
        click.ClickException: a check failed (the message names the destination).
    """
    problem = senders.first_problem(cfg.destination, cfg.sender)
    if problem is not None:
        raise click.ClickException(problem)


def local_console_auth(path: Path | None) -> AuthConfig:
    """The console's identities for ``inturn local``: the auth file when given, else every
    caller on the loopback interface is ``<user>@local`` with every role (logged as open).

    Raises:
        click.ClickException: the auth file is invalid.
    """
    from inturn.worker.console.auth import ROLES, AuthConfig, AuthConfigError, Identity, load_auth

    if path is not None:
        try:
            return load_auth(path)
        except AuthConfigError as exc:
            raise click.ClickException(str(exc)) from None
    name = f"{getpass.getuser()}@local"
    log.warning("console: OPEN to every local user as %s (pass --console-auth to restrict)", name)
    return AuthConfig(loopback=Identity(name=name, roles=frozenset(ROLES)))


def sender_summary(cfg: WorkerConfig) -> str:
    """The sender's credential-free one-line description for the registry (empty when the
    sender cannot be built; that is reported when its worker starts)."""
    try:
        return senders.make_sender(cfg.sender).describe()
    except (OSError, ValueError, TypeError):
        return ""


def manifest_files(paths: list[Path]) -> list[Path]:
    """The manifest files under ``paths`` (files as given; directories searched recursively
    for ``*.yaml``, ``*.yml`` and ``*.json``), sorted."""
    found: set[Path] = set()
    for path in paths:
        if path.is_dir():
            found.update(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES)
        elif path.exists():
            found.add(path)
    return sorted(found)


def fingerprint(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """What changes when a file is added, removed or edited (path, mtime ns, size)."""
    out = []
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


def load_all(paths: list[Path], secrets_dir: Path | None) -> dict[str, WorkerConfig]:
    """Load every Destination found under ``paths``, keyed by ``namespace/name``.

    Raises:
        ManifestError: a file is invalid (the message names the file and the field).
        click.ClickException: two files declare the same destination, or none is found.
    """
    configs: dict[str, WorkerConfig] = {}
    served: dict[str, str] = {}
    files = manifest_files(paths)
    for f in files:
        for cfg in load_file(f, secrets_dir=secrets_dir):
            if cfg.destination in configs:
                raise click.ClickException(f"{f}: destination {cfg.destination} is declared twice")
            for carrier in cfg.carriers:
                if carrier in served:
                    raise click.ClickException(
                        f"{f}: {cfg.destination}: spec.carriers: {carrier} is already served"
                        f" by {served[carrier]}"
                    )
                served[carrier] = cfg.destination
            configs[cfg.destination] = cfg
    return configs


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
    """

    def __init__(
        self,
        dsn: str,
        paths: list[Path],
        secrets_dir: Path | None = None,
        channels: frozenset[str] | None = None,
        publishers: Sequence[Publisher] = (),
    ) -> None:
        self.dsn = dsn
        self.publishers = publishers
        self.paths = paths
        self.secrets_dir = secrets_dir
        self.channels = channels  #: channels with an MLLP listener (None: not known)
        self._invalid = False  #: the last look at the manifests found an invalid one
        self.running: dict[str, _Running] = {}
        self.applied: dict[str, WorkerConfig] = {}
        self._seen: tuple[tuple[str, int, int], ...] = ()
        self.observer = PrometheusObserver()

    async def apply(self, desired: dict[str, WorkerConfig]) -> None:
        """Start, restart and stop workers (and register destinations) to match ``desired``.

        A destination whose carrier another registered destination still serves is not
        applied (logged); the next change of the files tries again.
        """
        desired = dict(desired)
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
        async with await AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for dest in sorted(set(self.applied) - set(desired)):
                await self._stop(dest)
                await registry.mark_deleted(conn, dest)
                rows = await reads.depth(conn, dest)
                kept = rows[0].pending if rows else 0
                log.info("destination %s removed: worker stopped, %d pending kept", dest, kept)
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

    def _start(self, cfg: WorkerConfig) -> None:
        try:
            sender = senders.make_sender(cfg.sender)
        except (OSError, ValueError) as exc:  # e.g. a TLS file named by a secretRef is missing
            log.error(
                "destination %s: not started, its sender cannot be built: %s", cfg.destination, exc
            )
            return
        stop = asyncio.Event()
        worker = DestinationWorker(cfg, self.dsn, sender, self.observer, self.publishers)
        task = asyncio.create_task(worker.run(stop), name=f"worker {cfg.destination}")
        self.running[cfg.destination] = _Running(cfg, worker, stop, task)
        log.info(
            "destination %s: channel %s -> %s%s",
            cfg.destination,
            cfg.channel,
            worker.sender.describe(),
            " (suspended)" if cfg.suspend else "",
        )

    async def _stop(self, dest: str) -> None:
        running = self.running.pop(dest, None)
        if running is None:
            return
        running.stop.set()
        await running.task

    async def poll(self) -> None:
        """Reload the manifests if any file changed; an invalid file keeps the last good state."""
        seen = fingerprint(manifest_files(self.paths))
        if seen == self._seen:
            return
        self._seen = seen
        try:
            desired = load_all(self.paths, self.secrets_dir)
        except (ManifestError, click.ClickException, OSError) as exc:
            message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            log.error("manifests not applied: %s", message)
            self._invalid = True
            return
        if self._invalid:
            self._invalid = False
            log.info("manifests valid again: applying them")
        await self.apply(desired)

    async def start(self) -> None:
        """Load the manifests (failing on an invalid one) and start their workers.

        ``inturn local`` owns the destination registry of its database: destinations registered
        by an earlier run whose manifests are gone are marked deleted, so ingest stops queueing
        for them (their messages are kept and resume if the manifest comes back).
        """
        self._seen = fingerprint(manifest_files(self.paths))
        desired = load_all(self.paths, self.secrets_dir)
        async with await AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for row in await registry.list_all(conn):
                if not row.deleted and row.destination not in desired:
                    await registry.mark_deleted(conn, row.destination)
                    log.info(
                        "destination %s: no manifest any more, not routed (messages kept)",
                        row.destination,
                    )
        await self.apply(desired)

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
    from inturn.worker.operations import packs

    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            return
        try:
            async with await AsyncConnection.connect(
                dsn, autocommit=True, application_name="inturn-local-sweep"
            ) as conn:
                report = await packs.sweep(conn, publishers=list(publishers))
        except Exception as exc:  # a sweep that fails is retried at the next interval
            log.error("sweep failed (next run in %gs): %s", every, exc)
            continue
        for result in report.results:
            o = result.outcome
            if result.error is not None or o.placed or o.cleared:
                log.info("sweep: %s", result.summary(dry_run=False))


class DatabaseInUse(Conflict):
    """Another ``inturn local`` already runs on this database (it owns its registry)."""


async def run_local(
    dsn: str,
    paths: list[Path],
    ingest_config: IngestConfig,
    secrets_dir: Path | None,
    stop: asyncio.Event,
    abandon: asyncio.Event | None = None,
    sweep_every: float | None = SWEEP_EVERY_SECONDS,
) -> None:
    """Run ingest, the workers and (every ``sweep_every`` seconds; None: never) the sweeper
    until ``stop`` is set, then shut them down in order (``abandon``, set while stopping,
    cancels the attempts still in flight).

    The run holds the database's ``inturn local`` session lock from start to end: a second
    ``inturn local`` on the same database would retire this one's destinations (they are not
    in its manifests), and messages for them would no longer be routed.

    Raises:
        DatabaseInUse: another ``inturn local`` holds the lock; nothing was started.
    """
    owner = await connect_worker(dsn, application_name="inturn-local")
    try:
        if not await locks.try_lock(owner, locks.LOCAL):
            raise DatabaseInUse(
                "this database is in use by another inturn local (it owns the destination"
                " registry): stop it, or give this one a database of its own"
            )
        channels = frozenset(listener.channel for listener in ingest_config.listeners)
        publishers = from_env(os.environ, dsn)
        runner = LocalRunner(dsn, paths, secrets_dir, channels, publishers)
        await runner.start()
        ingest = Ingest(ingest_config, dsn=dsn)
        sweeper = None
        if sweep_every is not None:
            sweeper = asyncio.create_task(
                sweep_loop(dsn, sweep_every, stop, publishers), name="sweeper"
            )
            log.info("the sweeper runs every %gs (--sweep-every)", sweep_every)
        try:
            await ingest.start()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_SECONDS)
                if not stop.is_set():
                    await runner.poll()
            log.info("stopping: listeners first, then workers")
        finally:
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            await ingest.stop()
            await runner.stop(abandon)
            await close_all(publishers)
    finally:
        # Closing the session releases the lock.
        with contextlib.suppress(Exception):
            await owner.close()


@click.command("local")
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path, exists=True),
    help="Destination manifest file or directory (repeatable).",
)
@click.option(
    "--listen",
    "listen",
    multiple=True,
    required=True,
    metavar="CHANNEL=[HOST:]PORT",
    help="An MLLP listener for a channel (repeatable).",
)
@click.option(
    "--http",
    "http",
    metavar="[HOST:]PORT",
    help="HTTP ingest, OPEN: no TLS, no authentication (local use).",
)
@click.option("--ops", "ops", metavar="[HOST:]PORT", help="/healthz, /readyz and /metrics.")
@dsn_option("Postgres connection string; default: an embedded Postgres under --data-dir.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".inturn"),
    show_default=True,
    help="Where the embedded Postgres keeps its data between runs.",
)
@click.option(
    "--secrets-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("secrets"),
    show_default=True,
    help="Where <secret>/<key> files for secretRefs are (relative: to each manifest).",
)
@click.option(
    "--hold-unrouted",
    multiple=True,
    metavar="CHANNEL",
    help="Hold messages of CHANNEL that match no destination instead of answering AR.",
)
@click.option(
    "--console",
    "console",
    metavar="[HOST:]PORT",
    help="Serve the web console and its API here (host default 127.0.0.1).",
)
@click.option(
    "--console-auth",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="The console's auth file; without it every caller on this machine's loopback is a"
    " local user with every role.",
)
@click.option(
    "--sweep-every",
    type=DURATION,
    default="1m",
    show_default=True,
    help="Run the sweeper's rules (as `inturn sweep` does) this often; 0 never.",
)
@feeds_option
@logging_options
def local_command(
    paths: tuple[Path, ...],
    listen: tuple[str, ...],
    http: str | None,
    ops: str | None,
    dsn: str | None,
    data_dir: Path,
    secrets_dir: Path | None,
    hold_unrouted: tuple[str, ...],
    console: str | None,
    console_auth: Path | None,
    sweep_every: float,
    feeds_file: str | None,
    log_level: str,
    log_json: bool,
) -> None:
    """Run ingest and one worker per Destination manifest in one process, without a cluster."""
    listeners = []
    for spec in listen:
        try:
            channel, host, port = parse_listen(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--listen") from None
        listeners.append(ListenerConfig(channel=channel, host=host, port=port))
    addresses: dict[str, tuple[str, int] | None] = {"--http": None, "--ops": None}
    for hint, value in (("--http", http), ("--ops", ops)):
        try:
            addresses[hint] = parse_address(value) if value else None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from None
    try:
        console_at = parse_address(console, "127.0.0.1") if console else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--console") from None
    try:
        # Local use: HTTP ingest is open (the log says so when it starts).
        ingest_config = IngestConfig(
            listeners=listeners,
            http=addresses["--http"],
            http_insecure=True,
            ops=addresses["--ops"],
            hold_unrouted=frozenset(hold_unrouted),
            pool_size=4,
            feeds=load_feeds_file(feeds_file),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:  # fail before starting anything
        for cfg in load_all(list(paths), secrets_dir).values():
            check_sender(cfg)
    except ManifestError as exc:
        raise click.ClickException(str(exc)) from None
    if dsn:
        try:
            dsn = normalize_dsn(dsn)
        except DsnError as exc:
            raise click.UsageError(str(exc)) from None
    try:
        from_env(os.environ, "")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    configure(log_level, log_json)
    start_tracing("inturn-local")
    console_auth_config = local_console_auth(console_auth) if console_at else None
    # Closing the terminal (SIGHUP) or a kill (SIGTERM) stops like Ctrl-C, before the event
    # loop runs too, so that the embedded Postgres is always stopped on the way out.
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    embedded = None
    lock = None
    if not dsn:
        try:
            lock = DataDirLock.acquire(data_dir)
        except DataDirInUse as exc:
            raise click.ClickException(str(exc)) from None
        log.info("starting embedded Postgres in %s", (data_dir / "pg").resolve())
        try:
            embedded = start_embedded(data_dir)
        except RuntimeError as exc:
            lock.release()
            raise click.ClickException(str(exc)) from None
        dsn = embedded.dsn
        if data_dir.resolve() == Path(".inturn").resolve():
            log.info("embedded Postgres ready; `inturn queue ...` run in this folder uses it")
        else:  # the other commands look for ./.inturn only: tell them where this one is
            log.info(
                "embedded Postgres ready; other inturn commands reach it with"
                " --dsn '%s' (or INTURN_DSN)",
                dsn,
            )
    try:
        applied = migrate(dsn)
        if applied:
            log.info("schema migrated (%d migration(s))", len(applied))

        async def main() -> None:
            stop, abandon = asyncio.Event(), asyncio.Event()
            shutdown.install(stop, abandon)
            served = None
            if console_at is not None and console_auth_config is not None:
                from inturn.worker.console.server import start_console

                served = await start_console(
                    dsn, host=console_at[0], port=console_at[1], auth=console_auth_config
                )
            try:
                await run_local(
                    dsn,
                    list(paths),
                    ingest_config,
                    secrets_dir,
                    stop,
                    abandon,
                    sweep_every=sweep_every or None,
                )
            finally:
                if served is not None:
                    await served.stop()

        asyncio.run(main())
    except DatabaseInUse as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        log.info("stopped before the workers started")
    finally:
        if embedded is not None:
            still = embedded.stop()
            if still is None:
                log.info("embedded Postgres stopped")
            else:
                log.warning("embedded Postgres still running (pid %d)", still)
        if lock is not None:
            lock.release()
