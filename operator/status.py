"""Pure status computation for a Destination: conditions, queue figures, and the diff to patch.

The operator is the only writer of ``status``. It calls :func:`desired_status` with what it
knows (the worker Deployment, the queue depth, whether the spec is valid) and :func:`status_patch`
to get the merge patch for ``/status``, or None when nothing changed: an unchanged Destination is
never written, so 1,000 idle Destinations cost no API writes.

Conditions follow ``metav1.Condition`` (k8s.io/apimachinery/pkg/apis/meta/v1/types.go): ``type``,
``status`` (True/False/Unknown), ``observedGeneration``, ``lastTransitionTime`` (changes only
when ``status`` flips), ``reason`` (one CamelCase word), ``message`` (a sentence). Types:

``Ready``
    the worker Deployment has an available pod (its readiness probe passes, i.e. the worker holds
    the destination's lock) and the spec is valid. Reasons: ``WorkerAvailable``,
    ``WorkerUnavailable``, ``WorkerMissing``, ``InvalidSpec``.
``Delivering``
    the head of the queue is not backing off. Reasons: ``Idle`` (nothing waits), ``Draining``,
    ``Blocked`` (the head failed and waits for its next attempt; the message names the last
    error's class, never the payload), ``Suspended``, ``OutsideWindow`` (outside the delivery
    window, ``spec.schedule``: held until ``status.heldUntil``), ``QueueUnknown`` (no queue
    figures yet).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

READY = "Ready"
DELIVERING = "Delivering"

_ERROR_CLASS = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,63}$")


@dataclass(frozen=True)
class QueueDepth:
    """One destination's queue figures, from the grouped depth query.

    Attributes:
        pending: messages waiting; failed: messages given up on (not yet purged).
        oldest: enqueue time of the oldest waiting message (None when none waits).
        max_attempts: most attempts on a waiting message.
        head_attempts: attempts made on the head (0: it has not failed yet).
        head_error: the head's ``last_error`` (``"<class>: <detail>"``); only its class is shown.
        lanes: what its lanes hold (``spec.lanes.count`` above 1 and something pending), as
            ``status.lanes`` shows it, or None.
    """

    pending: int = 0
    failed: int = 0
    oldest: datetime | None = None
    max_attempts: int = 0
    head_attempts: int = 0
    head_error: str | None = None
    lanes: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WorkerDeployment:
    """The worker Deployment as last seen on the watch.

    Attributes:
        name: the Deployment's name.
        exists: whether it exists.
        available: whether it has at least one available replica of its current generation.
    """

    name: str
    exists: bool = False
    available: bool = False


def error_class(last_error: str | None) -> str:
    """Return the class of a stored failure cause (the text before the first ``:``).

    Causes are written as ``"<outcome>: <detail>"`` (e.g. ``"connection: refused"``,
    ``"AE: unknown patient"``). Only a short identifier-like prefix is returned, so no detail
    (and never a payload fragment) reaches the status; anything else is ``"unknown"``.
    """
    if not last_error:
        return "unknown"
    head = last_error.split(":", 1)[0].strip()
    return head if _ERROR_CLASS.match(head) else "unknown"


def rfc3339(moment: datetime) -> str:
    """Format a timestamp as RFC 3339 in UTC with second precision (``2026-01-02T03:04:05Z``)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    generation: int,
    previous: Sequence[Mapping[str, Any]] = (),
    now: datetime,
) -> dict[str, Any]:
    """Return one ``metav1.Condition``, keeping ``lastTransitionTime`` unless ``status`` flips."""
    old = next((c for c in previous if c.get("type") == type_), None)
    since = (
        old["lastTransitionTime"]
        if old is not None and old.get("status") == status and old.get("lastTransitionTime")
        else rfc3339(now)
    )
    return {
        "type": type_,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ready_condition(worker: WorkerDeployment, invalid: str | None) -> tuple[str, str, str]:
    """Return (status, reason, message) of ``Ready``."""
    if invalid is not None:
        return "False", "InvalidSpec", f"The spec is not valid: {invalid}"[:32768]
    if not worker.exists:
        return "False", "WorkerMissing", f"The worker Deployment {worker.name} does not exist yet."
    if worker.available:
        return "True", "WorkerAvailable", f"The worker Deployment {worker.name} is available."
    return (
        "False",
        "WorkerUnavailable",
        f"The worker Deployment {worker.name} has no available pod holding the queue.",
    )


def delivering_condition(
    depth: QueueDepth | None, suspended: bool, held_until: datetime | None = None
) -> tuple[str, str, str]:
    """Return (status, reason, message) of ``Delivering``; ``depth`` None means unknown;
    ``held_until`` is when the delivery window opens, when outside it."""
    if suspended:
        return "False", "Suspended", "Delivery is suspended (spec.suspend is true)."
    if held_until is not None:
        waiting = f"{_plural(depth.pending, 'message')} wait" if depth else "Messages wait"
        return (
            "False",
            "OutsideWindow",
            f"Outside the delivery window (spec.schedule); {waiting} until {rfc3339(held_until)}.",
        )
    if depth is None:
        return "Unknown", "QueueUnknown", "The queue has not been read yet."
    if depth.pending == 0:
        return "True", "Idle", "No message is waiting."
    if depth.head_attempts == 0 and error_class(depth.head_error) == "unreachable":
        # held without spending attempts (``retry.unreachable: hold``): still blocked
        return (
            "False",
            "Unreachable",
            "The receiver cannot be reached (last error class: unreachable); no attempt is"
            f" spent while it is down and {_plural(depth.pending, 'message')} wait in order.",
        )
    if depth.head_attempts > 0 and depth.lanes is not None and depth.lanes.get("heads"):
        # lanes: the failing message holds its own patient (and what names it), not the rest
        return (
            "True",
            "Draining",
            f"{_plural(depth.pending, 'message')} waiting on {depth.lanes.get('count')} lanes;"
            f" the oldest failed {_plural(depth.head_attempts, 'attempt')}"
            f" (last error class: {error_class(depth.head_error)}) and holds only the messages"
            " that must wait for it (status.lanes).",
        )
    if depth.head_attempts > 0:
        return (
            "False",
            "Blocked",
            f"The head message failed {_plural(depth.head_attempts, 'attempt')}"
            f" (last error class: {error_class(depth.head_error)});"
            f" {_plural(depth.pending, 'message')} wait behind it in order.",
        )
    return (
        "True",
        "Draining",
        f"{_plural(depth.pending, 'message')} waiting; the head is being sent.",
    )


def desired_status(
    *,
    generation: int,
    previous: Mapping[str, Any] | None,
    worker: WorkerDeployment,
    depth: QueueDepth | None,
    suspended: bool,
    sender: str | None,
    invalid: str | None = None,
    now: datetime,
    held_until: datetime | None = None,
) -> dict[str, Any]:
    """Return the complete desired ``status`` of a Destination.

    Args:
        generation: ``metadata.generation`` just reconciled (becomes ``observedGeneration``).
        previous: the current ``status`` (for transition times and for figures when ``depth`` is
            None: an unreadable database keeps the last known numbers instead of zeroing them).
        worker: the worker Deployment as last seen.
        depth: the queue figures, or None when not known.
        suspended: ``spec.suspend``.
        sender: :func:`inturn.operator.manifests.sender_summary` of the spec, None if invalid.
        invalid: why the spec is invalid, or None.
        now: the current time (for transitions).
        held_until: outside the delivery window (``spec.schedule``), when it opens; becomes
            ``heldUntil`` and the ``OutsideWindow`` reason of ``Delivering``.
    """
    previous = previous or {}
    old_conditions = previous.get("conditions") or []
    r_status, r_reason, r_message = ready_condition(worker, invalid)
    d_status, d_reason, d_message = delivering_condition(depth, suspended, held_until)
    kept = next((c for c in old_conditions if c.get("type") == DELIVERING), None)
    if depth is None and not suspended and kept is not None:
        # the queue could not be read: keep what was last known rather than flapping to Unknown
        d_status, d_reason, d_message = kept["status"], kept["reason"], kept["message"]
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": [
            condition(
                READY,
                r_status,
                r_reason,
                r_message,
                generation=generation,
                previous=old_conditions,
                now=now,
            ),
            condition(
                DELIVERING,
                d_status,
                d_reason,
                d_message,
                generation=generation,
                previous=old_conditions,
                now=now,
            ),
        ],
        "worker": {"deployment": worker.name, "available": worker.exists and worker.available},
    }
    if held_until is not None:
        out["heldUntil"] = rfc3339(held_until)
    if sender is not None:
        out["sender"] = sender
    elif "sender" in previous:
        out["sender"] = previous["sender"]
    if depth is not None:
        out["pending"] = depth.pending
        out["failed"] = depth.failed
        out["mostAttempts"] = depth.max_attempts
        if depth.oldest is not None:
            out["oldestPendingTime"] = rfc3339(depth.oldest)
        if depth.lanes is not None:
            out["lanes"] = dict(depth.lanes)
    else:
        for key in ("pending", "failed", "mostAttempts", "oldestPendingTime", "lanes"):
            if key in previous:
                out[key] = previous[key]
    return out


#: Status fields owned (and therefore diffed) by the operator.
OWNED_FIELDS = (
    "observedGeneration",
    "conditions",
    "pending",
    "failed",
    "oldestPendingTime",
    "mostAttempts",
    "maxAttempts",  # the old name of mostAttempts: owned, so that a patch removes it
    "heldUntil",
    "sender",
    "worker",
    "lanes",
)


def status_patch(
    current: Mapping[str, Any] | None, desired: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Return the JSON merge patch turning ``current`` status into ``desired``, or None if equal.

    Only :data:`OWNED_FIELDS` are compared; a field present now but absent from ``desired`` is
    removed (``None`` in a merge patch). Lists (conditions) are replaced whole, which is what a
    merge patch does and is safe because the operator is the only writer.
    """
    current = current or {}
    patch: dict[str, Any] = {}
    for key in OWNED_FIELDS:
        if key in desired:
            if current.get(key) != desired[key]:
                patch[key] = desired[key]
        elif key in current:
            patch[key] = None
    return patch or None
