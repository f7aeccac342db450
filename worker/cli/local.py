"""``inturn local``: the command line of a whole installation in one process (ingest, one
worker per Destination manifest, the sweeper, optionally the console), run by
:func:`inturn.worker.local.run.run_local`.

Without ``--dsn``/``INTURN_DSN`` an embedded Postgres is started under ``--data-dir`` and kept
between runs; Ctrl-C (or SIGHUP, SIGTERM) stops everything in order, the embedded Postgres last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from inturn.worker.cli.options import (
    DURATION,
    dsn_option,
    feeds_option,
    ingest_config,
    ingest_settings_options,
    load_feeds_file,
    logging_options,
    payload_keys_options,
    serving_options,
    start_process,
)
from inturn.worker.drain import shutdown
from inturn.worker.drain.permits import permits_from_env
from inturn.worker.local.budget import budget, embedded_size
from inturn.worker.local.embedded import DataDirInUse, DataDirLock, start_embedded
from inturn.worker.local.manifests import check_sender, load_all
from inturn.worker.local.run import DatabaseInUse, LocalRunner, OverBudget, run_local
from inturn.worker.local.witness import FILE_NAME, KEYED_FILE_NAME
from inturn.worker.spec.destination import ManifestError
from inturn.worker.store.dsn import DsnError, normalize_dsn
from inturn.worker.store.migrate import migrate
from inturn.worker.text.addresses import parse_address
from inturn.worker.worklist.publishers import from_env

if TYPE_CHECKING:
    from inturn.worker.console.auth import AuthConfig

log = logging.getLogger("inturn.cli.local")


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
@serving_options(listen_required=True, http_help="OPEN: no TLS, no authentication (local use)")
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
@click.option(
    "--encrypt",
    is_flag=True,
    help="Encrypt payloads at rest with a master key made in DATA_DIR/payload-keys and a key"
    " store database made in the embedded server (same as --payload-keys and --key-dsn).",
)
@payload_keys_options
@feeds_option
@ingest_settings_options
@logging_options
def local_command(
    paths: tuple[Path, ...],
    serving: dict[str, Any],
    dsn: str | None,
    data_dir: Path,
    secrets_dir: Path | None,
    console: str | None,
    console_auth: Path | None,
    sweep_every: float,
    encrypt: bool,
    payload_keys: str | None,
    key_dsn: str | None,
    feeds_file: str | None,
    ingest_settings: dict[str, Any],
    log_level: str,
    log_json: bool,
) -> None:
    """Run ingest and one worker per Destination manifest in one process, without a cluster.

    Ingest's options are the same as `inturn ingest`'s (sizes, timeouts, duplicate windows,
    memory, feeds), but for its TLS, network allow-lists, HTTP credentials and pool size: local
    is open on purpose."""
    try:
        console_at = parse_address(console, "127.0.0.1") if console else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--console") from None
    # Local use: HTTP ingest is open (the log says so when it starts).
    config = ingest_config(
        serving, ingest_settings, http_insecure=True, pool_size=4, feeds=load_feeds_file(feeds_file)
    )
    try:  # fail before starting anything
        configs = load_all(list(paths), secrets_dir, [data_dir])
        for cfg in configs.values():
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
        permits_from_env()
        plan = budget(
            len(configs),
            ingest_pool=config.pool_size,
            console=console_at is not None,
            encrypted=bool(encrypt or payload_keys),
        )
    except ValueError as exc:  # Invalid is one
        raise click.ClickException(str(exc)) from None
    start_process("inturn-local", log_level, log_json)
    console_auth_config = local_console_auth(console_auth) if console_at else None
    # Closing the terminal (SIGHUP) or a kill (SIGTERM) stops like Ctrl-C, before the event
    # loop runs too, so that the embedded Postgres is always stopped on the way out.
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    embedded = None
    gave_up: list[str] = []  # why the embedded Postgres could not be kept running
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
        try:  # the connections the run opens, counted, fit (docs/reference/local.md)
            before, now = embedded.fit_connections(embedded_size(plan.total))
        except RuntimeError as exc:
            embedded.stop()
            lock.release()
            raise click.ClickException(str(exc)) from None
        if now != before:
            log.info(
                "embedded Postgres: max_connections raised from %d to %d (it needs %s)",
                before,
                now,
                plan.describe(),
            )
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
        if encrypt or payload_keys:
            payload_keys, key_dsn = local_keys(data_dir, dsn, payload_keys, key_dsn)
            config = dataclasses.replace(config, payload_keys=payload_keys, key_dsn=key_dsn)
            log.info("payloads are encrypted at rest (master keys in %s)", payload_keys)

        async def main() -> None:
            stop, abandon = asyncio.Event(), asyncio.Event()
            shutdown.install(stop, abandon)
            served = None
            watch = None
            runners: list[LocalRunner] = []  # the run's, for the console's no-worker rows
            if embedded is not None:  # restarted if killed; else stop, and exit non-zero
                watch = asyncio.create_task(embedded.keep_running(stop), name="embedded")
            if console_at is not None and console_auth_config is not None:
                from inturn.worker.console.server import start_console
                from inturn.worker.operations.payload_keys import open_codec

                served = await start_console(
                    dsn,
                    host=console_at[0],
                    port=console_at[1],
                    auth=console_auth_config,
                    payloads=await open_codec(payload_keys, key_dsn),
                    option="--console",
                    no_worker=lambda: runners[0].unrun() if runners else {},
                )
            try:
                await run_local(
                    dsn,
                    list(paths),
                    config,
                    secrets_dir,
                    stop,
                    abandon,
                    sweep_every=sweep_every or None,
                    skip=[data_dir],
                    # the embedded database's own file; a database --dsn names has its
                    # witness kept by its identity (migration 0055) in a file of all of them
                    witness=data_dir / (FILE_NAME if embedded is not None else KEYED_FILE_NAME),
                    witness_keyed=embedded is None,
                    console=console_at is not None,
                    embedded=embedded is not None,
                    runners=runners,
                )
            finally:
                if served is not None:
                    await served.stop()
                if watch is not None:
                    stop.set()
                    problem = await watch
                    if problem is not None:
                        gave_up.append(problem)

        asyncio.run(main())
        if gave_up:
            log.error("stopping: %s", gave_up[0])
    except (DatabaseInUse, OverBudget) as exc:
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
    if gave_up:  # a supervisor (or the user) starts it again whole
        click.echo(f"inturn: error: {gave_up[0]}", err=True)
        sys.exit(1)


#: The key store database ``inturn local --encrypt`` makes in its Postgres.
LOCAL_KEY_DATABASE = "inturn_keys"


def local_key_database(dsn: str) -> str:
    """The key store database ``inturn local --encrypt`` makes beside the queue's database at
    ``dsn``: :data:`LOCAL_KEY_DATABASE` beside the embedded server's ``postgres``, else the queue
    database's name with ``_keys`` (two queue databases on one server never share a key store:
    each keeps the master key it was made with).

    Raises:
        psycopg.ProgrammingError: ``dsn`` cannot be parsed.
    """
    from psycopg.conninfo import conninfo_to_dict

    name = str(conninfo_to_dict(dsn).get("dbname") or "postgres")
    return LOCAL_KEY_DATABASE if name == "postgres" else f"{name}_keys"


def local_keys(
    data_dir: Path, dsn: str, payload_keys: str | None, key_dsn: str | None
) -> tuple[str, str]:
    """The master keys and the key store of ``inturn local --encrypt``: the folder given (or
    ``DATA_DIR/payload-keys``), made with a first key ``k1`` when it holds none, and the key
    store given (or database :func:`local_key_database` on the same server, made when
    missing), its tables made."""
    from inturn.worker.crypto.masterkeys import new_key_file
    from inturn.worker.store.keystore import create_schema, ensure_database

    folder = Path(payload_keys) if payload_keys else data_dir / "payload-keys"
    if not folder.is_dir() or not any(p.is_file() for p in folder.iterdir()):
        written = new_key_file(folder, "k1")
        log.info("master key made: %s (keep it: without it the payloads cannot be read)", written)
    if key_dsn is None:
        key_dsn = ensure_database(dsn, local_key_database(dsn))
    create_schema(key_dsn)
    return str(folder), key_dsn
