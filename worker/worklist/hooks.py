"""What a rule pack may add to ingest and to the worker: the shapes of its hooks.

A :class:`~inturn.worker.worklist.pack.Pack` may declare

* ``ingest`` (an :data:`IngestHook`): what ingest computes for a message it stores. Given the
  registered destinations, it returns, per channel it cares about, an :data:`Answerer`, called
  with each message of that channel before it is stored; the :class:`Answers` it returns go
  into that message's transaction (the store answers the open expectations whose key digest is
  one of them: ``spec.replies``). The orders pack's reply keys are one.
* ``mark`` (a :data:`MarkHook`): what the worker adds to a delivered mark. Given a
  destination's configuration, it returns that destination's :data:`Marker` (or None: nothing
  for it), called with each message delivered there; the expected replies it returns
  (:class:`~inturn.worker.store.queue.ExpectedReply`: a key, its digest, the reply channel and
  types, how long the reply may take) are written by the statement that marks the message
  delivered, so only if the mark is, and ingest's answers close them. The orders pack's
  ``spec.replies`` expectations are one.
* ``record`` (a :data:`RecordHook`): what ingest notes about every message it accepts and
  writes on its own schedule. Given ingest's :class:`IngestOptions`, it returns a
  :class:`Recorder` (or None: nothing to record), told of each accepted message in memory and
  flushed in the background. The feeds pack's last-message times are one.

All are built ahead of the traffic (ingest: once per refresh of its routing table; the
worker: once per destination), so a channel or a destination no pack cares about costs nothing
per message: ingest and the worker ask the registry (:mod:`inturn.worker.operations.packs`),
which leaves out the packs whose hook returns nothing for them. Front ends name no pack.

Layer: worklists (pure types; the packs above implement them, the registry composes them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool

from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store.model import ExpectedReply

#: How a key is stored under its owner, ``(owner, key) -> 32 hex digits``: plain SHA-256
#: (:func:`inturn.worker.spec.replies.key_digest`) or, with payload keys, the blind index's
#: (:meth:`inturn.worker.crypto.codec.PayloadCodec.order_digest`).
KeyDigest = Callable[[str, str], str]


@dataclass(frozen=True)
class Registered:
    """One live destination as ingest's routing table has it, for a pack's ingest hook.

    Attributes:
        destination: ``namespace/name``.
        channel: the channel it takes messages from.
        spec: its pack fields as the registry keeps them, as the spec writes them
            (``replies`` and the registry's ``pack_spec``); a field it does not set is absent.
    """

    destination: str
    channel: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Answers:
    """What a pack computed for one message ingest is about to store.

    Attributes:
        digests: key digests of the open expectations it answers (sorted, no repeats); the
            store marks every open expectation on the message's channel with one of them
            answered, in the message's transaction.
        reply: it is a reply (counted ``matched`` or ``unmatched`` by
            ``inturn_ingest_replies_total``), whether or not it carries a key.
    """

    digests: tuple[str, ...] = ()
    reply: bool = False

    def __or__(self, other: Answers) -> Answers:
        """Both packs' answers: the digests of each, a reply if either says so."""
        return Answers(tuple(sorted({*self.digests, *other.digests})), self.reply or other.reply)


#: One channel's computation: ``(message_type "CODE^TRIGGER", payload, the key digest forms to
#: look for) -> Answers``, or None when the message is nothing to the pack. Pure; called on the
#: event loop for every message of the channel, so it must be cheap (no I/O).
Answerer = Callable[[str, bytes, Sequence[KeyDigest]], "Answers | None"]

#: A pack's ingest hook: every registered destination -> ``{channel: Answerer}`` of the channels
#: whose messages it reads (a channel absent: nothing is computed for its messages).
IngestHook = Callable[[Sequence[Registered]], Mapping[str, Answerer]]

#: One destination's mark computation: ``(message_type "CODE^TRIGGER", payload as sent) ->`` the
#: replies the delivered message now waits for (empty: none). Pure and cheap: it runs between a
#: message's acknowledgement and its mark.
Marker = Callable[[str, bytes], Sequence[ExpectedReply]]

#: A pack's mark hook: ``(the destination's configuration, the key digest form its worker
#: stores keys in) ->`` its :data:`Marker`, or None when nothing it adds can apply there (the
#: worker then spends nothing per message on this pack). Called once per worker.
MarkHook = Callable[[WorkerConfig, KeyDigest], "Marker | None"]


@dataclass(frozen=True)
class IngestOptions:
    """What ingest was started with that a pack's record hook reads.

    Attributes:
        feeds: the declarations of ``--feeds`` as the feeds pack's loader returned them
            (:func:`inturn.worker.feeds.declare.load_feeds`; ingest passes them on unread), or
            None when it was not given.
        max_feed_senders: ``--max-feed-senders``: most senders recorded per per-sender feed.
    """

    feeds: tuple[Any, ...] | None
    max_feed_senders: int


class Recorder(Protocol):
    """What a pack notes about the messages ingest accepts, and writes on its own schedule.

    :meth:`seen` is called on the event loop for every accepted message (new or a copy), so it
    must be cheap and do no I/O; the rest run at ingest's start, every flush interval
    (``--feed-flush-seconds``) and at its stop.
    """

    def seen(self, channel: str, sending_application: str, sending_facility: str) -> None:
        """Note a message accepted on ``channel`` from MSH-3/MSH-4 (raw field text)."""

    async def declare(self, pool: AsyncConnectionPool) -> None:
        """Before any message: write what this process declares (the declared feeds)."""

    async def flush(self, pool: AsyncConnectionPool) -> int:
        """Write what was noted (one transaction); return how many rows; on failure keep it
        for the next flush and raise."""

    async def run(self, pool: AsyncConnectionPool, every: float) -> None:
        """Flush every ``every`` seconds until cancelled (a failed flush is logged)."""

    async def close(self, pool: AsyncConnectionPool) -> None:
        """The last flush, at shutdown (errors are logged, not raised)."""


#: A pack's record hook: ingest's options -> its :class:`Recorder`, or None when it has nothing
#: to record (ingest then spends nothing per message on this pack). Called once per start.
RecordHook = Callable[[IngestOptions], "Recorder | None"]
