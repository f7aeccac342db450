"""Accepting one message: parse its MSH, route it, store it in one transaction, build the answer.

This is the part that MLLP and HTTP share. It never sees a socket: it takes the bytes of one
message and returns a :class:`Reply` holding the acknowledgement to send.

Acknowledgement rules (HL7 v2.x chapter 2, "Acknowledgment messages" and "Original and enhanced
acknowledgment modes"; codes from table 0008, error codes from table 0357):

* The mode is enhanced when MSH-15 or MSH-16 is filled, else original. Accept / error / reject
  are AA / AE / AR in original mode and CA / CE / CR in enhanced mode (the "commit"
  acknowledgement of enhanced mode means exactly what inturn does: safely stored).
* AA (CA) is built only after the COMMIT of every row has returned: the duplicate-window row and
  one ``inturn_delivery`` row per destination are written in a single transaction, with
  ``synchronous_commit`` on (possibly together with messages from other connections for the
  same destinations: group commit, see :mod:`inturn.worker.ingest.batch`).
* Storage failure is answered by :mod:`inturn.worker.store.faults`: a connection found dead
  (the server restarted since it was pooled) is replaced and the message stored again before any
  answer; a database that stays unreachable or busy answers AE (CE) with ERR 207, and the
  sender is expected to send again; content the database refuses (SQLSTATE classes 22 and 54)
  answers AR (CR) with ERR, since sending it again cannot help. Either way nothing is kept.
  A store that outlasts the store timeout is cancelled on the server and answered by its own
  end (:mod:`inturn.worker.ingest.batch`): AE only once its rollback is seen, AA if it had
  committed; when its end cannot be seen, nothing is answered and the connection is closed.
* MSH-10 (at most 199 characters) and MSH-9 (at most 64), which go into keys and indexes, are
  bounded before anything is stored: a longer one answers AR with ERR 104 and its location.
* A message whose MSH cannot be read (no MSH first, unusable MSH-1/MSH-2, no MSH-9 or MSH-10)
  answers AR with an ERR segment carrying the table 0357 code from the parser (100, 101, 102)
  and is not stored. Its mode cannot be trusted, so the code is always AR.
* A message that a destination it is routed to could never send (for an MLLP destination: the
  bytes 0x0B or 0x1C inside it, :func:`inturn.worker.senders.registry.refusal`) answers AR (CR)
  with ERR 102 naming the destination, and is not stored for any of them.
* A message for a channel without destinations answers AR (CR) with ERR 207; one that no
  destination's filter takes (its type, or a condition on its fields) answers AR (CR) with ERR
  200 (unsupported message type). A channel may declare otherwise (``unrouted``,
  :mod:`inturn.worker.spec.channels`): ``hold`` stores both for the destination
  ``_unrouted/<channel>`` (see :func:`inturn.worker.ingest.routing.hold_destination`) and
  accepts them; ``accept`` answers AA (CA) and stores nothing (Mirth Connect's FILTERED; a
  reply there still answers what it names). Each is counted (``inturn_ingest_unrouted_total``).
* MSH-15 and MSH-16 (table 0155: AL, NE, ER, SU) decide which answers are sent
  (:mod:`inturn.worker.hl7.expect`, the same rule the MLLP sender waits by): in enhanced mode a
  CA when the accept level is due, then an AA when the application level is due; a refusal is
  one CE/CR (or AE/AR when only the application level is due). The MLLP listener honours it;
  HTTP always answers with the first.
* The ACK echoes MSH-1/MSH-2, swaps MSH-3/4 with MSH-5/6, copies MSH-11 and MSH-12, carries the
  message's MSH-10 in MSA-2 and a new MSH-10 of its own (see :mod:`inturn.worker.hl7.ack`).

Content: the stored bytes are the received bytes, except that a message whose segments end
with LF or CRLF has them turned into CR (:mod:`inturn.worker.hl7.terminators`); a message whose
segments end with CR is stored, sent and printed byte for byte.

Duplicates: within the window (default 24 h), a message with the same channel, MSH-10 and
identical bytes as one already stored is *received again*. It is a duplicate, acknowledged
again (AA, MSA-3 says so) without a second copy, logged with the earlier copy's id and counted,
only while that copy is pending or was delivered within the lost-ACK window (default 10
minutes): the window exists for a sender that lost our ACK. After a failure, a skip, an erasure
or an older delivery it is the "please resend it" an analyst asks for: queued again as a
re-send linked to the earlier copy, as ``queue resend`` links them
(:func:`inturn.worker.store.ingest.store_batch`). The same MSH-10 with different bytes is a
different message: it is stored and counted.

Batches: a payload starting with FHS or BHS is an HL7 batch (v2.5 chapter 2, 2.10.3). Its
messages are checked one by one as above and stored all in one transaction, in order; the
answer is a batch of ACKs, one per message. One message that would be refused refuses the whole
batch (nothing stored), with an ERR naming it (:mod:`inturn.worker.ingest.envelope`).

No payload byte ever reaches a log line, a metric label or an ERR text: only the channel, MSH-9,
MSH-10, sizes and fixed texts do.

The code is one class with one reason to change (what ingest decides for a message). The
answers are built in :mod:`.answer`, what is stored is computed in :mod:`.prepare`, batches are
stored by :mod:`.envelope`, and what the rule packs compute for a message (reply keys) comes
from their ingest hooks through :mod:`inturn.worker.operations.packs`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Collection
from dataclasses import replace

from psycopg_pool import AsyncConnectionPool

from inturn.worker import tracing
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.hl7.ack import (
    AckErrorDetail,
    build_reject,
)
from inturn.worker.hl7.batch import Batch, BatchError, is_batch, split_batch
from inturn.worker.hl7.errors import ErrorCode, HeaderError
from inturn.worker.hl7.header import Header, parse_header, second_header
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.ingest import envelope, metrics
from inturn.worker.ingest.answer import (
    Reply,
    answer,
    answer_batch,
    answered,
    busy,
    dropped,
    earlier_copies,
    error_detail,
    refuse_batch,
    storage_failed,
    too_large,
    unknown,
    unrouted,
)
from inturn.worker.ingest.batch import Committer, OutcomeUnknown
from inturn.worker.ingest.prepare import (
    FIELD_LOCATION,
    OFFLOAD_BYTES,
    Prepared,
    over_bound,
    prepare,
)
from inturn.worker.ingest.routing import Router, hold_destination, route_message
from inturn.worker.operations import packs
from inturn.worker.senders.registry import refusal
from inturn.worker.store import ingest as ingest_store
from inturn.worker.store.model import StoreResult
from inturn.worker.text.conditions import Condition
from inturn.worker.worklist.hooks import Recorder

log = logging.getLogger("inturn.ingest")

#: Default duplicate window: 24 hours, in seconds.
DEFAULT_DUPLICATE_WINDOW_SECONDS = 24 * 3600.0
#: Default lost-ACK window, seconds (see :mod:`inturn.worker.store.ingest`).
DEFAULT_DELIVERED_WINDOW_SECONDS = ingest_store.DEFAULT_DELIVERED_WINDOW_SECONDS
#: Default bound on the messages of one HL7 batch (FHS/BHS ... BTS/FTS).
DEFAULT_MAX_BATCH_MESSAGES = 1000
#: Default bound, in seconds, on storing one message (pool wait + transaction).
DEFAULT_STORE_TIMEOUT_SECONDS = 10.0


class Acceptor:
    """Turns one message's bytes into stored rows and an acknowledgement.

    Args:
        pool: the write pool (autocommit connections, ``synchronous_commit`` on).
        router: the routing table to consult.
        hold_unrouted: channels whose unrouted messages are held in ``_unrouted/<channel>``
            instead of rejected.
        accept_unrouted: channels whose unrouted messages are answered AA (CA) and dropped,
            not stored, instead of rejected (a channel in both holds).
        duplicate_window_seconds: the duplicate window; 0 turns duplicate detection off.
        delivered_window_seconds: the lost-ACK window: a message received again within this
            time of its earlier copy's delivery is acknowledged without being queued again.
        store_timeout_seconds: bound on waiting for a connection plus the transaction; past it
            the transaction is cancelled and its end awaited: AE once it rolled back (nothing
            kept), AA if it committed first, and no answer at all when its end cannot be seen
            (see :mod:`inturn.worker.ingest.batch`).
        max_indexed_identifiers: most distinct patient identifiers indexed per message.
        max_batch_messages: most messages in one HL7 batch (FHS/BHS); a larger batch is
            refused whole (AR, ERR 104) before anything of it is stored.
        recorder: told of every accepted message (its channel, MSH-3 and MSH-4), in memory:
            the packs' recorders (:func:`inturn.worker.operations.packs.recorder`), or None.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        router: Router,
        *,
        hold_unrouted: Collection[str] = (),
        accept_unrouted: Collection[str] = (),
        duplicate_window_seconds: float = DEFAULT_DUPLICATE_WINDOW_SECONDS,
        delivered_window_seconds: float = DEFAULT_DELIVERED_WINDOW_SECONDS,
        store_timeout_seconds: float = DEFAULT_STORE_TIMEOUT_SECONDS,
        max_indexed_identifiers: int = MAX_INDEXED_IDENTIFIERS,
        max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES,
        recorder: Recorder | None = None,
        payloads: PayloadCodec | None = None,
    ) -> None:
        self.recorder = recorder
        #: Seals every payload stored (payload keys) or passes it in clear (none).
        self.payloads = payloads or PayloadCodec(max_identifiers=max_indexed_identifiers)
        if max_indexed_identifiers < 1:
            raise ValueError("max_indexed_identifiers must be at least 1")
        if max_batch_messages < 1:
            raise ValueError("max_batch_messages must be at least 1")
        self.max_batch_messages = max_batch_messages
        #: storing failing now (a full disk, the database away): named by ``/readyz``, logged
        #: when it begins and when it ends (each message's AE says it too)
        self.storing = Condition(log, "storing messages")
        self.max_indexed_identifiers = max_indexed_identifiers
        self.pool = pool
        self.router = router
        self.hold_unrouted = frozenset(hold_unrouted)
        self.accept_unrouted = frozenset(accept_unrouted) - self.hold_unrouted
        self.duplicate_window_seconds = duplicate_window_seconds
        self.delivered_window_seconds = delivered_window_seconds
        self.store_timeout_seconds = store_timeout_seconds
        self.committer = Committer(
            pool,
            window_seconds=duplicate_window_seconds,
            delivered_seconds=delivered_window_seconds,
            store_timeout=store_timeout_seconds,
            payloads=self.payloads,
        )

    async def handle(self, channel: str, payload: bytes, received_at: float | None = None) -> Reply:
        """Accept (or refuse) one message that arrived on ``channel``.

        Args:
            channel: the channel name (from the listener or the HTTP path).
            payload: the message bytes as received (unframed); stored with its segment
                terminators normalised by :func:`normalise_terminators` (a message terminated
                by CR is stored byte for byte).
            received_at: ``time.perf_counter()`` when the message was complete; defaults to
                now. Used for ``inturn_ingest_store_seconds``.

        Returns:
            The :class:`Reply`. Never raises for bad input or storage trouble: those become
            AR and AE answers.
        """
        started = time.perf_counter() if received_at is None else received_at
        if is_batch(payload):
            return await self._handle_batch(channel, payload, started)
        tracing.received(channel, started)
        prepared = await self._prepare(channel, payload)
        if isinstance(prepared, Reply):
            return prepared
        header, destinations = prepared.header, prepared.destinations
        message = prepared.message
        traceparent = tracing.traceparent()
        if traceparent is not None:  # the worker's spans join this message's trace
            message = replace(message, traceparent=traceparent)
        began = time.perf_counter()
        try:
            # No timeout here: the committer keeps the store timeout and returns only once the
            # outcome is known (a transaction given up on by its caller could still commit).
            result = await self.committer.store(channel, destinations, message)
        except OutcomeUnknown as exc:
            tracing.stored(destinations, began, False)
            return self._done(channel, header, unknown(str(exc)))
        except Exception as exc:  # any other failure to store: AE, nothing kept
            tracing.stored(destinations, began, False)
            return self._done(channel, header, self._store_failed(header, exc))
        self.storing.succeeded()
        tracing.stored(destinations, began, True)
        metrics.STORE_SECONDS.labels(channel).observe(time.perf_counter() - started)
        return self._stored(channel, prepared, result)

    def _store_failed(self, header: Header, exc: BaseException) -> Reply:
        """The answer to a store that failed; one the sender can retry (AE) starts or keeps
        :attr:`storing` failing."""
        reply = storage_failed(header, exc)
        if reply.code in ("AE", "CE"):
            self.storing.failed(reply.reason or type(exc).__name__)
        return reply

    async def _prepare(self, channel: str, payload: bytes) -> Reply | Prepared:
        """Everything before storing: parse, bound, route, refuse; a refusal is the
        :class:`Reply` (already counted and logged)."""
        try:
            header = parse_header(payload)
        except HeaderError as exc:
            outcome = Reply(
                code="AR",
                ack=build_reject(payload, "AR", error_detail(exc.code, exc.text)),
                send=True,
                reason=f"unreadable header: {exc.text}",
            )
            return self._done(channel, None, outcome, len(payload))

        message_type = header.message_type
        too_long = over_bound(header)
        if too_long is not None:
            field, limit = too_long
            outcome = Reply(
                code="AR",
                ack=build_reject(
                    payload,
                    "AR",
                    AckErrorDetail(
                        code=ErrorCode.VALUE_TOO_LONG,
                        user_message=f"{field} is longer than {limit} characters",
                        location=FIELD_LOCATION[field],
                    ),
                ),
                send=True,
                reason=f"{field} longer than {limit} characters",
            )
            return self._done(channel, None, outcome, len(payload))
        if "\x00" in header.control_id or "\x00" in message_type.type_key:
            # Postgres text cannot hold NUL; resending would never help, so this is a reject.
            error = error_detail(ErrorCode.DATA_TYPE_ERROR, "MSH-9 or MSH-10 contains a NUL byte")
            ack = build_reject(payload, "AR", error)
            outcome = Reply(code="AR", ack=ack, send=True, reason="NUL byte in MSH-9 or MSH-10")
            return self._done(channel, None, outcome, len(payload))
        extra = second_header(payload, header.delimiters)
        if extra is not None:
            # two messages in one frame: stored as one, the second would reach no one as itself
            text = f"a second MSH segment at byte {extra}: one frame carries one message"
            ack = build_reject(payload, "AR", error_detail(ErrorCode.SEGMENT_SEQUENCE_ERROR, text))
            outcome = Reply(code="AR", ack=ack, send=True, reason="two messages in one frame")
            return self._done(channel, None, outcome, len(payload))
        decision = await route_message(
            self.router.table, channel, message_type.code, message_type.trigger, payload
        )
        destinations = decision.destinations
        checked: set[str | None] = set()  # each sender kind reads the payload once, not 200 times
        for destination in destinations:
            kind = decision.kinds.get(destination)
            if kind in checked:
                continue
            checked.add(kind)
            why = refusal(kind, payload)
            if why is not None:
                error = error_detail(
                    ErrorCode.DATA_TYPE_ERROR,
                    f"destination {destination} ({kind}) could never send it: {why}",
                )
                outcome = answer(header, "reject", error=error, reason=f"unsendable: {why}")
                return self._done(channel, header, outcome)
        held = False
        if not destinations:
            if channel in self.accept_unrouted:
                return await self._drop(channel, header, payload, decision.reason)
            if channel not in self.hold_unrouted:
                metrics.UNROUTED.labels(self._label(channel), decision.reason, "rejected").inc()
                return self._done(channel, header, unrouted(channel, header, decision.reason))
            metrics.UNROUTED.labels(channel, decision.reason, "held").inc()
            destinations = (hold_destination(channel),)
            held = True

        if len(payload) > OFFLOAD_BYTES:  # linear work, but not on the loop every channel shares
            message = await asyncio.to_thread(
                prepare, header, payload, self.max_indexed_identifiers, self.payloads
            )
        else:
            message = prepare(header, payload, self.max_indexed_identifiers, self.payloads)
        answering = self.router.table.answerers(channel)
        reply = False
        if answering:  # the packs' ingest hooks (spec.replies: which orders it may answer)
            args = (answering, message.message_type, message.payload, self.payloads.order_digests())
            if len(payload) > OFFLOAD_BYTES:  # reads the message's fields: not on the loop
                found = await asyncio.to_thread(packs.answer, *args)
            else:
                found = packs.answer(*args)
            if found is not None:
                reply = found.reply
                if found.digests:
                    message = dataclasses.replace(message, reply_keys=",".join(found.digests))
        return Prepared(header, tuple(destinations), held, message, reply)

    async def _drop(self, channel: str, header: Header, payload: bytes, reason: str) -> Reply:
        """AA for an unrouted message of an ``accept_unrouted`` channel, stored nowhere; a reply
        (its channel's ingest hooks find keys) answers what it names first (AE if it cannot)."""
        metrics.UNROUTED.labels(self._label(channel), reason, "dropped").inc()
        digests = self.payloads.order_digests()
        found = packs.answer(
            self.router.table.answerers(channel), header.message_type.type_key,
            normalise_terminators(payload), digests,
        )  # fmt: skip
        if found is not None and found.digests:
            try:
                keys = ",".join(found.digests)
                n = await self.committer.answer_only(channel, header.control_id, keys)
            except Exception as exc:  # nothing recorded: AE, the sender sends it again
                return self._done(channel, header, storage_failed(header, exc))
            metrics.REPLIES.labels(channel, "matched" if n else "unmatched").inc()
        return self._done(channel, header, dropped(channel, header, reason))

    def _stored(self, channel: str, prepared: Prepared, result: StoreResult) -> Reply:
        """The answer to a message whose transaction has committed."""
        header, destinations, held = prepared.header, prepared.destinations, prepared.held
        if (prepared.reply or prepared.message.reply_keys) and not result.duplicate:
            matched = "matched" if result.answered else "unmatched"
            metrics.REPLIES.labels(channel, matched).inc()
        if self.recorder is not None:  # a feed is alive whether the message is new or a copy
            self.recorder.seen(channel, header.sending_application, header.sending_facility)
        if result.control_id_reused and not result.duplicate:
            metrics.DUPLICATES.labels(channel, "control_id_reused").inc()
            log.warning(
                "channel %s: MSH-10 %r reused with different bytes inside the duplicate window;"
                " stored as a new message",
                channel,
                header.control_id,
            )
        kept = [e for e in result.earlier if not e.queued]
        if kept or (result.duplicate and not result.earlier):
            metrics.DUPLICATES.labels(channel, "identical").inc()
            log.info(
                "channel %s: MSH-10 %r received again; earlier copy %s: acknowledged, not"
                " queued again",
                channel,
                header.control_id,
                earlier_copies(kept) if kept else "earlier in the same batch",
            )
        queued = [e for e in result.earlier if e.queued]
        if queued:
            metrics.DUPLICATES.labels(channel, "resent").inc()
            log.info(
                "channel %s: MSH-10 %r received again; earlier copy %s: queued again as %s"
                " (a re-send)",
                channel,
                header.control_id,
                earlier_copies(queued),
                ", ".join(f"log #{i}" for i in result.ids),
            )
        if result.duplicate:
            outcome = answer(
                header,
                "accept",
                text="duplicate of a message already accepted",
                duplicate=True,
                reason="duplicate: already stored, not stored again",
            )
            return self._done(channel, header, outcome)

        outcome = answer(
            header,
            "accept",
            ids=result.ids,
            held=held,
            reason="held for " + destinations[0] if held else "stored",
        )
        return self._done(channel, header, outcome)

    async def _handle_batch(self, channel: str, payload: bytes, started: float) -> Reply:
        """Accept or refuse an HL7 batch (FHS/BHS ... BTS/FTS) whole (see
        :mod:`inturn.worker.ingest.envelope`)."""
        try:
            batch = split_batch(payload, max_messages=self.max_batch_messages)
        except BatchError as exc:
            outcome = Reply(
                code="AR",
                ack=build_reject(b"", "AR", error_detail(exc.code, f"batch refused: {exc.text}")),
                send=True,
                reason=f"batch refused: {exc.text}",
            )
            return self._done(channel, None, outcome, len(payload))
        prepared = [await self._prepare(channel, m) for m in batch.messages]
        # a message accepted without being stored (dropped: unrouted) refuses nothing
        refused = next(
            (i for i, p in enumerate(prepared) if isinstance(p, Reply) and not p.accepted), None
        )
        if refused is not None:
            return self._done_batch(channel, batch, refuse_batch(batch, prepared, refused))
        ready = [p for p in prepared if isinstance(p, Prepared)]
        if not ready:
            answered = [p for p in prepared if isinstance(p, Reply)]
            return self._done_batch(channel, batch, answer_batch(batch, answered))
        try:
            results = await envelope.store_all(
                self.pool,
                channel,
                [(p.destinations, p.message) for p in ready],
                window_seconds=self.duplicate_window_seconds,
                delivered_seconds=self.delivered_window_seconds,
                store_timeout=self.store_timeout_seconds,
                payloads=self.payloads,
                cache=self.committer.route_sets,
                log=self.committer.log,
            )
        except OutcomeUnknown as exc:  # it may have been kept: no answer at all
            return self._done_batch(channel, batch, unknown(str(exc)))
        except Exception as exc:  # nothing of the batch was kept
            failed = [
                self._store_failed(p.header, exc) if isinstance(p, Prepared) else p
                for p in prepared
            ]
            return self._done_batch(channel, batch, answer_batch(batch, failed))
        self.storing.succeeded()
        metrics.STORE_SECONDS.labels(channel).observe(time.perf_counter() - started)
        stored = iter(results)
        replies = [
            self._stored(channel, p, next(stored)) if isinstance(p, Prepared) else p
            for p in prepared
        ]
        return self._done_batch(channel, batch, answer_batch(batch, replies))

    def _done_batch(self, channel: str, batch: Batch, outcome: Reply) -> Reply:
        log.info(
            "channel %s: batch %r of %d message(s): %s %s",
            channel,
            batch.batch_control_id,
            len(batch.messages),
            outcome.code,
            outcome.reason,
        )
        return outcome

    def reject_too_large(self, channel: str, limit: int) -> Reply:
        """The AR for a frame (or body) over ``limit`` bytes; nothing of it is stored
        (:func:`~inturn.worker.ingest.answer.too_large`)."""
        # the cause first: the size is why, not a missing MSH (its bytes were never kept)
        log.info(
            "channel %s: a message over the %d-byte limit was refused (AR); nothing of it was"
            " kept, its MSH was not read",
            channel,
            limit,
        )
        return self._done(channel, None, too_large(limit), logged=True)

    def reject_busy(self, channel: str, head: bytes, size: int) -> Reply:
        """The AE (CE in enhanced mode) for a message of ``size`` bytes that ingest had no
        memory for (:mod:`inturn.worker.ingest.budget`, :func:`~inturn.worker.ingest.answer.
        busy`); nothing of it was kept and the sender should send it again."""
        header, outcome = busy(head, size)
        return self._done(channel, header, outcome)

    def _label(self, channel: str) -> str:
        """``channel`` as a metrics label: names nobody configured (an HTTP client can post to
        any path) are counted together as ``_other`` so the label set stays bounded."""
        if (
            channel in self.hold_unrouted
            or channel in self.accept_unrouted
            or self.router.table.routes(channel)
        ):
            return channel
        return "_other"

    def _done(
        self,
        channel: str,
        header: Header | None,
        outcome: Reply,
        size: int | None = None,
        *,
        logged: bool = False,
    ) -> Reply:
        return answered(self._label(channel), channel, header, outcome, size, logged=logged)
