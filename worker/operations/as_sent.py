"""A message as its destination's receiver is (or was) sent it: the registered receiver profile
(``spec.profile``) applied to the stored bytes (issue 42). What ``inturn queue show``,
``inturn queue payload --as-sent`` and the console show beside the message as stored.

A preview, pure apart from the registry read: the profile is the one registered now (a message
delivered under an earlier profile is shown as the current one would shape it), and MSH-13 is
the number the message was given at its first send, or, for one not sent yet, the number the
destination's next message would get.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.hl7.profile import ProfileError, ProfileRefusal, compile_profile, transform
from inturn.worker.store import reads


@dataclass(frozen=True)
class AsSent:
    """A message as its receiver gets it.

    Attributes:
        shaped: whether a profile applies (False: the receiver gets the stored bytes).
        data: the bytes sent (the stored ones without a profile); None when refused.
        refusal: why the profile refuses the message (field, value, reason), or None.
        sequence: the MSH-13 number shown, or None (no ``sequenceNumbers``).
        reserved: True when ``sequence`` is the message's own (given at its first send);
            False when it is the next number, a preview.
        codec: the Python codec of the bytes sent (for showing them as text).
    """

    shaped: bool
    data: bytes | None
    refusal: str | None = None
    sequence: int | None = None
    reserved: bool = False
    codec: str = "utf-8"

    def to_json(self) -> dict[str, Any]:
        """The JSON form (no bytes): ``shaped``, ``refusal``, ``sequence``, ``reserved``."""
        return {
            "shaped": self.shaped,
            "refusal": self.refusal,
            "sequence": self.sequence,
            "reserved": self.reserved,
        }


def shape(stored: bytes, view: reads.ReceiverView, *, reveal: bool = True) -> AsSent:
    """``stored`` (opened) as ``view``'s profile shapes it (pure).

    ``reveal``: whether a refusal may quote the value it met (the callers that show the
    payload anyway may).
    """
    try:
        profile = compile_profile(view.profile)
    except ProfileError as exc:  # registered before a rule it breaks: said, not raised
        return AsSent(True, None, refusal=f"the profile cannot be applied: {exc}")
    if profile is None:
        return AsSent(False, stored)
    number: int | None = None
    reserved = False
    if profile.sequence_numbers:
        reserved = view.sequence_number is not None
        number = view.sequence_number if reserved else view.next_number
    codec = profile.charset.codec if profile.charset is not None else "utf-8"
    try:
        data = transform(stored, profile, number)
    except ProfileRefusal as exc:
        return AsSent(True, None, refusal=exc.describe(reveal=reveal), sequence=number)
    return AsSent(True, data, sequence=number, reserved=reserved, codec=codec)


async def receiver_view(
    conn: AsyncConnection[Any], destination: str, item_id: int
) -> reads.ReceiverView:
    """The registered profile of ``destination`` and item ``item_id``'s MSH-13 numbers
    (:func:`inturn.worker.store.reads.receiver_view`; no payload is read, nothing audited)."""
    return await reads.receiver_view(conn, destination, item_id)
