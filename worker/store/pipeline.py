"""Pipelined statements (psycopg's pipeline mode) that never stall on what they send.

In pipeline mode psycopg puts the connection in libpq's non-blocking mode: a statement's
messages go into libpq's output buffer, and the socket takes what it can at each flush.
``AsyncPipeline.sync()`` queues a Sync and then waits for the server's answers after *one*
flush once its last command is queued (``PQpipelineSync`` does not flush to the end in
non-blocking mode either). When more was queued than the socket took by then, the rest stays in
the client: the server waits for it in the middle of a statement (``ClientRead``, state
``active``) while the client waits for answers, both for ever. A sealed ingest batch of about
2.4 MB of payloads hung so over the embedded server's Unix socket, about 20 MB over loopback
TCP (its buffers grow to 4 MiB); nothing the server sends is involved, so no bound on statements
or bytes per Sync would make it impossible, only rarer.

:func:`sync` is the store's only way to sync a pipeline: it sends everything queued first,
reading whatever the server answers meanwhile (so that the server never blocks writing to us
while we write to it), then syncs. A pipeline's other waits already send everything first:
a cursor's fetch (``PQsendFlushRequest`` and psycopg's flush loop) and the end of the
``async with conn.pipeline()`` block. ``tests/unit/test_layers.py`` keeps ``.sync()`` of a
pipeline to this module.
"""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection, AsyncPipeline


async def send_all(conn: AsyncConnection[Any]) -> None:
    """Send everything libpq holds for ``conn`` (its output buffer emptied into the socket),
    waiting for the socket to take it; what the server answers meanwhile is read into libpq's
    input buffer (the pipeline's fetch returns it later). As long as the server reads, or the
    connection breaks: the same bound as the statements it sends.

    Raises:
        psycopg.OperationalError: the connection broke (libpq's flush or read failed).
    """
    pgconn = conn.pgconn
    while pgconn.flush():  # 1: some left in the buffer, the socket full for now
        if await _readable_or_writable(pgconn.socket):
            pgconn.consume_input()


async def sync(conn: AsyncConnection[Any], pipe: AsyncPipeline) -> None:
    """``pipe.sync()`` once everything queued has been sent (:func:`send_all`): the results of
    the statements queued so far are then fetched, and an error among them raised.

    Raises:
        psycopg.Error: as ``AsyncPipeline.sync()`` (an error of a queued statement; the
            connection broke).
    """
    await send_all(conn)
    await pipe.sync()


async def _readable_or_writable(fd: int) -> bool:
    """Wait until ``fd`` can be read or written; True when it can be read."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()

    def seen(readable: bool) -> None:
        if not ready.done():
            ready.set_result(readable)

    loop.add_reader(fd, seen, True)
    try:
        loop.add_writer(fd, seen, False)
        try:
            return await ready
        finally:
            loop.remove_writer(fd)
    finally:
        loop.remove_reader(fd)
