"""How a command reaches the database: the pools opened on ``--dsn`` (or ``INTURN_DSN``) for one
command, a read or write connection under a lock watch, and an operation's refusals as
one-line errors. Every command group uses these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.errors import InturnError, ReasonRequired
from inturn.worker.store import faults, lockwatch
from inturn.worker.store.connect import READ_STATEMENT_TIMEOUT_MS, Pools, probe, write_target
from inturn.worker.store.dsn import resolve_dsn

T = TypeVar("T")

#: How long a maintenance job's run (``inturn queue purge``, ``inturn sweep``) waits out a
#: database that refuses, seconds: the singletons' ttl (a run waiting longer would find its
#: singleton taken over), and twice a maintenance window's usual read-only minute.
REFUSAL_WAIT_SECONDS = 120.0
#: First wait after a refused run, seconds; doubled per try up to :data:`REFUSAL_MAX_BACKOFF`.
REFUSAL_FIRST_BACKOFF = 0.5
REFUSAL_MAX_BACKOFF = 30.0


def through_refusals(
    what: str,
    run: Callable[[], T],
    *,
    wait_seconds: float = REFUSAL_WAIT_SECONDS,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """Run a maintenance job's run (``run``: one whole try, on connections of its own), again
    while the database refuses it in a way waiting can end (read-only for maintenance or a
    standby, a lock or statement timeout, the connection gone, too many connections:
    :func:`inturn.worker.store.faults.refusal`), after a backoff from 0.5 s doubling to 30 s,
    for at most ``wait_seconds``: the rule of every periodic statement
    (:mod:`inturn.worker.store.periodic`) for a CronJob's process. Two lines on stderr, when
    the refusal begins and when it ends, never one per try. The runs are resumable (what a
    refused try committed stays done; the next does the rest).

    Raises:
        Exception: what ``run`` raised when it is not such a refusal, or when the refusal
            outlasts ``wait_seconds`` (the one-line error of every command follows).
    """
    deadline = time.monotonic() + wait_seconds
    began: float | None = None
    tries = 0
    while True:
        try:
            result = run()
        except Exception as exc:
            cause = faults.refusal(exc)
            now = time.monotonic()
            if cause is None or now >= deadline:
                raise
            tries += 1
            if began is None:
                began = now
                click.echo(
                    f"{what}: the database refuses: {cause}; trying again for up to"
                    f" {wait_seconds:g} s",
                    err=True,
                )
            backoff = REFUSAL_FIRST_BACKOFF * 2.0 ** min(tries - 1, 30)
            sleep(max(0.0, min(backoff, REFUSAL_MAX_BACKOFF, deadline - now)))
            continue
        if began is not None:
            lasted = time.monotonic() - began
            click.echo(
                f"{what}: works again after {lasted:.1f} s ({tries} refused tries)", err=True
            )
        return result


def run_db(dsn: str | None, action: Callable[[Pools], Awaitable[T]]) -> T:
    """Open the pools on ``dsn`` (or ``$INTURN_DSN``), run ``action`` with them, close them.

    Raises:
        click.ClickException: ``INTURN_LOCK_WAIT_SECONDS`` is not a number of seconds.
    """
    target = resolve_dsn(dsn)
    try:
        lockwatch.threshold_from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    # The probe fails fast with the server's own words; the pool would retry for 10 s.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

    async def go() -> T:
        await probe(target)
        async with await Pools.open(target, write_size=1, read_size=1) as pools:
            return await action(pools)

    return asyncio.run(go())


def run_read(dsn: str | None, action: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
    """Run ``action`` on a connection of the read-only pool (see :func:`run_db`), under a lock
    watch (:func:`watched`)."""

    async def go(pools: Pools) -> T:
        async with pools.read.connection() as conn:
            return await watched(_conninfo(pools), conn, action)

    return run_db(dsn, go)


def run_write(dsn: str | None, action: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
    """Run ``action`` on a connection of the write pool (see :func:`run_db`), under a lock
    watch (:func:`watched`)."""

    async def go(pools: Pools) -> T:
        async with pools.write.connection() as conn:
            return await watched(_conninfo(pools), conn, action)

    return run_db(dsn, go)


def _conninfo(pools: Pools) -> str:
    conninfo = pools.write.conninfo
    assert isinstance(conninfo, str)  # Pools.open gives the pools the DSN itself
    return conninfo


async def watched(
    conninfo: str,
    conn: AsyncConnection[Any],
    action: Callable[[AsyncConnection[Any]], Awaitable[T]],
) -> T:
    """Run ``action(conn)`` under a lock watch (:mod:`inturn.worker.store.lockwatch`): past the
    threshold (``INTURN_LOCK_WAIT_SECONDS``, and at most half the read pool's statement
    timeout, so that the look comes before the timeout), a line on stderr names the session
    the command waits for; a statement cancelled by its timeout after such a wait fails with
    :class:`~inturn.worker.store.lockwatch.LockWaitError` naming it, not as an unreachable
    database. ``conninfo`` is the DSN the look connects with (only when a wait is that long).
    """
    threshold = min(lockwatch.threshold_from_env(), READ_STATEMENT_TIMEOUT_MS / 2000)

    async def side() -> AsyncConnection[Any]:
        return await AsyncConnection.connect(
            conninfo,
            autocommit=True,
            application_name="inturn lock watch",
            connect_timeout=lockwatch.CONNECT_TIMEOUT_SECONDS,
            **write_target(conninfo),  # the locks are the primary's
        )

    said = False

    def on_wait(wait: lockwatch.LockWait, added_seconds: float) -> None:
        nonlocal said
        if not said and not wait.ended:
            said = True
            click.echo(f"inturn: {wait.describe()}", err=True)

    async with lockwatch.watch(conn, side, threshold=threshold, on_wait=on_wait):
        return await action(conn)


def act(dsn: str | None, action: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
    """Run one action of :mod:`inturn.worker.operations.queue` on a write connection; its
    refusals (no such item, its state, a missing reason) become one-line errors (exit 2)."""
    try:
        return run_write(dsn, action)
    except ReasonRequired as exc:
        raise click.UsageError(f"{exc} (--why)") from None
    except InturnError as exc:
        raise click.ClickException(str(exc)) from None


async def with_payloads(
    payload_keys: str | None,
    key_dsn: str | None,
    use: Callable[[PayloadCodec], Awaitable[T]],
) -> T:
    """Run ``use`` with the codec of ``--payload-keys``/``--key-dsn`` (plaintext without
    them: an envelope met is refused in one line naming ``--payload-keys``), then close it."""
    from inturn.worker.operations.payload_keys import close_codec, open_codec

    codec = await open_codec(payload_keys, key_dsn, application_name="inturn-cli-keys")
    try:
        return await use(codec)
    finally:
        await close_codec(codec)
