"""The feeds pack's ingest recorder: when each declared feed last received a message.

Ingest reaches it through the registry (:func:`inturn.worker.operations.packs.recorder`, the
pack's ``record`` hook: :func:`recorder`), never by import.

A message accepted on a declared channel updates a dictionary (:meth:`FeedRecorder.seen`, no
I/O); every ``flush_seconds`` the latest time per channel and per sender goes to the database
in one transaction (:meth:`FeedRecorder.flush`: one upsert statement for the channels, one for
the senders), so recording costs no write per message. A crash loses at most one interval of
times: a feed then looks quieter than it was by that much, and the sweeper may raise it that
much early only if the interval is longer than its ``silentAfterSeconds`` (keep it shorter).

Senders are bounded per channel (``max_senders``) twice: in memory, per process (a sender beyond
the bound is recorded for the channel only), and in the table, whatever the process: the table
refuses a new sender over its channel's bound (migration 0017, under a lock of the feed's row),
so restarts and several ingest replicas cannot multiply it. Either refusal is counted in
``inturn_ingest_feed_senders_over_bound_total``; a peer that writes a new MSH-3 into every
message costs neither memory nor rows. The messages of each sender are counted too: a sender
seen once is noise, which the sweeper never raises as silent and which is the first to give
its place to a newcomer over the bound; a sender seen more than once keeps its place.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import partial

from prometheus_client import Counter
from psycopg_pool import AsyncConnectionPool

from inturn.worker.feeds.declare import Feed, sender_key
from inturn.worker.spec.schedule import to_spec
from inturn.worker.store import feeds as store
from inturn.worker.store.periodic import Periodic
from inturn.worker.worklist.hooks import IngestOptions

log = logging.getLogger("inturn.feeds.recorder")

SENDERS_OVER_BOUND = Counter(
    "inturn_ingest_feed_senders_over_bound",
    "Messages on a per-sender feed whose sender was beyond --max-feed-senders (recorded for"
    " the channel only)",
    ["channel"],
)


class FeedRecorder:
    """See the module docstring.

    Args:
        feeds: the declared feeds; messages on other channels are not recorded.
        max_senders: most senders recorded per per-sender channel (0 or more; ingest's
            ``--max-feed-senders``).
        clock: seconds since the epoch (tests pin it).
    """

    def __init__(
        self,
        feeds: Iterable[Feed],
        *,
        max_senders: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_senders < 0:
            raise ValueError("max_senders must not be negative")
        self.feeds = {f.channel: f for f in feeds}
        self.max_senders = max_senders
        self.clock = clock
        self._pending: dict[tuple[str, str], float] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._senders: dict[str, set[str]] = {}

    def seen(self, channel: str, sending_application: str, sending_facility: str) -> None:
        """Note that a message from MSH-3/MSH-4 was accepted on ``channel`` now (no I/O)."""
        feed = self.feeds.get(channel)
        if feed is None:
            return
        now = self.clock()
        self._pending[(channel, "")] = now
        if not feed.per_sender:
            return
        sender = sender_key(sending_application, sending_facility)
        known = self._senders.setdefault(channel, set())
        if sender not in known:
            if len(known) >= self.max_senders:
                SENDERS_OVER_BOUND.labels(channel).inc()
                return
            known.add(sender)
        self._pending[(channel, sender)] = now
        self._counts[(channel, sender)] = self._counts.get((channel, sender), 0) + 1

    def take(self) -> list[tuple[str, str, datetime]]:
        """The times noted since the last take, and forget them: ``(channel, sender, at)``."""
        pending, self._pending = self._pending, {}
        return [
            (channel, sender, datetime.fromtimestamp(at, UTC))
            for (channel, sender), at in sorted(pending.items())
        ]

    def take_counts(self) -> dict[tuple[str, str], int]:
        """The messages per ``(channel, sender)`` noted since the last take, and forget them."""
        counts, self._counts = self._counts, {}
        return counts

    async def declare(self, pool: AsyncConnectionPool) -> None:
        """Write the declarations: the declared feeds become exactly these."""
        async with pool.connection() as conn:
            await store.declare(
                conn,
                [
                    store.DeclaredFeed(
                        channel=f.channel,
                        silent_after_seconds=f.silent_after_seconds,
                        per_sender=f.per_sender,
                        schedule=None if f.schedule is None else to_spec(f.schedule),
                        max_senders=self.max_senders,
                    )
                    for f in self.feeds.values()
                ],
            )

    async def flush(self, pool: AsyncConnectionPool) -> int:
        """Write the noted times and counts (one transaction); return how many times. On
        failure they are kept for the next flush (a later time noted meanwhile wins). Senders
        the table refused (over the bound) are counted and forgotten."""
        rows = self.take()
        counts = self.take_counts()
        if not rows:
            return 0
        try:
            async with pool.connection() as conn:
                refused = await store.record_seen(conn, rows, counts=counts)
        except BaseException:
            for channel, sender, at in rows:
                key = (channel, sender)
                self._pending[key] = max(self._pending.get(key, 0.0), at.timestamp())
            for key, n in counts.items():
                self._counts[key] = self._counts.get(key, 0) + n
            raise
        for channel, sender in refused:
            SENDERS_OVER_BOUND.labels(channel).inc(counts.get((channel, sender), 1))
            self._senders.get(channel, set()).discard(sender)
        return len(rows)

    async def run(self, pool: AsyncConnectionPool, every: float) -> None:
        """Flush every ``every`` seconds until cancelled; a failed flush (the times are kept)
        is said when the failures begin and when they end, and tried again after a bounded
        backoff (:class:`inturn.worker.store.periodic.Periodic`)."""
        await Periodic(
            log,
            "feeds: writing the last-message times (kept meanwhile)",
            every,
            partial(self.flush, pool),
            cure=f"every {every:g}s",
        ).forever()

    async def close(self, pool: AsyncConnectionPool) -> None:
        """The last flush, at shutdown (errors are logged)."""
        with contextlib.suppress(Exception):
            await self.flush(pool)


def recorder(options: IngestOptions) -> FeedRecorder | None:
    """The pack's ``record`` hook (:data:`~inturn.worker.worklist.hooks.RecordHook`): a
    recorder of the feeds declared with ``--feeds`` (``options.feeds``, as
    :func:`~inturn.worker.feeds.declare.load_feeds` returns them), or None when ingest was
    started without: it then records nothing and leaves the declarations in the database.

    Raises:
        TypeError: ``options.feeds`` holds something that is not a
            :class:`~inturn.worker.feeds.declare.Feed`.
    """
    if options.feeds is None:
        return None
    feeds = tuple(options.feeds)
    for feed in feeds:
        if not isinstance(feed, Feed):
            raise TypeError(f"--feeds: {feed!r} is not a feed declaration")
    return FeedRecorder(feeds, max_senders=options.max_feed_senders)
