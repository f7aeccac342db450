"""What the acceptor checks and computes for one message before storing it: the bounds of its
keyed MSH fields, and the :class:`~inturn.worker.ingest.batch.Message` to store (terminators
normalised, digest, patient index keys). Pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.hl7.header import Header
from inturn.worker.hl7.pid import index_keys
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.store.model import Message

#: Longest MSH-10 accepted, in characters: the length HL7 v2.7 and later give the field (ST 199);
#: MSH-10 is part of the duplicate window's unique index.
MAX_CONTROL_ID_CHARS = 199
#: Longest MSH-9 key (``CODE^TRIGGER``) accepted, in characters; it is stored and filtered on.
MAX_MESSAGE_TYPE_CHARS = 64
#: ERR-2 location of each bounded field.
FIELD_LOCATION = {"MSH-10": "MSH^1^10", "MSH-9": "MSH^1^9"}


def over_bound(header: Header) -> tuple[str, int] | None:
    """``(field, limit)`` of the first keyed field of ``header`` over its bound, or None.

    Every field that goes into a key or an index is bounded here, at the door, so that the
    database never refuses a message for its size (channel names are bounded where they are
    configured and in the HTTP path: :func:`inturn.worker.ingest.routing.check_channel`).
    """
    if len(header.control_id) > MAX_CONTROL_ID_CHARS:
        return "MSH-10", MAX_CONTROL_ID_CHARS
    if len(header.message_type.type_key) > MAX_MESSAGE_TYPE_CHARS:
        return "MSH-9", MAX_MESSAGE_TYPE_CHARS
    return None


#: Messages larger than this (bytes) are prepared for storage (terminators, digest, index keys)
#: in a worker thread, so the event loop keeps serving every other connection meanwhile.
OFFLOAD_BYTES = 64 * 1024


def prepare(
    header: Header, payload: bytes, max_identifiers: int, payloads: PayloadCodec | None = None
) -> Message:
    """The :class:`Message` to store for ``payload``: its terminators normalised, its SHA-256
    and its patient index keys (at most ``max_identifiers`` identifiers, see
    :func:`inturn.worker.hl7.pid.index_keys`); with payload keys (``payloads`` that seal), the
    keyed forms of both (the blind index, :meth:`PayloadCodec.window_digest`). The payload
    itself is sealed when its row IDs are known (:func:`inturn.worker.store.ingest.store_sealed`).

    Linear in the size of ``payload`` whatever its shape (repetitions, segments, components,
    field lengths); ``bench/shapes.py`` prints the cost per MiB. Pure, so the acceptor runs it
    in a thread for messages over :data:`OFFLOAD_BYTES`.
    """
    stored = normalise_terminators(payload)
    if payloads is not None and payloads.enabled:
        keys, keying = payloads.index_and_keying(stored, max_identifiers)
        return Message(
            control_id=header.control_id,
            message_type=header.message_type.type_key,
            payload=stored,
            digest=payloads.window_digest(stored),
            patient_keys=",".join(keys),
            keying=keying,
        )
    return Message(
        control_id=header.control_id,
        message_type=header.message_type.type_key,
        payload=stored,
        digest=hashlib.sha256(stored).digest(),
        patient_keys=",".join(index_keys(stored, max_identifiers)),
    )


@dataclass(frozen=True)
class Prepared:
    """A message that passed every check and is ready to store."""

    header: Header
    destinations: tuple[str, ...]
    held: bool
    message: Message
    #: Of a reply type on a reply channel (``spec.replies``), keys found or not: counted as
    #: matched or unmatched once stored.
    reply: bool = False
