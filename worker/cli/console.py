"""``inturn console``: the web console and its JSON API (``/api/v1``), on one port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import click

from inturn.worker.cli.options import (
    DURATION,
    dsn_option,
    logging_options,
    payload_keys_options,
)
from inturn.worker.console.auth import AuthConfigError, load_auth
from inturn.worker.console.names import LOOPBACK_NAMES, ServerNames
from inturn.worker.console.overview import DEFAULT_STUCK_AFTER
from inturn.worker.console.server import start_console
from inturn.worker.crypto.keyfiles import KeyFileExposed, check_key_file
from inturn.worker.store.dsn import resolve_dsn
from inturn.worker.text.addresses import parse_address
from inturn.worker.text.logs import configure

log = logging.getLogger("inturn.cli.console")


#: The console's host when ``--listen`` names none: this machine only. A pod passes 0.0.0.0
#: (the chart does), so that its Service and the kubelet's probes reach it.
CONSOLE_HOST = "127.0.0.1"


def read_secret(path: Path | None) -> bytes | None:
    """The CSRF secret from a file (stripped), or None to make one per process.

    Raises:
        click.ClickException: unreadable or shorter than 16 bytes.
    """
    if path is None:
        return None
    try:
        check_key_file(path, "--csrf-secret-file")
        secret = path.read_bytes().strip()
    except KeyFileExposed as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"--csrf-secret-file: {exc}") from None
    if len(secret) < 16:
        raise click.ClickException("--csrf-secret-file: the secret must be at least 16 bytes")
    return secret


@click.command("console")
@dsn_option()
@click.option(
    "--listen",
    default=f"{CONSOLE_HOST}:8080",
    show_default=True,
    metavar="[HOST:]PORT",
    help="Where to serve the console and its API (host 127.0.0.1 unless given: this machine"
    " only; 0.0.0.0 for every interface, as the chart passes in a pod).",
)
@click.option(
    "--auth-file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    envvar="INTURN_CONSOLE_AUTH_FILE",
    help="YAML: bearer tokens with roles and/or the trusted proxy (see docs/reference/console.md).",
)
@click.option(
    "--csrf-secret-file",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="INTURN_CONSOLE_CSRF_SECRET_FILE",
    help="Secret for CSRF tokens, shared by replicas (default: one per process).",
)
@click.option(
    "--server-name",
    "server_names",
    multiple=True,
    metavar="HOST[:PORT]",
    envvar="INTURN_CONSOLE_SERVER_NAMES",
    help="A name the console serves under (repeatable; the variable: separated by spaces);"
    " a request whose Host header is none of them gets 421, and a change's Origin must be one"
    f" of them. Default: the loopback names ({', '.join(LOOPBACK_NAMES)}).",
)
@click.option(
    "--stuck-after",
    type=DURATION,
    default=int(DEFAULT_STUCK_AFTER),
    show_default=True,
    help="Age of the oldest pending message that makes a destination stand out.",
)
@payload_keys_options
@logging_options
def console_command(
    dsn: str | None,
    listen: str,
    auth_file: Path,
    csrf_secret_file: Path | None,
    server_names: tuple[str, ...],
    stuck_after: int,
    payload_keys: str | None,
    key_dsn: str | None,
    log_level: str,
    log_json: bool,
) -> None:
    """Serve the web console and its JSON API: what is stuck and since when, and the hands
    to fix it (retry, skip, drain, suspend, resend, remove, erase), every action audited."""
    try:
        host, port = parse_address(listen, CONSOLE_HOST)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    try:
        auth = load_auth(auth_file)
    except AuthConfigError as exc:
        raise click.ClickException(str(exc)) from None
    secret = read_secret(csrf_secret_file)
    try:
        names = ServerNames.parse(server_names)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server-name") from None
    target = resolve_dsn(dsn)
    configure(log_level, json_logs=log_json)

    async def main() -> None:
        from inturn.worker.operations.payload_keys import close_codec, open_codec

        payloads = await open_codec(payload_keys, key_dsn, application_name="inturn-console-keys")
        server = await start_console(
            target,
            host=host,
            port=port,
            auth=auth,
            csrf_secret=secret,
            stuck_after=stuck_after,
            server_names=names,
            payloads=payloads,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await server.stop()
            await close_codec(payloads)

    asyncio.run(main())
