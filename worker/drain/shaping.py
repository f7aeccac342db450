"""A message shaped for its receiver at send time (a Destination's ``spec.profile``).

Right before it is framed, after its payload is opened, the stored message goes through the
destination's compiled profile (:func:`inturn.worker.hl7.profile.transform`); the stored bytes
are never changed (the audit trail and a resend keep them as received). Without a profile the
senders get the opened payload itself: the callers test ``config.profile is None`` and call
nothing here, so a profile-free send costs what it cost before.

A message the profile cannot shape (a character with no place in the target under
``unmappable: refuse``, bytes that do not decode as its MSH-18 says, a map's ``otherwise:
hold``, an MSH-18 it cannot read, no usable MSH) is a failed attempt with the outcome
``profile`` and the field and value named. Nothing is written to the receiver. The refusal is
deterministic (the same message and profile refuse it every time), so ``ackPolicy.profile``
decides it like ``unsendable`` (:func:`inturn.worker.drain.retry.decide`): unset, it follows
``retry.maxAttempts`` (0: kept at the head, raised as stuck, until the profile is corrected or
a person skips it; above 0: given up at once onto ``delivery-failed``); ``fail`` gives it up
at once and ``retry`` keeps it at the head under ``spec.retry``, whatever maxAttempts says.

MSH-13 (``sequenceNumbers``): the message is shaped with a placeholder number first; only once
the profile took it is its number reserved (:func:`inturn.worker.store.delivery.reserve_sequence`,
the number it had at an earlier attempt, else the destination's next) and written
(:func:`inturn.worker.hl7.profile.renumbered`), so a refused message spends no number.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from inturn.worker.hl7.profile import Profile, ProfileRefusal, renumbered, transform
from inturn.worker.senders.base import FailureCause

#: The failure cause of a message its profile refused (``last_error`` starts with it).
REFUSED: FailureCause = "profile"


async def for_receiver(
    payload: bytes,
    profile: Profile,
    reserve: Callable[[], Awaitable[int | None]],
    *,
    reveal: bool,
) -> bytes | tuple[FailureCause, str]:
    """What the receiver gets for ``payload`` (the opened stored message), or why not.

    Args:
        payload: the stored message, opened.
        profile: the destination's compiled profile (not None: the caller's test).
        reserve: the message's MSH-13 number (called once the profile took the message, and
            only with ``sequenceNumbers``); None when the message is no longer pending.
        reveal: whether the refusal's detail may quote the value it met (False with payload
            keys on: ``last_error`` is stored in clear, the value may be message content).

    Returns:
        The bytes to frame, or ``("profile", detail)``: the detail names the field, the value
        (or ``(value withheld)``) and why.

    Raises:
        LeaseLost: from ``reserve``.
    """
    try:
        sent = transform(payload, profile, 0 if profile.sequence_numbers else None)
    except ProfileRefusal as exc:
        return REFUSED, exc.describe(reveal=reveal)
    if not profile.sequence_numbers:
        return sent
    number = await reserve()
    if number is None:
        return REFUSED, "MSH-13: the message is no longer pending; no number was reserved"
    again = renumbered(sent, number)
    return again if again is not None else transform(payload, profile, number)
