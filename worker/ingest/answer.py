"""The answer to one message: :class:`Reply` (the acknowledgement to send, whether to send it,
its HTTP status) and the acknowledgements of the refusals the acceptor makes.

The rules that decide which answer a message gets are :mod:`inturn.worker.ingest.accept`'s
(HL7 v2.x chapter 2, "Acknowledgment messages"; codes from table 0008, error codes from table
0357); this module only builds them. No payload byte reaches an ERR text or a ``reason``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inturn.worker import tracing
from inturn.worker.hl7.ack import AckErrorDetail, ack_code, build_ack, build_reject
from inturn.worker.hl7.batch import Batch, build_batch_ack
from inturn.worker.hl7.errors import ErrorCode, HeaderError
from inturn.worker.hl7.expect import Kind, answer_codes
from inturn.worker.hl7.header import Header, parse_header
from inturn.worker.ingest import metrics
from inturn.worker.ingest.batch import StoreTimeout
from inturn.worker.ingest.prepare import Prepared
from inturn.worker.store.faults import classify
from inturn.worker.store.model import Earlier

#: The code of a :class:`Reply` that is no acknowledgement: the store's outcome is unknown.
UNKNOWN = "unknown"

_CODE_STATUS = {
    "AA": 200,
    "CA": 200,
    "AR": 400,
    "CR": 400,
    "AE": 503,
    "CE": 503,
    UNKNOWN: 504,
}


log = logging.getLogger("inturn.ingest")


@dataclass(frozen=True)
class Reply:
    """The answer to one message.

    Attributes:
        code: MSA-1 of the answer: AA, AE, AR (original mode) or CA, CE, CR (enhanced mode);
            or :data:`UNKNOWN` when whether the message was stored cannot be known (its
            transaction was cancelled and its end not seen): then no acknowledgement is sent,
            the MLLP connection is closed (the sender sends again, as after any lost answer)
            and HTTP answers 504.
        ack: the acknowledgement message, unframed (segments end with CR).
        send: whether MSH-15/MSH-16 ask for this answer to be sent (see
            :func:`inturn.worker.hl7.expect.answer_codes`). HTTP ignores it and always answers.
        followup: a second acknowledgement sent right after ``ack`` over MLLP (the AA of an
            enhanced-mode message whose MSH-16 asks for an application acknowledgement as well
            as the CA), or empty.
        ids: the ``inturn_delivery`` ids stored, in destination order (empty unless stored).
        duplicate: the message was already stored inside the duplicate window.
        held: the message was stored for ``_unrouted/<channel>``.
        reason: a short, payload-free description for logs.
    """

    code: str
    ack: bytes
    send: bool
    followup: bytes = b""
    ids: tuple[int, ...] = ()
    duplicate: bool = False
    held: bool = False
    reason: str = ""

    @property
    def accepted(self) -> bool:
        """True for AA and CA: the message is durably stored (now or earlier)."""
        return self.code in ("AA", "CA")

    @property
    def http_status(self) -> int:
        """200 for AA/CA, 400 for AR/CR, 503 for AE/CE, 504 when the outcome is unknown."""
        return _CODE_STATUS[self.code]


def unknown(why: str) -> Reply:
    """The :data:`UNKNOWN` reply: no acknowledgement; the body HTTP carries says why."""
    return Reply(code=UNKNOWN, ack=f"outcome unknown: {why}\n".encode(), send=False, reason=why)


def error_detail(code: int, user_message: str) -> AckErrorDetail:
    return AckErrorDetail(code=code, user_message=user_message)


def answer(
    header: Header,
    kind: Kind,
    *,
    text: str | None = None,
    error: AckErrorDetail | None = None,
    **fields: Any,
) -> Reply:
    """The outcome carrying the acknowledgement(s) MSH-15/MSH-16 ask for (see
    :func:`inturn.worker.hl7.expect.answer_codes`); when none is due, the accept-level answer
    is built all the same (HTTP answers with it) and not sent over MLLP."""
    codes = answer_codes(header, kind)
    code = codes[0] if codes else ack_code(header, kind)
    followup = build_ack(header, codes[1], text=text) if len(codes) > 1 else b""
    return Reply(
        code=code,
        ack=build_ack(header, code, text=text, error=error),
        send=bool(codes),
        followup=followup,
        **fields,
    )


def unrouted(channel: str, header: Header, reason: str) -> Reply:
    """AR (CR) for a message of ``channel`` no destination takes: ERR 200 when every
    destination's filter refused it, by its type or its fields (``reason`` ``filtered``), else
    ERR 207 (the channel has no destinations)."""
    if reason == "filtered":
        error = error_detail(
            ErrorCode.UNSUPPORTED_MESSAGE_TYPE,
            f"no destination of channel {channel} takes this message of type "
            f"{header.message_type.type_key}",
        )
        why = "no destination filter matches"
    else:
        error = error_detail(
            ErrorCode.APPLICATION_INTERNAL_ERROR, f"channel {channel} has no destinations"
        )
        why = "channel has no destinations"
    return answer(header, "reject", error=error, reason=why)


def dropped(channel: str, header: Header, reason: str) -> Reply:
    """AA (CA) for a message of ``channel`` that no destination takes, on a channel that
    declares such messages accepted and dropped (``unrouted: accept``): nothing is stored;
    MSA-3 says so."""
    why = "no destination filter matches" if reason == "filtered" else "channel has no destinations"
    return answer(
        header,
        "accept",
        text=f"accepted, not stored: no destination of channel {channel} takes it",
        reason=f"dropped: {why}",
    )


def storage_failed(header: Header, exc: BaseException) -> Reply:
    """AE for what a later attempt can store, AR for content the database refuses
    (:mod:`inturn.worker.store.faults`)."""
    fault = classify(exc)
    if fault.fault == "permanent":
        error = error_detail(
            fault.hl7_code, f"{fault.text}; sending it again will not help, nothing was kept"
        )
        return answer(header, "reject", error=error, reason=f"refused: {fault.text}")
    error = error_detail(
        ErrorCode.APPLICATION_INTERNAL_ERROR,
        "the message could not be stored and nothing of it was kept; send it again",
    )
    reason = str(exc) if isinstance(exc, StoreTimeout) else fault.text
    return answer(header, "error", error=error, reason=reason)


def too_large(limit: int) -> Reply:
    """The AR for a frame (or body) over ``limit`` bytes. Its header is not available (its
    bytes were dropped as they came), so the ACK uses the default delimiters and an empty
    MSA-2."""
    error = error_detail(
        ErrorCode.VALUE_TOO_LONG, f"message larger than the limit of {limit} bytes"
    )
    return Reply(
        code="AR",
        ack=build_reject(b"", "AR", error),
        send=True,
        reason=f"message over {limit} bytes",
    )


def busy(head: bytes, size: int) -> tuple[Header | None, Reply]:
    """The AE (CE in enhanced mode) for a message of ``size`` bytes that ingest had no memory
    for; ``head`` is what was kept of its start: its MSH, when readable, gives the answer's
    MSA-2 and mode (and is returned beside it; None when unreadable)."""
    error = error_detail(
        ErrorCode.APPLICATION_INTERNAL_ERROR,
        "ingest is busy: no memory for this message now; nothing of it was kept; send it again",
    )
    reason = f"busy: no memory for {size} bytes now"
    try:
        header = parse_header(head)
    except HeaderError:
        return None, Reply(code="AE", ack=build_reject(head, "AE", error), send=True, reason=reason)
    return header, answer(header, "error", error=error, reason=reason)


def _batch_reply(batch: Batch, code: str, acks: list[bytes], reason: str, **fields: Any) -> Reply:
    return Reply(
        code=code,
        ack=build_batch_ack(batch, acks, comment=reason),
        send=True,
        reason=reason,
        **fields,
    )


def answer_batch(batch: Batch, replies: Sequence[Reply]) -> Reply:
    """The answering batch of ``replies`` (one per message, in order): AA when every message
    was accepted (an empty batch too), AE when any answer is an error (AE/CE), else AR."""
    codes = {r.code for r in replies}
    if codes <= {"AA", "CA"}:
        code, reason = "AA", f"{len(replies)} message(s) accepted"
    elif codes & {"AE", "CE"}:
        code, reason = "AE", "not stored: send the batch again"
    else:
        code, reason = "AR", "refused: the database refused its content"
    ids = tuple(i for r in replies for i in r.ids)
    return _batch_reply(batch, code, [r.ack for r in replies], reason, ids=ids)


def refuse_batch(batch: Batch, prepared: Sequence[Reply | Prepared], refused: int) -> Reply:
    """The answering batch of a batch refused whole because message ``refused`` (0-based)
    would be refused: its own ACK, and AR (CR) with ERR 207 naming it for every other message.
    Nothing was stored."""
    try:
        control_id = parse_header(batch.messages[refused]).control_id
    except HeaderError:
        control_id = ""
    named = f"message {refused + 1} of the batch" + (
        f" (MSH-10 {control_id})" if control_id else ""
    )
    why = f"batch refused whole: {named} was refused; nothing of the batch was stored"
    error = error_detail(ErrorCode.APPLICATION_INTERNAL_ERROR, why)
    acks = [
        p.ack
        if isinstance(p, Reply)
        else build_ack(p.header, ack_code(p.header, "reject"), error=error)
        for p in prepared
    ]
    return _batch_reply(batch, "AR", acks, f"refused: {named} was refused")


def earlier_copies(earlier: Sequence[Earlier]) -> str:
    """``#12 at ward/lab (pending), at ward/ris gone (erased or purged)``: the earlier copies a
    message received again found, for the log (ids, destinations and states, never payload
    text)."""
    parts = []
    for e in earlier:
        if e.state == "arriving":
            parts.append(f"at {e.destination} arriving at the same moment")
        elif e.id is None:
            parts.append(f"at {e.destination} gone (erased or purged)")
        else:
            parts.append(f"#{e.id} at {e.destination} ({e.state})")
    return ", ".join(parts)


def answered(
    label: str,
    channel: str,
    header: Header | None,
    outcome: Reply,
    size: int | None = None,
    *,
    logged: bool = False,
) -> Reply:
    """Count ``outcome`` (``inturn_ingest_messages_total`` under ``label``, the channel or
    ``_other``), end its trace span, and log it as its code deserves: AE/CE and unknown
    outcomes as warnings, AR/CR as information (with ``size`` when given), AA at debug; with
    ``logged`` the caller has said it already. Returns ``outcome``."""
    metrics.MESSAGES.labels(label, outcome.code).inc()
    tracing.answered(
        outcome.code,
        header.control_id if header is not None else None,
        header.message_type.type_key if header is not None else None,
    )
    if logged:  # the caller said it its own way
        return outcome
    control_id = header.control_id if header is not None else None
    # what the log names: never a placeholder for what is not known
    about = f"MSH-10 {control_id!r}" if control_id else "a message whose MSH could not be used"
    if outcome.code in ("AE", "CE", UNKNOWN):
        log.warning("channel %s: %s for %s: %s", channel, outcome.code, about, outcome.reason)
    elif outcome.code in ("AR", "CR"):
        sized = f" ({size} bytes)" if size is not None else ""
        log.info("channel %s: %s for %s%s: %s", channel, outcome.code, about, sized, outcome.reason)
    elif log.isEnabledFor(logging.DEBUG):
        log.debug(
            "channel %s: %s for MSH-10 %r: %s ids=%s",
            channel,
            outcome.code,
            control_id,
            outcome.reason,
            list(outcome.ids),
        )
    return outcome
