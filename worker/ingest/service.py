"""``Ingest``: the MLLP listeners, the HTTP server, the routing refresh and the window purge.

One object runs a whole ingest process, so that ``inturn ingest`` and ``inturn local`` (which
runs it next to its workers) share it::

    config = IngestConfig(listeners=[ListenerConfig("adt", port=2575)],
                          http=("0.0.0.0", 8080), credentials=CredentialsFile(path),
                          ops=("0.0.0.0", 9090))
    async with Ingest(config, dsn=dsn) as ingest:      # start() ... stop()
        print(ingest.mllp_ports["adt"], ingest.http_port, ingest.ops_port)
        await ingest.wait_closed()                     # or run alongside other tasks
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web

from inturn.worker.feeds.declare import Feed
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.ingest import metrics
from inturn.worker.ingest.accept import (
    DEFAULT_DUPLICATE_WINDOW_SECONDS,
    DEFAULT_MAX_BATCH_MESSAGES,
    DEFAULT_STORE_TIMEOUT_SECONDS,
    Acceptor,
    forget_old,
)
from inturn.worker.ingest.budget import (
    CONNECTION_BYTES,
    DEFAULT_WAIT_SECONDS,
    MemoryBudget,
    budget_for,
    limit_for,
    memory_limit,
)
from inturn.worker.ingest.credentials import CredentialSource
from inturn.worker.ingest.feeds import DEFAULT_FLUSH_SECONDS, DEFAULT_MAX_SENDERS, FeedRecorder
from inturn.worker.ingest.http import make_message_app, make_ops_app
from inturn.worker.ingest.listener import (
    DEFAULT_FRAME_DEADLINE,
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_FRAME_BYTES,
    ListenerConfig,
    MllpListener,
)
from inturn.worker.ingest.quiet import QuietAppRunner
from inturn.worker.ingest.routing import DEFAULT_REFRESH_SECONDS, Router, check_channel
from inturn.worker.store.connect import Pools
from inturn.worker.worklist.metrics import refresh_pending_forever

log = logging.getLogger("inturn.ingest")

#: Seconds between two purges of the duplicate window.
PURGE_INTERVAL_SECONDS = 300.0


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
        hold_unrouted: channels whose messages without a destination are held in
            ``_unrouted/<channel>`` instead of answered AR.
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
        feeds: declared feeds (:mod:`inturn.worker.feeds.declare`), or None to leave the
            declarations in the database alone. Given (even empty), they are written at start
            and ingest records when each last received a message.
        feed_flush_seconds: seconds between two writes of the last-message times.
        max_feed_senders: most senders recorded per per-sender feed.
        memory_limit: bytes the process may use; its message budget is derived from it
            (:func:`inturn.worker.ingest.budget.budget_for`). None: the cgroup's limit, else
            512 MiB.
        busy_wait: longest seconds a message waits for memory before it is answered AE busy.
        frame_deadline: seconds an MLLP frame may take from its first byte to its last.
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
    hold_unrouted: frozenset[str] = field(default_factory=frozenset)
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    store_timeout: float = DEFAULT_STORE_TIMEOUT_SECONDS
    pool_size: int = 16
    shutdown_grace: float = 10.0
    max_indexed_identifiers: int = MAX_INDEXED_IDENTIFIERS
    max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES
    feeds: tuple[Feed, ...] | None = None
    feed_flush_seconds: float = DEFAULT_FLUSH_SECONDS
    max_feed_senders: int = DEFAULT_MAX_SENDERS
    memory_limit: int | None = None
    busy_wait: float = DEFAULT_WAIT_SECONDS
    frame_deadline: float = DEFAULT_FRAME_DEADLINE

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
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if client_cert_required else ssl.CERT_OPTIONAL
    return context


class Ingest:
    """A running ingest: MLLP listeners, HTTP server, routing refresh, duplicate-window purge.

    Args:
        config: listeners and limits.
        dsn: the database to open pools on (``application_name`` ``inturn-ingest``); or
        pools: open :class:`~inturn.worker.store.connect.Pools` to use instead (not closed by
            :meth:`stop`).

    Use :meth:`start` / :meth:`stop`, or ``async with``. After :meth:`start`, ``mllp_ports``
    maps each channel to its bound port and ``http_port`` is the HTTP port (None without HTTP).
    """

    def __init__(
        self, config: IngestConfig, *, dsn: str | None = None, pools: Pools | None = None
    ) -> None:
        if (dsn is None) == (pools is None):
            raise ValueError("pass exactly one of dsn and pools")
        self.config = config
        self._dsn = dsn
        self._pools = pools
        self._own_pools = pools is None
        self.router: Router | None = None
        self.acceptor: Acceptor | None = None
        self.budget: MemoryBudget | None = None
        self.listeners: list[MllpListener] = []
        self._runners: list[web.AppRunner] = []
        self._http_port: int | None = None
        self._ops_port: int | None = None
        self._purge_task: asyncio.Task[None] | None = None
        self._gauge_task: asyncio.Task[None] | None = None
        self._feeds_task: asyncio.Task[None] | None = None
        #: When feeds are declared: when each last received a message.
        self.feeds: FeedRecorder | None = None
        self._started = False
        self._stopping = False
        self._closed = asyncio.Event()

    @property
    def pools(self) -> Pools:
        """The pools in use (after :meth:`start`)."""
        if self._pools is None:
            raise RuntimeError("ingest is not started")
        return self._pools

    @property
    def mllp_ports(self) -> dict[str, int]:
        """``{channel: bound port}`` of the MLLP listeners."""
        return {listener.channel: listener.port for listener in self.listeners}

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port, or None when there is no HTTP server."""
        return self._http_port

    @property
    def ops_port(self) -> int | None:
        """The bound operations port, or None when there is no operations server."""
        return self._ops_port

    async def _serve_http(
        self, app: web.Application, address: tuple[str, int], context: ssl.SSLContext | None
    ) -> int:
        runner = QuietAppRunner(app, name="ingest-http", access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        host, port = address
        await web.TCPSite(runner, host or None, port, ssl_context=context).start()
        return _bound_port(runner, port)

    def readiness(self) -> str | None:
        """None when ready to take messages, else a short reason."""
        if not self._started:
            return "starting"
        if self._stopping:
            return "shutting down"
        assert self.router is not None
        age = self.router.age()
        limit = max(15.0, 5 * self.config.refresh_seconds)
        if age is None:
            return "routing table not loaded"
        if age > limit:
            return f"destination registry unreadable for {age:.0f} s"
        return None

    async def start(self) -> None:
        """Open the pools, load the routing table, then bind every listener and the HTTP server.

        Listeners bind only after the first routing table is loaded, so the first message is
        routed like every later one.

        Raises:
            psycopg_pool.PoolTimeout, psycopg.Error: the database cannot be used.
            OSError: an address cannot be bound.
        """
        if self._started:
            raise RuntimeError("already started")
        config = self.config
        try:
            if self._pools is None:
                assert self._dsn is not None
                self._pools = await Pools.open(
                    self._dsn,
                    write_size=config.pool_size,
                    read_size=1,
                    application_name="inturn-ingest",
                )
            pools = self._pools
            self.router = Router(pools.read, config.refresh_seconds)
            await self.router.refresh()
            if config.feeds is not None:
                self.feeds = FeedRecorder(config.feeds, max_senders=config.max_feed_senders)
                await self.feeds.declare(pools.write)
            self.acceptor = Acceptor(
                pools.write,
                self.router,
                hold_unrouted=config.hold_unrouted,
                duplicate_window_seconds=config.duplicate_window,
                store_timeout_seconds=config.store_timeout,
                max_indexed_identifiers=config.max_indexed_identifiers,
                max_batch_messages=config.max_batch_messages,
                feeds=self.feeds,
            )
            self.budget = MemoryBudget(config.message_budget(), config.busy_wait)
            metrics.BUDGET_BYTES.set(self.budget.capacity)
            budget = self.budget
            metrics.BUDGET_USED_BYTES.set_function(lambda: budget.used)
            log.info(
                "memory for messages: %d MiB of the %d MiB ingest may use (%d of the largest"
                " size at once)",
                budget.capacity // 2**20,
                memory_limit(config.memory_limit) // 2**20,
                budget.capacity // config.max_frame_bytes,
            )
            for listener_config in config.listeners:
                listener = MllpListener(
                    listener_config,
                    self.acceptor,
                    budget=budget,
                    max_frame_bytes=config.max_frame_bytes,
                    idle_timeout=config.idle_timeout,
                    frame_timeout=config.frame_timeout,
                    frame_deadline=config.frame_deadline,
                )
                await listener.start()
                self.listeners.append(listener)
                log.info(
                    "channel %s: MLLP%s listening on %s:%d",
                    listener.channel,
                    " over TLS" if listener_config.ssl else "",
                    listener_config.host or "*",
                    listener.port,
                )
            if config.http is not None:
                app = make_message_app(
                    self.acceptor,
                    config.max_frame_bytes,
                    config.credentials,
                    budget,
                    body_deadline=config.frame_deadline,
                )
                self._http_port = await self._serve_http(app, config.http, config.http_ssl)
                log.log(
                    logging.INFO if config.credentials and config.http_ssl else logging.WARNING,
                    "HTTP messages on %s:%d%s",
                    config.http[0] or "*",
                    self._http_port,
                    _http_mode(config),
                )
            if config.ops is not None:
                self._ops_port = await self._serve_http(
                    make_ops_app(self.readiness), config.ops, None
                )
                log.info(
                    "/healthz, /readyz and /metrics on %s:%d", config.ops[0] or "*", self._ops_port
                )
            self.router.start()
            if config.duplicate_window > 0:
                self._purge_task = asyncio.create_task(
                    self._purge_loop(), name="inturn-ingest-purge"
                )
            if self.feeds is not None:
                self._feeds_task = asyncio.create_task(
                    self.feeds.run(pools.write, config.feed_flush_seconds),
                    name="inturn-ingest-feeds",
                )
            if config.ops is not None:
                self._gauge_task = asyncio.create_task(
                    refresh_pending_forever(self.pools.read), name="inturn-worklist-gauge"
                )
        except BaseException:
            await self._shutdown()
            raise
        self._started = True

    async def stop(self) -> None:
        """Stop taking messages, let those being stored finish (within the grace), close all."""
        if self._stopping:
            await self._closed.wait()
            return
        self._stopping = True
        await self._shutdown()

    async def wait_closed(self) -> None:
        """Wait until :meth:`stop` has completed."""
        await self._closed.wait()

    async def __aenter__(self) -> Ingest:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _shutdown(self) -> None:
        self._stopping = True
        try:
            if self.router is not None:
                await self.router.stop()
            for task in (self._purge_task, self._gauge_task, self._feeds_task):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            self._purge_task = self._gauge_task = self._feeds_task = None
            await asyncio.gather(
                *(listener.stop(self.config.shutdown_grace) for listener in self.listeners),
                return_exceptions=True,
            )
            for runner in self._runners:
                await runner.cleanup()
            self._runners.clear()
            if self.acceptor is not None:
                await self.acceptor.committer.close(self.config.shutdown_grace)
            if self.feeds is not None and self._pools is not None:
                await self.feeds.close(self._pools.write)
            if self._own_pools and self._pools is not None:
                await self._pools.close()
        finally:
            self._closed.set()

    async def _purge_loop(self) -> None:
        interval = min(PURGE_INTERVAL_SECONDS, max(1.0, self.config.duplicate_window / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                async with self.pools.write.connection(timeout=30) as conn:
                    removed = await forget_old(conn, self.config.duplicate_window)
            except Exception as exc:
                log.warning("duplicate window purge failed: %s", type(exc).__name__)
            else:
                if removed:
                    log.info("duplicate window: forgot %d messages older than the window", removed)


def _http_mode(config: IngestConfig) -> str:
    if config.http_insecure:
        return (
            " OPEN: no authentication, anyone who reaches this port can post to every channel"
            + ("" if config.http_ssl else ", over plain HTTP")
        )
    assert config.credentials is not None
    transport = "over TLS" if config.http_ssl else "over plain HTTP (tokens travel in clear)"
    return f" {transport}, {len(config.credentials.current().entries)} credential(s)"


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested


async def run_until_signal(ingest: Ingest) -> None:
    """Start ``ingest``, run until SIGTERM or SIGINT, then stop it gracefully."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await ingest.start()
    try:
        await stop.wait()
        log.info("signal received: stopping")
    finally:
        await ingest.stop()
