"""What an ingest process is configured with: :class:`IngestConfig` (listeners, servers,
limits, each checked when it is made) and the TLS server context of its listeners.

Built by ``inturn ingest`` and ``inturn local`` (:mod:`inturn.worker.cli`); run by
:class:`inturn.worker.ingest.service.Ingest`.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inturn.worker.crypto.keyfiles import KeyFileExposed, check_key_file
from inturn.worker.errors import OptionInvalid
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.ingest.accept import (
    DEFAULT_DELIVERED_WINDOW_SECONDS,
    DEFAULT_DUPLICATE_WINDOW_SECONDS,
    DEFAULT_MAX_BATCH_MESSAGES,
    DEFAULT_STORE_TIMEOUT_SECONDS,
)
from inturn.worker.ingest.access import AllowList
from inturn.worker.ingest.budget import (
    CONNECTION_BYTES,
    DEFAULT_WAIT_SECONDS,
    budget_for,
    limit_for,
    memory_limit,
)
from inturn.worker.ingest.credentials import CredentialsError, CredentialsFile, CredentialSource
from inturn.worker.ingest.listener import (
    DEFAULT_FRAME_DEADLINE,
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_FRAME_BYTES,
    ListenerConfig,
)
from inturn.worker.ingest.routing import DEFAULT_REFRESH_SECONDS, check_channel
from inturn.worker.text.addresses import parse_address

#: Seconds between two flushes of what the packs' recorders noted (``--feed-flush-seconds``).
DEFAULT_FLUSH_SECONDS = 30.0
#: Most senders (MSH-3/MSH-4 pairs) recorded per per-sender feed (``--max-feed-senders``).
DEFAULT_MAX_SENDERS = 100


@dataclass(frozen=True)
class IngestConfig:
    """Everything an ingest process needs besides its database.

    Attributes:
        listeners: one MLLP listener per channel (channels must be distinct).
        http: ``(host, port)`` of the HTTP message server, or None.
        http_ssl: a server TLS context for the HTTP message server, or None (plain HTTP).
        credentials: who may post to which channel over HTTP (fixed, or a file re-read as it
            changes); required with ``http`` unless ``http_insecure``.
        http_insecure: accept unauthenticated HTTP message requests (local use only).
        ops: ``(host, port)`` of the operations server (``/healthz``, ``/readyz``,
            ``/metrics``), or None.
        max_frame_bytes: largest message accepted over MLLP or HTTP, in bytes.
        idle_timeout: seconds without a byte between frames before a connection is closed.
        frame_timeout: seconds without a byte inside a frame before a connection is closed.
        duplicate_window: seconds a received message is remembered for duplicate detection;
            0 turns it off. All replicas of one deployment should use the same value (each
            purges rows older than its own window).
        duplicate_delivered_window: the lost-ACK window, seconds: a message received again
            (inside ``duplicate_window``) within this time of its earlier copy's delivery is
            acknowledged without being queued; after a failure, a skip, an erasure or an older
            delivery it is queued again, as a re-send linked to that copy.
        hold_unrouted: channels whose messages without a destination are held in
            ``_unrouted/<channel>`` instead of answered AR.
        accept_unrouted: channels whose messages without a destination are answered AA and
            dropped (not stored, counted) instead of answered AR (a channel in both holds).
        refresh_seconds: seconds between reads of the destination registry.
        store_timeout: seconds one message may take to store (pool wait + transaction);
            past it the transaction is cancelled and answered by its own end: AE once rolled
            back, AA if it committed first, no answer if its end cannot be seen.
        pool_size: connections in the write pool (concurrent stores; more connections
            than this wait for a free one).
        shutdown_grace: seconds a message being stored at shutdown gets to finish.
        max_indexed_identifiers: most distinct patient identifiers (PID-2/3/4, MRG-1) indexed
            per message; the rest are stored but not indexed.
        max_batch_messages: most messages in one HL7 batch (FHS/BHS); a larger one is
            refused whole (AR, ERR 104).
        feeds: declared feeds, as the feeds pack's loader returns them
            (``inturn.worker.feeds.declare.load_feeds``: the command line loads ``--feeds``),
            or None to leave the declarations in the database alone. Given (even empty), they
            are written at start and ingest records when each last received a message (the
            feeds pack's record hook, reached through :mod:`inturn.worker.operations.packs`;
            ingest does not read them).
        feed_flush_seconds: seconds between two writes of the last-message times.
        max_feed_senders: most senders recorded per per-sender feed.
        memory_limit: bytes the process may use; its message budget is derived from it
            (:func:`inturn.worker.ingest.budget.budget_for`). None: the cgroup's limit, else
            512 MiB.
        busy_wait: longest seconds a message waits for memory before it is answered AE busy.
        frame_deadline: seconds an MLLP frame may take from its first byte to its last.
        payload_keys: the master keys' folder (``--payload-keys``): payloads are sealed
            before they are stored. None: stored in clear.
        key_dsn: the key store (``--key-dsn``), with ``payload_keys``.
    """

    listeners: Sequence[ListenerConfig] = ()
    http: tuple[str, int] | None = None
    http_ssl: ssl.SSLContext | None = None
    credentials: CredentialSource | None = None
    http_insecure: bool = False
    ops: tuple[str, int] | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_SECONDS
    duplicate_delivered_window: float = DEFAULT_DELIVERED_WINDOW_SECONDS
    hold_unrouted: frozenset[str] = field(default_factory=frozenset)
    accept_unrouted: frozenset[str] = field(default_factory=frozenset)
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    store_timeout: float = DEFAULT_STORE_TIMEOUT_SECONDS
    pool_size: int = 16
    shutdown_grace: float = 10.0
    max_indexed_identifiers: int = MAX_INDEXED_IDENTIFIERS
    max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES
    feeds: tuple[Any, ...] | None = None
    feed_flush_seconds: float = DEFAULT_FLUSH_SECONDS
    max_feed_senders: int = DEFAULT_MAX_SENDERS
    memory_limit: int | None = None
    busy_wait: float = DEFAULT_WAIT_SECONDS
    frame_deadline: float = DEFAULT_FRAME_DEADLINE
    payload_keys: str | None = None
    key_dsn: str | None = None

    def __post_init__(self) -> None:
        channels = [listener.channel for listener in self.listeners]
        if len(set(channels)) != len(channels):
            raise ValueError("each channel may have only one MLLP listener")
        for channel in channels:
            check_channel(channel)
        if self.http is not None and self.credentials is None and not self.http_insecure:
            raise ValueError(
                "HTTP ingest needs credentials (--http-credentials), or --http-insecure to"
                " accept unauthenticated messages"
            )
        if self.http_insecure and self.credentials is not None:
            raise ValueError("--http-insecure and --http-credentials exclude each other")
        if self.max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        if self.idle_timeout <= 0 or self.frame_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.duplicate_window < 0:
            raise ValueError("duplicate_window must not be negative")
        if self.duplicate_delivered_window < 0:
            raise ValueError("duplicate_delivered_window must not be negative")
        if self.pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if self.max_indexed_identifiers < 1:
            raise ValueError("max_indexed_identifiers must be at least 1")
        if self.max_batch_messages < 1:
            raise ValueError("max_batch_messages must be at least 1")
        if self.feed_flush_seconds <= 0:
            raise ValueError("feed_flush_seconds must be positive")
        if self.max_feed_senders < 0:
            raise ValueError("max_feed_senders must not be negative")
        if self.busy_wait <= 0 or self.frame_deadline <= 0:
            raise ValueError("busy_wait and frame_deadline must be positive")
        if self.memory_limit is not None:
            self.message_budget()

    @classmethod
    def from_options(
        cls,
        *,
        listen: Sequence[str] = (),
        allow_network: Sequence[str] = (),
        allow_subject: Sequence[str] = (),
        http: str | None = None,
        http_credentials: str | None = None,
        http_insecure: bool = False,
        ops: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        max_frame_bytes: str | int = DEFAULT_MAX_FRAME_BYTES,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
        duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_SECONDS,
        duplicate_delivered_window: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
        hold_unrouted: Sequence[str] = (),
        accept_unrouted: Sequence[str] = (),
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
        store_timeout: float = DEFAULT_STORE_TIMEOUT_SECONDS,
        pool_size: int = 16,
        max_indexed_identifiers: int = MAX_INDEXED_IDENTIFIERS,
        max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES,
        feeds: tuple[Any, ...] | None = None,
        feed_flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        max_feed_senders: int = DEFAULT_MAX_SENDERS,
        memory_limit: str | None = None,
        busy_wait: float = DEFAULT_WAIT_SECONDS,
        frame_deadline: float = DEFAULT_FRAME_DEADLINE,
        payload_keys: str | None = None,
        key_dsn: str | None = None,
    ) -> IngestConfig:
        """The one place an ingest process's configuration is built from its settings as a
        person writes them (``inturn ingest``'s and ``inturn local``'s options: addresses as
        ``[HOST:]PORT``, listeners as ``CHANNEL=[HOST:]PORT``, sizes with k/M/G suffixes, file
        names); every argument is the option of the same name.

        Raises:
            OptionInvalid: a setting or a combination is wrong (``option`` names the option
                when one is to blame); nothing was started. The TLS and credentials files are
                read here, so a missing or unusable one is reported before anything listens.
        """
        if not listen and not http:
            raise OptionInvalid("nothing to serve: give --listen and/or --http")
        if http and not http_credentials and not http_insecure:
            raise OptionInvalid(
                "--http needs --http-credentials (or --http-insecure to accept anyone)"
            )
        if http_credentials and http_insecure:
            raise OptionInvalid("--http-credentials and --http-insecure exclude each other")
        if bool(tls_cert) != bool(tls_key):
            raise OptionInvalid("--tls-cert and --tls-key go together")
        if tls_client_ca and not tls_cert:
            raise OptionInvalid("--tls-client-ca needs --tls-cert and --tls-key")
        hint = "--listen"
        try:
            listeners = [parse_listen(value) for value in listen]
            hint = "--allow-network/--allow-subject"
            allows = allow_lists([ch for ch, _, _ in listeners], allow_network, allow_subject)
            hint = "--http"
            http_address = parse_address(http) if http else None
            hint = "--ops"
            # unauthenticated: this host only unless a host is given (the chart gives 0.0.0.0)
            ops_address = parse_address(ops, "127.0.0.1") if ops else None
            hint = "--max-frame-bytes"
            frame_limit = parse_size(max_frame_bytes)
            hint = "--memory-limit"
            memory = parse_size(memory_limit) if memory_limit else None
            hint = "--hold-unrouted/--accept-unrouted"
            for channel in (*hold_unrouted, *accept_unrouted):
                check_channel(channel)
            both = sorted(set(hold_unrouted) & set(accept_unrouted))
            if both:
                raise ValueError(f"--hold-unrouted and --accept-unrouted both name {both[0]}")
        except ValueError as exc:
            raise OptionInvalid(str(exc), hint) from None
        context = http_context = None
        if tls_cert and tls_key:
            try:
                context = server_tls_context(tls_cert, tls_key, tls_client_ca)
                http_context = server_tls_context(
                    tls_cert, tls_key, tls_client_ca, client_cert_required=False
                )
            except KeyFileExposed as exc:
                raise OptionInvalid(str(exc), "--tls-key") from None
            except (OSError, ssl.SSLError) as exc:
                raise OptionInvalid(f"the TLS files cannot be used: {exc}", "--tls-cert") from None
        try:
            credentials = CredentialsFile(http_credentials) if http_credentials else None
        except CredentialsError as exc:
            raise OptionInvalid(str(exc), "--http-credentials") from None
        if credentials and credentials.wants_certificates and not tls_client_ca:
            raise OptionInvalid("client-certificate credentials need --tls-client-ca")
        try:
            config = cls(
                listeners=[
                    ListenerConfig(ch, host, port, context, allows[ch])
                    for ch, host, port in listeners
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
                refresh_seconds=refresh_seconds,
                store_timeout=store_timeout,
                pool_size=pool_size,
                max_indexed_identifiers=max_indexed_identifiers,
                max_batch_messages=max_batch_messages,
                feeds=feeds,
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
            raise OptionInvalid(str(exc)) from None
        return config

    def message_budget(self) -> int:
        """Bytes of messages the process may hold at once, from ``memory_limit`` (or the
        cgroup's limit, or 512 MiB).

        Raises:
            ValueError: the budget cannot hold one message of ``max_frame_bytes`` (and its
                connection): the limit needed is named.
        """
        limit = memory_limit(self.memory_limit)
        budget = budget_for(limit)
        need = self.max_frame_bytes + CONNECTION_BYTES
        if budget < need:
            needed = limit_for(self.max_frame_bytes, 1) // 2**20
            raise ValueError(
                f"a memory limit of {limit // 2**20} MiB leaves {budget // 2**20} MiB for"
                f" messages, less than one message of {self.max_frame_bytes // 2**20} MiB"
                f" (--max-frame-bytes): give ingest at least {needed} MiB"
                " (--memory-limit, or the container's limit)"
            )
        return budget


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


def parse_allow(values: Sequence[str], option: str) -> dict[str, list[str]]:
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
    channels: list[str], networks: Sequence[str], subjects: Sequence[str]
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


def parse_size(value: str | int) -> int:
    """Bytes from ``SIZE`` (suffixes k, M, G and Ki, Mi, Gi are powers of 1024; a trailing B
    is allowed).

    Raises:
        ValueError: not a size.
    """
    if isinstance(value, int):
        return value
    units = {"k": 1024, "ki": 1024, "m": 1024**2, "mi": 1024**2, "g": 1024**3, "gi": 1024**3}
    text = value.strip().lower().removesuffix("b")
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


def server_tls_context(
    cert_file: str,
    key_file: str,
    client_ca_file: str | None = None,
    *,
    client_cert_required: bool = True,
) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or later) for an MLLP listener or the HTTP server.

    Args:
        cert_file: PEM certificate chain of the listener.
        key_file: PEM private key.
        client_ca_file: PEM bundle of CAs; when given, a client certificate must be signed by
            one of them (mutual TLS).
        client_cert_required: with ``client_ca_file``, refuse clients without a certificate
            (MLLP); False asks for one but lets the request authenticate by token instead
            (HTTP).

    Raises:
        OSError, ssl.SSLError: a file is missing or unusable.
        KeyFileExposed: ``key_file`` is readable by other users
            (:func:`inturn.worker.crypto.keyfiles.check_key_file`).
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    check_key_file(key_file, "--tls-key")
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if client_cert_required else ssl.CERT_OPTIONAL
    return context
