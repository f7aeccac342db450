"""The ``status`` of a Destination as the API declares it (``status_schema``): conditions,
the worker Deployment, the queue depth and what the operator last saw. Pure data, part of
:mod:`inturn.worker.spec.schema`.
"""

from __future__ import annotations

from inturn.worker.spec.openapi import Schema
from inturn.worker.spec.openapi import boolean as _bool
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import string as _str
from inturn.worker.spec.schema_delivery import MAX_LANES


def condition_schema() -> Schema:
    """metav1.Condition (k8s.io/apimachinery/pkg/apis/meta/v1/types.go)."""
    return _obj(
        {
            "type": _str(
                "Type of the condition, e.g. Ready.",
                max_length=316,
                pattern=(
                    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                ),
            ),
            "status": _str(
                "True, False or Unknown.", max_length=7, enum=("True", "False", "Unknown")
            ),
            "observedGeneration": _int(
                "metadata.generation the condition was set for.",
                minimum=0,
                maximum=2**53,
                fmt="int64",
            ),
            "lastTransitionTime": _str(
                "When the status last changed.", max_length=64, fmt="date-time"
            ),
            "reason": _str(
                "One CamelCase word for the cause.",
                max_length=1024,
                min_length=1,
                pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
            ),
            "message": _str("A sentence for people.", max_length=32768),
        },
        required=("type", "status", "lastTransitionTime", "reason", "message"),
    )


def status_schema() -> Schema:
    """Return the structural OpenAPI v3 schema of ``Destination.status`` (a fresh dict).

    Written only by the operator. ``oldestPendingTime`` is a timestamp, so that the age column is
    computed by the client and the status is not rewritten every second.
    """
    return _obj(
        {
            "observedGeneration": _int(
                "metadata.generation last reconciled.", minimum=0, maximum=2**53, fmt="int64"
            ),
            "conditions": {
                "type": "array",
                "description": "Ready (worker available) and Delivering (head not blocked).",
                "maxItems": 8,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": condition_schema(),
            },
            "pending": _int("Messages waiting.", minimum=0, maximum=2**53, fmt="int64"),
            "failed": _int(
                "Messages given up on and not yet purged.", minimum=0, maximum=2**53, fmt="int64"
            ),
            "oldestPendingTime": _str(
                "When the oldest waiting message was enqueued; absent when none waits.",
                max_length=64,
                fmt="date-time",
            ),
            "mostAttempts": _int(
                "Most attempts made so far on any waiting message (normally the head); the"
                " limit is spec.retry.maxAttempts.",
                minimum=0,
                maximum=2**31,
                fmt="int64",
            ),
            "heldUntil": _str(
                "Outside its delivery window (spec.schedule): when the next window opens and"
                " sending resumes; absent inside a window or without a schedule.",
                max_length=64,
                fmt="date-time",
            ),
            "sender": _str(
                "Summary of the sender, e.g. mllp://host:2575 (no credentials).", max_length=2100
            ),
            "lanes": _obj(
                {
                    "count": _int("Its lanes (spec.lanes.count).", minimum=1, maximum=MAX_LANES),
                    "heads": {
                        "type": "array",
                        "description": (
                            "The messages its lanes send now or next (ids, oldest first): the"
                            " first that no earlier message holds."
                        ),
                        "maxItems": MAX_LANES,
                        "items": {"type": "integer", "format": "int64"},
                    },
                    "oldestWaiting": _obj(
                        {
                            "id": _int("Its id.", minimum=0, maximum=2**63 - 1, fmt="int64"),
                            "reason": _str(
                                "backoff (its own attempt failed), key (an earlier message of"
                                " its patient), binding (a message naming several patients),"
                                " barrier (a message naming none) or lanes (every lane busy).",
                                max_length=16,
                            ),
                            "behind": _int(
                                "The message it waits for, if any.",
                                minimum=0,
                                maximum=2**63 - 1,
                                fmt="int64",
                            ),
                            "text": _str("The same in words.", max_length=256),
                        },
                        description="The oldest message that is not a head, and what holds it.",
                    ),
                    "windowFull": _bool(
                        "The oldest pending messages looked at all wait (the backlog past them"
                        " was not seen)."
                    ),
                },
                description=(
                    "What its lanes hold (spec.lanes.count above 1, something pending); absent"
                    " otherwise."
                ),
            ),
            "witness": _obj(
                {
                    "tick": _int(
                        "The database clock's tick last recorded (inturn_clock): a database that"
                        " holds an older one was restored.",
                        minimum=0,
                        maximum=2**63 - 1,
                        fmt="int64",
                    ),
                    "deliveredThrough": _int(
                        "Id of its last delivered message then (below its first waiting one).",
                        minimum=0,
                        maximum=2**63 - 1,
                        fmt="int64",
                    ),
                    "deliveredTime": _str("When it was delivered.", max_length=64, fmt="date-time"),
                    "deliveredMessage": _int(
                        "The same bound in the channel log's ids (its slim rows).",
                        minimum=0,
                        maximum=2**63 - 1,
                        fmt="int64",
                    ),
                    "acceptedThrough": _int(
                        "Id of its last message then.", minimum=0, maximum=2**63 - 1, fmt="int64"
                    ),
                    "acceptedTime": _str("When it was accepted.", max_length=64, fmt="date-time"),
                    "channelThrough": _int(
                        "Id of its channel log's last message then (any route).",
                        minimum=0,
                        maximum=2**63 - 1,
                        fmt="int64",
                    ),
                    "channelTime": _str(
                        "When that message was accepted.", max_length=64, fmt="date-time"
                    ),
                },
                description=(
                    "What the queue database held for it at the last tick, kept outside the"
                    " database so that a restore is noticed (docs/howto/backups.md)."
                ),
            ),
            "restore": _obj(
                {
                    "detectedTime": _str(
                        "When the restore was noticed.", max_length=64, fmt="date-time"
                    ),
                    "policy": _str("spec.afterRestore then: hold or resend.", max_length=16),
                    "mayBeSentAgain": _int(
                        "Messages delivered before that the restored database holds as waiting.",
                        minimum=0,
                        maximum=2**53,
                        fmt="int64",
                    ),
                    "deliveredThrough": _int(
                        "Id of the last message delivered before: inturn queue mark-delivered"
                        " marks those up to it (accepted before that delivery) when the receiver"
                        " has them.",
                        minimum=0,
                        maximum=2**63 - 1,
                        fmt="int64",
                    ),
                    "deliveredMessage": _int(
                        "The same in the channel log's ids (slim rows get new ids when pulled"
                        " again after a restore; their log message keeps its id).",
                        minimum=0,
                        maximum=2**63 - 1,
                        fmt="int64",
                    ),
                    "lostAfter": _str(
                        "Messages accepted after this time (absent: from the first) are not in"
                        " the restored database: ask the senders to send them again.",
                        max_length=64,
                        fmt="date-time",
                    ),
                    "lostThrough": _str(
                        "The last message lost was accepted at this time (absent: none lost).",
                        max_length=64,
                        fmt="date-time",
                    ),
                    "message": _str("The same in words.", max_length=1024),
                },
                description=(
                    "The queue database went back in time and a person has not decided yet"
                    " (with spec.afterRestore hold, delivery is held meanwhile)."
                ),
            ),
            "worker": _obj(
                {
                    "deployment": _str("Name of the worker Deployment.", max_length=253),
                    "available": _bool("Whether the worker Deployment has an available pod."),
                },
                description="The worker Deployment.",
            ),
        },
        description="The observed state, written by the operator only.",
    )
