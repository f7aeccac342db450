"""``inturn ingest``: the click command that runs an ingest process."""

from __future__ import annotations

import asyncio
import logging

import click

from inturn.worker.ingest.accept import (
    DEFAULT_DUPLICATE_WINDOW_SECONDS,
    DEFAULT_STORE_TIMEOUT_SECONDS,
)
from inturn.worker.ingest.listener import (
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_FRAME_BYTES,
    ListenerConfig,
)
from inturn.worker.ingest.routing import DEFAULT_REFRESH_SECONDS, check_channel
from inturn.worker.ingest.service import (
    Ingest,
    IngestConfig,
    run_until_signal,
    server_tls_context,
)
from inturn.worker.store.connect import DsnMissing, resolve_dsn


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
    "--http", "http", metavar="[HOST:]PORT", help="HTTP: messages, /healthz, /readyz, /metrics."
)
@click.option("--dsn", envvar="INTURN_DSN", help="Postgres connection string (or INTURN_DSN).")
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="PEM certificate chain: every MLLP listener uses TLS.",
)
@click.option(
    "--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key of --tls-cert."
)
@click.option(
    "--tls-client-ca",
    type=click.Path(exists=True, dir_okay=False),
    help="PEM CA bundle: require client certificates signed by it.",
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
    help="Seconds a message is remembered to recognise a resend (0: off).",
)
@click.option(
    "--hold-unrouted",
    multiple=True,
    metavar="CHANNEL",
    help="Accept and hold (in _unrouted/CHANNEL) messages no destination takes,"
    " instead of answering AR (repeatable).",
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
    help="Seconds to store one message before answering AE.",
)
@click.option(
    "--pool-size",
    type=int,
    default=16,
    show_default=True,
    help="Database connections for storing messages.",
)
@click.option(
    "--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR."
)
def ingest_command(
    listen: tuple[str, ...],
    http: str | None,
    dsn: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    max_frame_bytes: str,
    idle_timeout: float,
    frame_timeout: float,
    duplicate_window: float,
    hold_unrouted: tuple[str, ...],
    refresh: float,
    store_timeout: float,
    pool_size: int,
    log_level: str,
) -> None:
    """Accept HL7 v2 over MLLP (and HTTP), store it for every destination, then acknowledge."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        database = resolve_dsn(dsn)
    except DsnMissing as exc:
        raise click.UsageError(str(exc)) from None
    if not listen and not http:
        raise click.UsageError("nothing to serve: give --listen and/or --http")
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        raise click.UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    try:
        listeners = [parse_listen(value) for value in listen]
        http_address = parse_address(http) if http else None
        frame_limit = _size(max_frame_bytes)
        for channel in hold_unrouted:
            check_channel(channel)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    context = server_tls_context(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
    try:
        config = IngestConfig(
            listeners=[ListenerConfig(ch, host, port, context) for ch, host, port in listeners],
            http=http_address,
            max_frame_bytes=frame_limit,
            idle_timeout=idle_timeout,
            frame_timeout=frame_timeout,
            duplicate_window=duplicate_window,
            hold_unrouted=frozenset(hold_unrouted),
            refresh_seconds=refresh,
            store_timeout=store_timeout,
            pool_size=pool_size,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    asyncio.run(run_until_signal(Ingest(config, dsn=database)))
