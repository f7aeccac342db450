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
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Any

from aiohttp import web
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import address_in_use
from inturn.worker.ingest import history_metrics, metrics
from inturn.worker.ingest.accept import (
    Acceptor,
)
from inturn.worker.ingest.budget import (
    MemoryBudget,
    memory_limit,
)
from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.http import make_message_app, make_ops_app
from inturn.worker.ingest.listener import (
    MllpListener,
)
from inturn.worker.ingest.quiet import QuietAppRunner
from inturn.worker.ingest.routing import Router
from inturn.worker.operations import packs
from inturn.worker.operations.payload_keys import close_codec, open_codec
from inturn.worker.store import ingest as ingest_store
from inturn.worker.store import sealing
from inturn.worker.store.connect import Pools, announce_pooling
from inturn.worker.store.keystore import HOLD_RELEASE_SECONDS, PgKeyStore
from inturn.worker.store.periodic import Periodic
from inturn.worker.worklist.hooks import IngestOptions, Recorder
from inturn.worker.worklist.metrics import GAUGE_INTERVAL_SECONDS, refresh_pending

log = logging.getLogger("inturn.ingest")

#: Seconds between two purges of the duplicate window.
PURGE_INTERVAL_SECONDS = 300.0


async def forget_old(
    conn: AsyncConnection[Any], window_seconds: float, *, batch: int = 5000
) -> int:
    """Delete duplicate-window rows older than ``window_seconds``, in batches; return the count.

    Safe to run from several replicas at once (rows locked by another purge are skipped).
    """
    total = 0
    while True:
        done = await ingest_store.forget_old(conn, window_seconds, batch)
        total += done
        if done < batch:
            return total


class Ingest:
    """A running ingest: MLLP listeners, HTTP server, routing refresh, duplicate-window purge.

    Args:
        config: listeners and limits.
        dsn: the database to open pools on (``application_name`` ``inturn-ingest``); or
        pools: open :class:`~inturn.worker.store.connect.Pools` to use instead (not closed by
            :meth:`stop`).
        lanes: the body of ``GET /lanes`` on ``--ops`` (``inturn local``: its workers' lanes,
            :func:`inturn.worker.drain.health.lanes_text`); None: ``/lanes`` is not served.

    Use :meth:`start` / :meth:`stop`, or ``async with``. After :meth:`start`, ``mllp_ports``
    maps each channel to its bound port and ``http_port`` is the HTTP port (None without HTTP).
    """

    def __init__(
        self,
        config: IngestConfig,
        *,
        dsn: str | None = None,
        pools: Pools | None = None,
        lanes: Callable[[], str] | None = None,
        also_ready: Callable[[], str | None] | None = None,
    ) -> None:
        if (dsn is None) == (pools is None):
            raise ValueError("pass exactly one of dsn and pools")
        self.config = config
        self._lanes = lanes  #: the body of ``/lanes`` on --ops (inturn local's workers)
        #: what else must be ready for ``/readyz`` (inturn local: its workers' failing steps)
        self._also_ready = also_ready
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
        #: The periodic statements of this process by name (after :meth:`start`): the
        #: duplicate window's purge (``window-purge``), the feeds' last-message times
        #: (``feeds``), the key store's check and the index form (``index-form``), the
        #: worklist gauge (``worklist-gauge``); each rides out a refusal of the database
        #: (:mod:`inturn.worker.store.periodic`). The routing refresh is the router's.
        self.periodic: dict[str, Periodic] = {}
        self._periodic_tasks: list[asyncio.Task[None]] = []
        #: What the packs note about every accepted message (the feeds pack's last-message
        #: times when feeds are declared), or None (:func:`.packs.recorder`).
        self.recorder: Recorder | None = None
        self._started = False
        self._stopping = False
        self._closed = asyncio.Event()
        #: Seals payloads (set by :meth:`start` from ``payload_keys``/``key_dsn``).
        self.payloads: PayloadCodec | None = None

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
        self,
        app: web.Application,
        address: tuple[str, int],
        context: ssl.SSLContext | None,
        option: str,
    ) -> int:
        """Serve ``app`` on ``address``; the bound port.

        Raises:
            AddressInUse: another program listens there (the message names ``option``).
        """
        runner = QuietAppRunner(app, name="ingest-http", access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        host, port = address
        try:
            await web.TCPSite(runner, host or None, port, ssl_context=context).start()
        except OSError as exc:
            raise address_in_use(exc, option, host, port) from None
        return _bound_port(runner, port)

    @property
    def dsn(self) -> str:
        """The database this ingest stores in (its own pools' or the given pools' DSN)."""
        if self._dsn is not None:
            return self._dsn
        assert self._pools is not None
        return str(self._pools.write.conninfo)

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
        store = self.payloads.store if self.payloads is not None else None
        if isinstance(store, PgKeyStore):
            down = store.health()  # new patients' messages are refused (AE) meanwhile
            if down is not None:
                return down
        return self._also_ready() if self._also_ready is not None else None

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
        announce_pooling()
        config = self.config
        try:
            if self._pools is None:
                assert self._dsn is not None
                self._pools = await Pools.open(
                    self._dsn,
                    write_size=config.pool_size,
                    read_size=1,
                    application_name="inturn-ingest",
                    check=False,  # a connection found gone is replaced and the store retried
                )
            pools = self._pools
            self.payloads = await open_codec(
                config.payload_keys,
                config.key_dsn,
                max_identifiers=config.max_indexed_identifiers,
                application_name="inturn-ingest-keys",
                release_after=HOLD_RELEASE_SECONDS,  # a hold's COMMIT not in a batch's way
            )
            if self.payloads.enabled:
                # before anything is sealed: a lookup by patient without keys then refuses
                async with pools.write.connection() as conn:
                    await sealing.mark_in_use(conn)
                await self._watch_index_form(pools)
            self.router = Router(pools.read, config.refresh_seconds)
            await self.router.refresh()
            self.recorder = packs.recorder(
                IngestOptions(feeds=config.feeds, max_feed_senders=config.max_feed_senders)
            )
            if self.recorder is not None:
                await self.recorder.declare(pools.write)
            self.acceptor = Acceptor(
                pools.write,
                self.router,
                hold_unrouted=config.hold_unrouted,
                accept_unrouted=config.accept_unrouted,
                duplicate_window_seconds=config.duplicate_window,
                delivered_window_seconds=config.duplicate_delivered_window,
                store_timeout_seconds=config.store_timeout,
                max_indexed_identifiers=config.max_indexed_identifiers,
                max_batch_messages=config.max_batch_messages,
                recorder=self.recorder,
                payloads=self.payloads,
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
                self._http_port = await self._serve_http(
                    app, config.http, config.http_ssl, "--http"
                )
                log.log(
                    logging.INFO if config.credentials and config.http_ssl else logging.WARNING,
                    "HTTP messages on %s:%d%s",
                    config.http[0] or "*",
                    self._http_port,
                    _http_mode(config),
                )
            if config.ops is not None:
                self._ops_port = await self._serve_http(
                    make_ops_app(self.readiness, self._lanes, [self.dsn]), config.ops, None, "--ops"
                )
                log.info(
                    "/healthz, /readyz and /metrics on %s:%d", config.ops[0] or "*", self._ops_port
                )
            self.router.start()
            self.periodic = self._periodic_statements(pools)
            self._periodic_tasks = [
                asyncio.create_task(p.forever(), name=f"inturn-ingest-{name}")
                for name, p in self.periodic.items()
            ]
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
            tasks, self._periodic_tasks = self._periodic_tasks, []
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for periodic in self.periodic.values():
                periodic.condition.forget()
            await asyncio.gather(
                *(listener.stop(self.config.shutdown_grace) for listener in self.listeners),
                return_exceptions=True,
            )
            for runner in self._runners:
                await runner.cleanup()
            self._runners.clear()
            if self.acceptor is not None:
                await self.acceptor.committer.close(self.config.shutdown_grace)
                self.acceptor.storing.forget()
            if self.recorder is not None and self._pools is not None:
                await self.recorder.close(self._pools.write)
            if self._own_pools and self._pools is not None:
                await self._pools.close()
            if self.payloads is not None:
                await close_codec(self.payloads)
        finally:
            self._closed.set()

    async def _watch_index_form(self, pools: Pools) -> None:
        """Write both index forms (blind and plain) while a pending row is still in clear
        (stored before the keys were given): lanes compare keys, and one patient's pending
        rows must never hold disjoint ones. ``inturn keys encrypt-existing`` seals those rows."""
        assert self.payloads is not None
        async with pools.read.connection() as conn:
            dual = await sealing.plaintext_pending(conn)
        if dual != self.payloads.dual_index:
            log.info(
                "patient index: %s",
                "both forms while pending rows in clear remain (run `inturn keys encrypt-existing`)"
                if dual
                else "the blind form alone",
            )
        self.payloads.dual_index = dual

    async def _check_index_form(self, pools: Pools) -> None:
        """One turn of the index form's watch: the key store looked at again when it failed
        (a readiness that failed must see it back without traffic), a blind index key rotated
        meanwhile taken (``inturn keys rotate-index``), then the form."""
        store = self.payloads.store if self.payloads is not None else None
        if isinstance(store, PgKeyStore) and store.failing_since is not None:
            await store.ping()
            log.info("key store (--key-dsn) reachable again")
        if self.payloads is not None and await self.payloads.refresh_index():
            log.info(
                "blind index key: generation %d taken (%s)",
                self.payloads.generation,
                self.payloads.rotation or "rotation ended",
            )
        await self._watch_index_form(pools)

    async def _forget_old(self) -> None:
        async with self.pools.write.connection(timeout=30) as conn:
            removed = await forget_old(conn, self.config.duplicate_window)
        if removed:
            log.info("duplicate window: forgot %d messages older than the window", removed)

    def _periodic_statements(self, pools: Pools) -> dict[str, Periodic]:
        """This process's periodic statements (:attr:`periodic`), by what the configuration
        turns on."""
        config = self.config
        found: dict[str, Periodic] = {}
        if config.duplicate_window > 0:
            every = min(PURGE_INTERVAL_SECONDS, max(1.0, config.duplicate_window / 4))
            found["window-purge"] = Periodic(
                log,
                "the duplicate window's purge",
                every,
                self._forget_old,
                cure=f"every {every:g}s",
            )
        if self.recorder is not None:
            recorder, every = self.recorder, config.feed_flush_seconds
            found["feeds"] = Periodic(
                log,
                "writing the feeds' last-message times (kept meanwhile)",
                every,
                partial(recorder.flush, pools.write),
                cure=f"every {every:g}s",
            )
        if self.payloads is not None and self.payloads.enabled:
            every = sealing.INDEX_FORM_EVERY_SECONDS
            found["index-form"] = Periodic(
                log,
                "checking the key store and the patient index form",
                every,
                partial(self._check_index_form, pools),
                cure="the form in use is kept",
            )
        if config.ops is not None:
            found["worklist-gauge"] = Periodic(
                log,
                "counting pending worklist items (inturn_worklist_pending)",
                GAUGE_INTERVAL_SECONDS,
                partial(refresh_pending, pools.read),
            )
            found["history-gauge"] = Periodic(
                log,
                "reading the history's size (inturn_history_*)",
                history_metrics.GAUGE_INTERVAL_SECONDS,
                partial(history_metrics.refresh, pools.read),
            )
        return found


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
