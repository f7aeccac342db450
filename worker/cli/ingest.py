"""``inturn ingest``: the click command that runs an ingest process."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from inturn.worker.cli.options import (
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
from inturn.worker.ingest.credentials import (
    ANY_CHANNEL,
    new_token,
)
from inturn.worker.ingest.routing import check_channel
from inturn.worker.ingest.service import Ingest, run_until_signal
from inturn.worker.store.connect import probe
from inturn.worker.store.dsn import DsnError, resolve_dsn


@click.command("ingest")
@serving_options(listen_required=False, http_help="authenticated")
@click.option(
    "--allow-network",
    multiple=True,
    metavar="CHANNEL=CIDR",
    help="Accept MLLP connections to CHANNEL only from this network (repeatable).",
)
@click.option(
    "--allow-subject",
    multiple=True,
    metavar="CHANNEL=NAME",
    help="Accept MLLP connections to CHANNEL only with a client certificate whose CN or a"
    " SAN is NAME (repeatable; needs --tls-client-ca).",
)
@click.option(
    "--http-credentials",
    envvar="INTURN_HTTP_CREDENTIALS",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML file of bearer tokens / client certificates and their channels (re-read when"
    " it changes).",
)
@click.option(
    "--http-insecure",
    is_flag=True,
    help="Accept HTTP messages without authentication (local use only).",
)
@dsn_option()
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="PEM certificate chain: every MLLP listener and the HTTP message port use TLS.",
)
@click.option(
    "--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key of --tls-cert."
)
@click.option(
    "--tls-client-ca",
    type=click.Path(exists=True, dir_okay=False),
    help="PEM CA bundle: MLLP requires client certificates signed by it (HTTP accepts them"
    " as credentials).",
)
@click.option(
    "--pool-size",
    type=int,
    default=16,
    show_default=True,
    help="Database connections for storing messages.",
)
@feeds_option
@ingest_settings_options
@payload_keys_options
@logging_options
def ingest_command(
    serving: dict[str, Any],
    allow_network: tuple[str, ...],
    allow_subject: tuple[str, ...],
    http_credentials: str | None,
    http_insecure: bool,
    dsn: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    pool_size: int,
    feeds_file: str | None,
    payload_keys: str | None,
    key_dsn: str | None,
    ingest_settings: dict[str, Any],
    log_level: str,
    log_json: bool,
) -> None:
    """Accept HL7 v2 over MLLP (and HTTP), store it for every destination, then acknowledge."""
    start_process("inturn-ingest", log_level, log_json)
    try:
        database = resolve_dsn(dsn)
    except DsnError as exc:
        raise click.UsageError(str(exc)) from None
    config = ingest_config(
        serving,
        ingest_settings,
        allow_network=allow_network,
        allow_subject=allow_subject,
        http_credentials=http_credentials,
        http_insecure=http_insecure,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_client_ca=tls_client_ca,
        pool_size=pool_size,
        feeds=load_feeds_file(feeds_file),
        payload_keys=payload_keys,
        key_dsn=key_dsn,
    )
    # Unreachable at start: one line and exit 2 (a supervisor restarts us), not 10 s of pool
    # retries. Once running, ingest answers AE while the database is away and recovers.
    asyncio.run(probe(database))
    asyncio.run(run_until_signal(Ingest(config, dsn=database)))


@click.command("token")
@click.argument("name")
@click.option(
    "--channel",
    "channels",
    multiple=True,
    required=True,
    metavar="CHANNEL",
    help="A channel the token may post to (repeatable; '*' for every channel).",
)
def token_command(name: str, channels: tuple[str, ...]) -> None:
    """Make a bearer token for HTTP ingest: the token goes to stderr (give it to the sender,
    it is shown once), the credentials-file entry with its SHA-256 to stdout."""
    try:
        for channel in channels:
            if channel != ANY_CHANNEL:
                check_channel(channel)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--channel") from None
    token, digest = new_token()
    click.echo(f"token for {name} (shown once): {token}", err=True)
    listed = ", ".join(f"'{c}'" if c == ANY_CHANNEL else c for c in channels)
    click.echo(f"  - {{name: {name}, channels: [{listed}], tokenSha256: {digest}}}")
