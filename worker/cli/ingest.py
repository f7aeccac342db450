"""``inturn ingest``: the click command that runs an ingest process."""

from __future__ import annotations

import asyncio

import click

from inturn.worker.cli.options import (
    dsn_option,
    feeds_option,
    load_feeds_file,
    logging_options,
    payload_keys_options,
    start_tracing,
)
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.ingest.accept import (
    DEFAULT_DELIVERED_WINDOW_SECONDS,
    DEFAULT_DUPLICATE_WINDOW_SECONDS,
    DEFAULT_MAX_BATCH_MESSAGES,
    DEFAULT_STORE_TIMEOUT_SECONDS,
)
from inturn.worker.ingest.access import AllowList
from inturn.worker.ingest.budget import DEFAULT_WAIT_SECONDS
from inturn.worker.ingest.config import IngestConfig, server_tls_context
from inturn.worker.ingest.credentials import (
    ANY_CHANNEL,
    CredentialsError,
    CredentialsFile,
    new_token,
)
from inturn.worker.ingest.feeds import DEFAULT_FLUSH_SECONDS, DEFAULT_MAX_SENDERS
from inturn.worker.ingest.listener import (
    DEFAULT_FRAME_DEADLINE,
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_FRAME_BYTES,
    ListenerConfig,
)
from inturn.worker.ingest.routing import DEFAULT_REFRESH_SECONDS, check_channel
from inturn.worker.ingest.service import Ingest, run_until_signal
from inturn.worker.store.connect import DsnError, probe, resolve_dsn
from inturn.worker.text.logs import configure


def parse_address(value: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """Parse ``[HOST:]PORT`` (``[::1]:2575`` for IPv6) into ``(host, port)``.

    Raises:
        ValueError: no valid port (0-65535).
    """
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host = default_host
    host = host.strip("[]") or default_host
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{value!r}: the port must be a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{value!r}: the port must be between 0 and 65535")
    return host, port


def parse_listen(value: str) -> tuple[str, str, int]:
    """Parse ``CHANNEL=[HOST:]PORT`` into ``(channel, host, port)``.

    Raises:
        ValueError: no ``=``, an invalid channel name or an invalid address.
    """
    channel, sep, address = value.partition("=")
    if not sep:
        raise ValueError(f"{value!r}: expected CHANNEL=[HOST:]PORT")
    host, port = parse_address(address)
    return check_channel(channel.strip()), host, port


def parse_allow(values: tuple[str, ...], option: str) -> dict[str, list[str]]:
    """Parse repeated ``CHANNEL=VALUE`` options into ``{channel: [value, ...]}``.

    Raises:
        ValueError: no ``=``, an invalid channel name or an empty value.
    """
    found: dict[str, list[str]] = {}
    for value in values:
        channel, sep, item = value.partition("=")
        if not sep or not item.strip():
            raise ValueError(f"{option} {value!r}: expected CHANNEL=VALUE")
        found.setdefault(check_channel(channel.strip()), []).append(item.strip())
    return found


def allow_lists(
    channels: list[str], networks: tuple[str, ...], subjects: tuple[str, ...]
) -> dict[str, AllowList]:
    """Each listened channel's allow-list from ``--allow-network`` / ``--allow-subject``.

    Raises:
        ValueError: a malformed option, an invalid CIDR, or a channel without a listener.
    """
    by_network = parse_allow(networks, "--allow-network")
    by_subject = parse_allow(subjects, "--allow-subject")
    for channel in sorted(set(by_network) | set(by_subject)):
        if channel not in channels:
            raise ValueError(f"channel {channel!r} has an allow-list but no --listen")
    return {
        channel: AllowList.build(by_network.get(channel, ()), by_subject.get(channel, ()))
        for channel in channels
    }


def _size(value: str) -> int:
    units = {"k": 1024, "ki": 1024, "m": 1024**2, "mi": 1024**2, "g": 1024**3, "gi": 1024**3}
    text = value.strip().lower().removesuffix("b")
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


@click.command("ingest")
@click.option(
    "--listen",
    "listen",
    multiple=True,
    metavar="CHANNEL=[HOST:]PORT",
    help="An MLLP listener for CHANNEL (repeatable; one per channel).",
)
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
    "--http",
    "http",
    metavar="[HOST:]PORT",
    help="HTTP messages (POST /channels/CHANNEL/messages), authenticated.",
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
@click.option(
    "--ops", "ops", metavar="[HOST:]PORT", help="/healthz, /readyz and /metrics (own port)."
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
    "--hold-unrouted",
    multiple=True,
    metavar="CHANNEL",
    help="Accept and hold (in _unrouted/CHANNEL) messages no destination takes,"
    " instead of answering AR (repeatable).",
)
@click.option(
    "--accept-unrouted",
    multiple=True,
    metavar="CHANNEL",
    help="Answer AA to messages no destination takes and drop them, counted in"
    " inturn_ingest_unrouted_total (Mirth's FILTERED), instead of answering AR (repeatable).",
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
    if not listen and not http:
        raise click.UsageError("nothing to serve: give --listen and/or --http")
    if http and not http_credentials and not http_insecure:
        raise click.UsageError(
            "--http needs --http-credentials (or --http-insecure to accept anyone)"
        )
    if http_credentials and http_insecure:
        raise click.UsageError("--http-credentials and --http-insecure exclude each other")
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        raise click.UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    try:
        listeners = [parse_listen(value) for value in listen]
        allows = allow_lists([ch for ch, _, _ in listeners], allow_network, allow_subject)
        http_address = parse_address(http) if http else None
        ops_address = parse_address(ops) if ops else None
        frame_limit = _size(max_frame_bytes)
        memory = _size(memory_limit) if memory_limit else None
        for channel in (*hold_unrouted, *accept_unrouted):
            check_channel(channel)
        both = sorted(set(hold_unrouted) & set(accept_unrouted))
        if both:
            raise ValueError(f"--hold-unrouted and --accept-unrouted both name {both[0]}")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    context = http_context = None
    if tls_cert and tls_key:
        context = server_tls_context(tls_cert, tls_key, tls_client_ca)
        http_context = server_tls_context(
            tls_cert, tls_key, tls_client_ca, client_cert_required=False
        )
    try:
        credentials = CredentialsFile(http_credentials) if http_credentials else None
    except CredentialsError as exc:
        raise click.BadParameter(str(exc), param_hint="--http-credentials") from None
    if credentials and credentials.wants_certificates and not tls_client_ca:
        raise click.UsageError("client-certificate credentials need --tls-client-ca")
    try:
        config = IngestConfig(
            listeners=[
                ListenerConfig(ch, host, port, context, allows[ch]) for ch, host, port in listeners
            ],
            http=http_address,
            http_ssl=http_context,
            credentials=credentials,
            http_insecure=http_insecure,
            ops=ops_address,
            max_frame_bytes=frame_limit,
            idle_timeout=idle_timeout,
            frame_timeout=frame_timeout,
            duplicate_window=duplicate_window,
            duplicate_delivered_window=duplicate_delivered_window,
            hold_unrouted=frozenset(hold_unrouted),
            accept_unrouted=frozenset(accept_unrouted),
            refresh_seconds=refresh,
            store_timeout=store_timeout,
            pool_size=pool_size,
            max_indexed_identifiers=max_indexed_identifiers,
            max_batch_messages=max_batch_messages,
            feeds=load_feeds_file(feeds_file),
            feed_flush_seconds=feed_flush_seconds,
            max_feed_senders=max_feed_senders,
            memory_limit=memory,
            busy_wait=busy_wait,
            frame_deadline=frame_deadline,
            payload_keys=payload_keys,
            key_dsn=key_dsn,
        )
        config.message_budget()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
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
