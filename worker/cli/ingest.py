"""``inturn ingest``: the click command that runs an ingest process."""

from __future__ import annotations

import asyncio

import click

from inturn.worker.cli.options import (
    dsn_option,
    feeds_option,
    logging_options,
    option_error,
    payload_keys_options,
    serving_options,
    start_tracing,
)
from inturn.worker.errors import OptionInvalid
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.ingest.accept import (
    DEFAULT_DELIVERED_WINDOW_SECONDS,
    DEFAULT_DUPLICATE_WINDOW_SECONDS,
    DEFAULT_MAX_BATCH_MESSAGES,
    DEFAULT_STORE_TIMEOUT_SECONDS,
)
from inturn.worker.ingest.budget import DEFAULT_WAIT_SECONDS
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.credentials import (
    ANY_CHANNEL,
    new_token,
)
from inturn.worker.ingest.feeds import DEFAULT_FLUSH_SECONDS, DEFAULT_MAX_SENDERS
from inturn.worker.ingest.listener import (
    DEFAULT_FRAME_DEADLINE,
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_FRAME_BYTES,
)
from inturn.worker.ingest.routing import DEFAULT_REFRESH_SECONDS, check_channel
from inturn.worker.ingest.service import Ingest, run_until_signal
from inturn.worker.store.connect import DsnError, probe, resolve_dsn
from inturn.worker.text.logs import configure


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
    "--max-frame-bytes",
    default=str(DEFAULT_MAX_FRAME_BYTES),
    show_default=True,
    help="Largest message accepted (bytes; suffixes k, M, G are powers of 1024).",
)
@click.option(
    "--idle-timeout",
    type=float,
    default=DEFAULT_IDLE_TIMEOUT,
    show_default=True,
    help="Seconds an idle connection stays open.",
)
@click.option(
    "--frame-timeout",
    type=float,
    default=DEFAULT_FRAME_TIMEOUT,
    show_default=True,
    help="Seconds without a byte inside a frame before the connection is closed.",
)
@click.option(
    "--duplicate-window",
    type=float,
    default=DEFAULT_DUPLICATE_WINDOW_SECONDS,
    show_default=True,
    help="Seconds a message is remembered to recognise a copy received again (0: off).",
)
@click.option(
    "--duplicate-delivered-window",
    type=float,
    default=DEFAULT_DELIVERED_WINDOW_SECONDS,
    show_default=True,
    help="Seconds after its earlier copy's delivery during which a copy received again is"
    " taken for a sender that lost our ACK (AA, not queued); later, or after a failure,"
    " skip or erasure, it is queued again as a re-send.",
)
@click.option(
    "--refresh",
    type=float,
    default=DEFAULT_REFRESH_SECONDS,
    show_default=True,
    help="Seconds between reads of the destination registry.",
)
@click.option(
    "--store-timeout",
    type=float,
    default=DEFAULT_STORE_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds to store one message; past it the transaction is cancelled, and AE is"
    " answered once its rollback is seen (AA if it had committed).",
)
@click.option(
    "--pool-size",
    type=int,
    default=16,
    show_default=True,
    help="Database connections for storing messages.",
)
@click.option(
    "--max-indexed-identifiers",
    type=click.IntRange(min=1),
    default=MAX_INDEXED_IDENTIFIERS,
    show_default=True,
    help="Most distinct patient identifiers (PID-2/3/4, MRG-1) indexed per message; the rest"
    " are stored but not found by --patient-id.",
)
@click.option(
    "--memory-limit",
    envvar="INTURN_MEMORY_LIMIT",
    metavar="SIZE",
    help="Memory ingest may use (bytes; k, M, G and Ki, Mi, Gi are powers of 1024); the"
    " message budget is (SIZE - 96 MiB) / 4. Default: the container's (cgroup's) limit, else"
    " 512 MiB. The chart sets it from the pod's memory limit.",
)
@click.option(
    "--busy-wait",
    type=float,
    default=DEFAULT_WAIT_SECONDS,
    show_default=True,
    help="Seconds a message waits for memory before it is answered AE (busy).",
)
@click.option(
    "--frame-deadline",
    type=float,
    default=DEFAULT_FRAME_DEADLINE,
    show_default=True,
    help="Seconds an MLLP frame may take from its first byte to its last.",
)
@click.option(
    "--max-batch-messages",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_BATCH_MESSAGES,
    show_default=True,
    help="Most messages in one HL7 batch (FHS/BHS ... BTS/FTS); a larger batch is refused whole"
    " (AR, ERR 104).",
)
@feeds_option
@click.option(
    "--feed-flush-seconds",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_FLUSH_SECONDS,
    show_default=True,
    help="Seconds between two writes of the feeds' last message times (never one per message).",
)
@click.option(
    "--max-feed-senders",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_SENDERS,
    show_default=True,
    help=(
        "Most senders (MSH-3/MSH-4) recorded per per-sender feed, kept by the database for"
        " every replica; others count for the channel."
    ),
)
@payload_keys_options
@logging_options
def ingest_command(
    listen: tuple[str, ...],
    allow_network: tuple[str, ...],
    allow_subject: tuple[str, ...],
    http: str | None,
    http_credentials: str | None,
    http_insecure: bool,
    ops: str | None,
    dsn: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    max_frame_bytes: str,
    idle_timeout: float,
    frame_timeout: float,
    duplicate_window: float,
    duplicate_delivered_window: float,
    hold_unrouted: tuple[str, ...],
    accept_unrouted: tuple[str, ...],
    refresh: float,
    store_timeout: float,
    pool_size: int,
    max_indexed_identifiers: int,
    max_batch_messages: int,
    feeds_file: str | None,
    feed_flush_seconds: float,
    max_feed_senders: int,
    memory_limit: str | None,
    busy_wait: float,
    frame_deadline: float,
    payload_keys: str | None,
    key_dsn: str | None,
    log_level: str,
    log_json: bool,
) -> None:
    """Accept HL7 v2 over MLLP (and HTTP), store it for every destination, then acknowledge."""
    configure(log_level, log_json)
    start_tracing("inturn-ingest")
    try:
        database = resolve_dsn(dsn)
    except DsnError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        config = IngestConfig.from_options(
            listen=listen,
            allow_network=allow_network,
            allow_subject=allow_subject,
            http=http,
            http_credentials=http_credentials,
            http_insecure=http_insecure,
            ops=ops,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            max_frame_bytes=max_frame_bytes,
            idle_timeout=idle_timeout,
            frame_timeout=frame_timeout,
            duplicate_window=duplicate_window,
            duplicate_delivered_window=duplicate_delivered_window,
            hold_unrouted=hold_unrouted,
            accept_unrouted=accept_unrouted,
            refresh_seconds=refresh,
            store_timeout=store_timeout,
            pool_size=pool_size,
            max_indexed_identifiers=max_indexed_identifiers,
            max_batch_messages=max_batch_messages,
            feeds_file=feeds_file,
            feed_flush_seconds=feed_flush_seconds,
            max_feed_senders=max_feed_senders,
            memory_limit=memory_limit,
            busy_wait=busy_wait,
            frame_deadline=frame_deadline,
            payload_keys=payload_keys,
            key_dsn=key_dsn,
        )
    except OptionInvalid as exc:
        raise option_error(exc) from None
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
