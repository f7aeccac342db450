"""``inturn worker``: drain exactly one destination until SIGTERM.

The configuration is the operator-rendered worker file (``--config``, JSON or YAML) or a
Destination manifest (``-f``). The database comes from ``INTURN_DSN`` (or ``--dsn``). On
SIGTERM or SIGINT the attempt in flight is finished or times out, the lock is released, and the
process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import click

from inturn.worker.config import WorkerConfig
from inturn.worker.health import make_app, serve
from inturn.worker.logs import configure
from inturn.worker.metrics import PrometheusObserver
from inturn.worker.runner import DestinationWorker
from inturn.worker.senders.factory import make_sender
from inturn.worker.store.connect import resolve_dsn

log = logging.getLogger("inturn.worker")


def load_one(path: Path, secrets_dir: Path | None) -> WorkerConfig:
    """Load the single destination in ``path``.

    Raises:
        click.ClickException: the file is invalid or holds zero or several destinations.
    """
    from inturn.worker.destination import ManifestError, load_file

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


async def run_worker(config: WorkerConfig, dsn: str, http_host: str, http_port: int) -> None:
    """Run one worker and its HTTP endpoints until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = DestinationWorker(config, dsn, make_sender(config.sender), PrometheusObserver())
    runner = await serve(make_app([worker]), http_host, http_port)
    log.info("worker for %s started (http %s:%d)", config.destination, http_host, http_port)
    try:
        await worker.run(stop)
    finally:
        await runner.cleanup()
        log.info("worker for %s stopped", config.destination)


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
@click.option("--dsn", envvar="INTURN_DSN", help="Postgres DSN (default: $INTURN_DSN).")
@click.option("--http-host", default="0.0.0.0", show_default=True)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port of /healthz, /readyz and /metrics.",
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--log-json", is_flag=True, help="One JSON object per log line.")
def worker_command(
    config_path: Path | None,
    manifest_path: Path | None,
    secrets_dir: Path | None,
    dsn: str | None,
    http_host: str,
    http_port: int,
    log_level: str,
    log_json: bool,
) -> None:
    """Drain exactly one destination, in order, until SIGTERM."""
    if (config_path is None) == (manifest_path is None):
        raise click.UsageError("give --config FILE or -f MANIFEST")
    path = config_path or manifest_path
    assert path is not None
    config = load_one(path, secrets_dir)
    target = resolve_dsn(dsn)
    configure(log_level, log_json)
    asyncio.run(run_worker(config, target, http_host, http_port))
