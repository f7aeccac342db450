"""Stopping workers on a signal: the first one stops them gently, a second one abandons.

A worker asked to stop finishes the attempt in flight (up to the destination's
``retry.timeoutSeconds``) so that the receiver's ACK is recorded and the message is not sent
twice; a delivered mark being written again (a full disk, a lock timeout) is part of it and is
waited for too. That wait is said out loud; a second Ctrl-C (or SIGTERM) cancels the attempts
still in flight, whose messages stay pending and go first on the next start.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any

from inturn.worker.drain.runner import DestinationWorker

log = logging.getLogger("inturn.drain")

#: The signals that stop: Ctrl-C, kill, and closing the terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def install(stop: asyncio.Event, abandon: asyncio.Event) -> None:
    """On the running loop: the first stop signal sets ``stop``, any later one ``abandon``."""

    def on_signal() -> None:
        if stop.is_set():
            abandon.set()
        else:
            stop.set()

    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)


async def finish(
    running: Sequence[tuple[DestinationWorker, asyncio.Task[None]]],
    abandon: asyncio.Event,
    *,
    say: Callable[[str], None] = log.info,
) -> None:
    """Wait for workers already told to stop; cancel them all if ``abandon`` is set first.

    Before waiting, says which destinations have an attempt in flight and for how long at most
    it is waited for.
    """
    tasks = [task for _, task in running if not task.done()]
    if not tasks:
        return
    for worker, task in running:
        if not task.done() and worker.state.sending_since is not None:
            say(
                f"destination {worker.destination}: waiting up to"
                f" {worker.config.retry.timeout_seconds}s for the answer to the attempt in"
                " flight; Ctrl-C again abandons it (the message stays pending)"
            )
        elif not task.done() and worker.state.trouble is not None:
            say(
                f"destination {worker.destination}: waiting for {worker.state.trouble}; Ctrl-C"
                " again abandons it (a delivered message not yet marked is sent again)"
            )
    everything: asyncio.Future[Any] = asyncio.gather(*tasks, return_exceptions=True)
    abandoned: asyncio.Future[Any] = asyncio.ensure_future(abandon.wait())
    try:
        await asyncio.wait([everything, abandoned], return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():
            log.warning("abandoning the attempts in flight; their messages stay pending")
            for task in tasks:
                task.cancel()
            await everything
    finally:
        abandoned.cancel()
