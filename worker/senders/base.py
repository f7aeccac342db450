"""The one contract every sender implements, and the failure it raises.

A worker drains a destination through exactly this interface, with the destination's real
sender: there is no second implementation for retries.
"""

from __future__ import annotations

from typing import Literal, Protocol

from inturn.worker.errors import Unavailable

#: Why an attempt failed: a bounded class, usable as a metrics label (``outcome``). The first seven
#: and ``profile`` are the keys of a destination's ``ackPolicy`` (each mapped to ``retry`` or
#: ``fail``); the rest are transport failures and are always retried. ``unreachable`` says
#: nothing about the message: the destination could not be reached, so it holds the queue
#: without spending an attempt (see :func:`inturn.worker.drain.retry.decide`); every other
#: cause is an answer about the message.
FailureCause = Literal[
    "AE",  # application error (HL7 v2.x chapter 2, table 0008)
    "AR",  # application reject
    "CE",  # commit error (enhanced mode)
    "CR",  # commit reject (enhanced mode)
    "invalidAck",  # a reply that is not a usable ACK (no MSA, unknown code, unparseable)
    "controlIdMismatch",  # MSA-2 differs from the message's MSH-10
    "unsendable",  # the stored message can never be sent by this kind (no retry can help)
    "timeout",  # no answer within timeoutSeconds after the message was written
    "unreachable",  # DNS, refused, TLS handshake, reset or closed before any reply, no connection
    "connection",  # the connection broke after a reply to this message began
    "http",  # an HTTP receiver answered with a non-2xx status
    "rejected",  # a receiver without ACKs refused it (an SFTP write refused, the file exists)
    "profile",  # the receiver profile (spec.profile) refuses it: field and value named
]

#: Failure causes whose handling a destination chooses with ``ackPolicy``.
POLICY_OUTCOMES: tuple[FailureCause, ...] = (
    "AE",
    "AR",
    "CE",
    "CR",
    "invalidAck",
    "controlIdMismatch",
    "unsendable",
    "profile",
)


class DeliveryError(Unavailable):
    """One attempt failed.

    Attributes:
        outcome: a bounded class (one of :data:`FailureCause`) usable as a metrics label.
        detail: a short human-readable cause (MSA-3 / ERR text, socket error, HTTP status line).
            It never contains the payload.
    """

    def __init__(self, outcome: FailureCause, detail: str) -> None:
        super().__init__(f"{outcome}: {detail}")
        self.outcome: FailureCause = outcome
        self.detail = detail


class Sender(Protocol):
    """Delivers one message to a receiver.

    ``send`` returns ``None`` when the receiver accepted the message and raises
    :class:`DeliveryError` otherwise. The caller bounds each call with the attempt timeout and
    may cancel it; after a cancellation or an error the sender must not reuse a connection that
    could still carry a late reply.

    Attributes:
        written: whether the last ``send`` began writing its message on an open connection (set
            False when a ``send`` starts). The worker reads it when the attempt's timeout cuts a
            ``send`` short: before the message was written the timeout says the destination is
            unreachable; after, it is an answer (none) about the message.
    """

    written: bool

    async def send(self, payload: bytes, *, item_id: int = 0) -> None:
        """Send ``payload`` (the stored bytes) and wait for the receiver's acceptance.

        ``item_id`` is the queue item's id, for receivers that name what they store (a file
        name); senders that have no use for it ignore it.

        Raises:
            DeliveryError: the receiver refused it, or the transport failed.
        """
        ...

    def describe(self) -> str:
        """A short description for logs, e.g. ``mllp://lab.example:2575``; no secrets."""
        ...

    async def close(self) -> None:
        """Release any connection held between messages."""
        ...
