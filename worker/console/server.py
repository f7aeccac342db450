"""Running the console: pools, the overview feed and the HTTP site, started and stopped together.

Used by ``inturn console`` and by ``inturn local --console PORT``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from inturn.worker.console.app import make_app
from inturn.worker.console.auth import AuthConfig
from inturn.worker.console.csrf import Csrf
from inturn.worker.console.feed import Feed
from inturn.worker.console.names import ServerNames
from inturn.worker.console.operations import Console
from inturn.worker.console.overview import DEFAULT_STUCK_AFTER
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import address_in_use
from inturn.worker.ingest.quiet import QuietAppRunner
from inturn.worker.store.connect import Pools, announce_pooling

log = logging.getLogger("inturn.console")


@dataclass
class ConsoleServer:
    """A running console. ``port`` is the bound port (useful when asked for port 0)."""

    runner: web.AppRunner
    console: Console
    port: int

    async def stop(self) -> None:
        """Stop serving, stop the feed, close the pools."""
        await self.runner.cleanup()
        await self.console.feed.stop()
        await self.console.write.close()
        await self.console.read.close()


async def start_console(
    dsn: str,
    *,
    host: str,
    port: int,
    auth: AuthConfig,
    csrf_secret: bytes | None = None,
    stuck_after: float = DEFAULT_STUCK_AFTER,
    refresh_seconds: float = 2.0,
    server_names: ServerNames | None = None,
    payloads: PayloadCodec | None = None,
    option: str = "--listen",
    no_worker: Callable[[], Mapping[str, str]] | None = None,
) -> ConsoleServer:
    """Open the pools (writes: 2 connections; reads: 2, read-only, short statement timeout),
    take the first overview (``no_worker``: the destinations the process beside it runs no
    worker for, shown ``no-worker``: ``inturn local``'s), and serve on ``host:port`` the
    requests whose ``Host`` is one of ``server_names`` (default: the loopback names; see
    :mod:`inturn.worker.console.names`).

    Raises:
        psycopg_pool.PoolTimeout: the database could not be reached.
        AddressInUse: the port is taken (the message names ``option``, the command-line option
            that gave ``host:port``: ``--listen`` of ``inturn console``, ``--console`` of
            ``inturn local``).
        OSError: the address cannot be bound otherwise.
    """
    announce_pooling()
    pools = await Pools.open(dsn, write_size=2, read_size=2, application_name="inturn-console")
    write, read = pools.write, pools.read
    feed = Feed(
        dsn,
        read,
        default_stuck_after=stuck_after,
        refresh_seconds=refresh_seconds,
        no_worker=no_worker,
    )
    console = Console(write=write, read=read, feed=feed, payloads=payloads or PayloadCodec())
    try:
        await feed.start()
        app = make_app(console, auth, Csrf(csrf_secret), server_names)
        runner = QuietAppRunner(app, name="console")
        await runner.setup()
        site = web.TCPSite(runner, host, port, shutdown_timeout=2.0)
        try:
            await site.start()
        except OSError as exc:
            raise address_in_use(exc, option, host, port) from None
    except BaseException:
        await feed.stop()
        await write.close()
        await read.close()
        raise
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    log.info(
        "console serving on http://%s:%d/ under the names %s",
        host,
        bound,
        server_names or ServerNames.parse(()),
    )
    return ConsoleServer(runner=runner, console=console, port=bound)
