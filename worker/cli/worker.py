"""``inturn worker``: drain exactly one destination until SIGTERM.

The configuration is the operator-rendered worker file (``--config``, JSON or YAML) or a
Destination manifest (``-f``). The database comes from ``INTURN_DSN`` (or ``--dsn``), its login
from ``INTURN_DB_USER``/``INTURN_DB_PASSWORD`` when set (a destination's own), the
worklist publishers from the ``INTURN_WORKLIST_*`` variables (checked here). Once the
configuration is valid the process replaces itself by the worker runtime
(:mod:`inturn.worker.drain.main`), which imports only what draining needs. On SIGTERM or
SIGINT the attempt in flight is finished or times out, the lock is released, and the process
exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import click

from inturn.worker.cli.options import dsn_option, logging_options, payload_keys_options
from inturn.worker.drain.main import exec_runtime, run, runtime_settings
from inturn.worker.senders import registry as senders
from inturn.worker.spec.config import LISTEN_DSN_ENV, WorkerConfig, lease_settings, poll_seconds
from inturn.worker.store import lockwatch
from inturn.worker.store.dsn import apply_login, normalize_dsn, resolve_dsn
from inturn.worker.worklist.publishers import from_env


def load_one(path: Path, secrets_dir: Path | None) -> WorkerConfig:
    """Load the single destination in ``path``.

    Raises:
        click.ClickException: the file is invalid or holds zero or several destinations.
    """
    from inturn.worker.spec.destination import ManifestError, load_file

    try:
        configs = load_file(path, secrets_dir=secrets_dir)
    except ManifestError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc.strerror or exc}") from None
    if len(configs) != 1:
        raise click.ClickException(
            f"{path}: holds {len(configs)} destinations; a worker drains exactly one"
        )
    return configs[0]


@click.command("worker")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Rendered worker configuration (JSON or YAML), as the operator writes it.",
)
@click.option(
    "-f",
    "--filename",
    "manifest_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A Destination manifest instead of a rendered configuration.",
)
@click.option(
    "--secrets-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where <secret>/<key> files are for a manifest's secretRefs.",
)
@dsn_option()
@click.option(
    "--http-host",
    default="127.0.0.1",
    show_default=True,
    help="Address of /healthz, /readyz and /metrics (unauthenticated): this host only unless"
    " given; 0.0.0.0 for every interface (the operator's worker pods pass it, for the kubelet's"
    " probes and Prometheus).",
)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port of /healthz, /readyz and /metrics.",
)
@click.option(
    "--listen-dsn",
    envvar=LISTEN_DSN_ENV,
    show_envvar=True,
    help="A direct DSN (not through a pooler) for LISTEN when --dsn goes through a"
    " transaction-mode pooler; without it a pooled worker polls every INTURN_POLL_SECONDS.",
)
@payload_keys_options
@logging_options
def worker_command(
    config_path: Path | None,
    manifest_path: Path | None,
    secrets_dir: Path | None,
    dsn: str | None,
    http_host: str,
    http_port: int,
    listen_dsn: str | None,
    payload_keys: str | None,
    key_dsn: str | None,
    log_level: str,
    log_json: bool,
) -> None:
    """Drain exactly one destination, in order, until SIGTERM."""
    if (config_path is None) == (manifest_path is None):
        raise click.UsageError("give --config FILE or -f MANIFEST")
    path = config_path or manifest_path
    assert path is not None
    config = load_one(path, secrets_dir)
    problem = senders.first_problem(config.destination, config.sender)
    if problem is not None:  # a missing Secret file, before anything starts
        raise click.ClickException(problem)
    target = resolve_dsn(dsn)
    try:
        # a destination's own login (INTURN_DB_USER, INTURN_DB_PASSWORD) replaces the shared one
        target = apply_login(target)
        from_env(os.environ, target)  # only checked here; the runtime builds its own
        lockwatch.threshold_from_env()
        lease_settings(os.environ)  # INTURN_LEASE_*, INTURN_POLL_SECONDS: one-line errors here
        poll_seconds(os.environ)
        if listen_dsn:  # the runtime reads it from its environment
            os.environ[LISTEN_DSN_ENV] = normalize_dsn(apply_login(listen_dsn))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    settings = runtime_settings(
        config, target, http_host, http_port, log_level, log_json, payload_keys, key_dsn
    )
    # exec_runtime does not return; if the interpreter cannot be executed (an unusual setup),
    # the worker runs here, with the validation's modules resident.
    with contextlib.suppress(OSError):
        exec_runtime(settings)
    raise SystemExit(run(json.loads(settings)))
