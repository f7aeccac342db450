"""The Destination API, defined once: its OpenAPI v3 schema, its CEL rules and its CRD.

Everything that describes ``destinations.inturn.dev`` lives here, as plain Python data:

* :func:`spec_schema` and :func:`status_schema` are the structural schemas of ``spec`` and
  ``status`` (every node typed, defaults, bounds, string lengths, list sizes);
* :data:`RULES` are the CEL ``x-kubernetes-validations`` the schema alone cannot say, each with a
  readable message and an equivalent Python predicate so that a manifest is judged the same way
  with or without an API server (``inturn local``, ``inturn worker -f``);
* :func:`crd` assembles the ``CustomResourceDefinition``; ``crds/destination.yaml`` and the Helm
  chart's copy are generated from it (``python -m inturn.worker.spec.schema --write``), and a
  unit test fails when either file is stale.

The module is pure data and never imports the operator. Field conventions follow the Kubernetes
API conventions (kubernetes/community, contributors/devel/sig-architecture/api-conventions.md):
integer durations with a ``Seconds`` suffix, camelCase names, references to Secrets as
``secretRef`` in the same namespace, unions as optional members plus a validation rule.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from inturn.worker.hl7 import filter as field_filter
from inturn.worker.hl7.fields import FIELD_PATTERN
from inturn.worker.senders import registry as senders
from inturn.worker.spec import openapi
from inturn.worker.spec.config import DEFAULT_LANES_WINDOW, DEFAULT_STUCK_AFTER_SECONDS
from inturn.worker.spec.openapi import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from inturn.worker.spec.openapi import Rule, Schema
from inturn.worker.spec.openapi import boolean as _bool
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import str_map as _str_map
from inturn.worker.spec.openapi import string as _str
from inturn.worker.spec.replies import DEFAULT_ORDER_FIELD, DEFAULT_REPLY_FIELDS
from inturn.worker.spec.schedule import DAYS, MAX_WINDOWS, ZONE_PATTERN

GROUP = "inturn.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Destination"
PLURAL = "destinations"
SINGULAR = "destination"
SHORT_NAMES = ("dest",)
CATEGORIES = ("inturn",)
CRD_NAME = f"{PLURAL}.{GROUP}"

#: ``metadata.name`` limit: ``<name>-worker`` must stay a valid label value (63 characters).
MAX_NAME_LENGTH = 56


#: An IATA airline designator: two letters or digits, optionally a third letter.
CARRIER_PATTERN = r"^[A-Z0-9]{2}[A-Z]?$"


RULE_NAME_LENGTH = Rule(
    cel=f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
    message=(
        f"must be at most {MAX_NAME_LENGTH} characters, so that the worker's name"
        " '<name>-worker' stays a valid label value"
    ),
    check=lambda node: len(str(node.get("metadata", {}).get("name", ""))) <= MAX_NAME_LENGTH,
    field_path=".metadata.name",
)


def _one_of(members: tuple[str, ...]) -> Rule:
    """The rule "exactly one of ``members`` is set", in CEL and in Python."""
    counted = " + ".join(f"(has(self.{m}) ? 1 : 0)" for m in members)
    return Rule(
        cel=f"{counted} == 1",
        message=f"exactly one of {', '.join(members)} must be set",
        check=lambda node: sum(m in node for m in members) == 1,
    )


#: Exactly one sender kind (generated from the registry of kinds).
RULE_ONE_SENDER = _one_of(senders.names())
RULE_BACKOFF = Rule(
    cel="self.maxBackoffSeconds >= self.backoffSeconds",
    message="maxBackoffSeconds must be greater than or equal to backoffSeconds",
    check=lambda node: node["maxBackoffSeconds"] >= node["backoffSeconds"],
)

RULE_CARRIERS_DISTINCT = Rule(
    cel="!has(self.carriers) || self.carriers.all(c, self.carriers.filter(d, d == c).size() == 1)",
    message="each carrier may be listed once",
    check=lambda node: len(set(node.get("carriers", ()))) == len(node.get("carriers", ())),
    field_path=".carriers",
)

#: Most messages a destination may have in flight at once (``spec.lanes.count``).
MAX_LANES = 32
#: Most messages the lanes may look over (``spec.lanes.window``).
MAX_LANES_WINDOW = 100_000

RULE_SFTP_ONE_LANE = Rule(
    cel="!has(self.sender.sftp) || !has(self.lanes) || !has(self.lanes.count)"
    " || self.lanes.count == 1",
    message=(
        "sftp takes one lane only (lanes.count 1): a receiver reads an SFTP folder in the order"
        " of its file names, so files written at once could be read out of order"
    ),
    check=lambda node: (
        "sftp" not in node.get("sender", {}) or int(node.get("lanes", {}).get("count", 1)) == 1
    ),
    field_path=".lanes.count",
)

#: Every rule, keyed by its CEL text: how a schema node's ``x-kubernetes-validations`` item is
#: mapped back to its Python predicate (the sender kinds' rules included).
RULES: dict[str, Rule] = openapi.RULES


# --- the spec -------------------------------------------------------------------------------


def _sender(kinds: Mapping[str, Schema]) -> Schema:
    return _obj(
        kinds,
        description=(f"Where and how messages are delivered: exactly one of {', '.join(kinds)}."),
        rules=(RULE_ONE_SENDER,),
    )


_ACK_OUTCOMES = (
    ("AE", "Application error (MSA-1 AE)."),
    ("AR", "Application reject (MSA-1 AR)."),
    ("CE", "Commit error (MSA-1 CE, enhanced mode)."),
    ("CR", "Commit reject (MSA-1 CR, enhanced mode)."),
    ("invalidAck", "A reply that is not a usable acknowledgement."),
    ("controlIdMismatch", "An acknowledgement whose MSA-2 is not the message's MSH-10."),
    (
        "unsendable",
        "A stored message the sender can never send (e.g. 0x0B or 0x1C in it for MLLP, no"
        " MSH-10); default fail.",
    ),
)
#: Outcomes that give up by default: no later attempt can fix them.
_ACK_FAIL_BY_DEFAULT = frozenset({"unsendable"})


def _toleration() -> Schema:
    return _obj(
        {
            "key": _str("Taint key.", max_length=317),
            "operator": _str("Exists or Equal.", max_length=16, enum=("Exists", "Equal")),
            "value": _str("Taint value.", max_length=63),
            "effect": _str(
                "Taint effect.",
                max_length=16,
                enum=("NoSchedule", "PreferNoSchedule", "NoExecute"),
            ),
            "tolerationSeconds": _int(
                "How long a NoExecute taint is tolerated.",
                minimum=0,
                maximum=2**31,
                fmt="int64",
            ),
        },
        description="A core/v1 Toleration.",
    )


def _quantities(description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": 16,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": (
                r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
                r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
            ),
        },
    }


def _worker() -> Schema:
    return _obj(
        {
            "resources": _obj(
                {
                    "requests": _quantities("Minimum resources, e.g. cpu: 10m, memory: 64Mi."),
                    "limits": _quantities("Maximum resources, e.g. memory: 256Mi."),
                },
                description="Compute resources of the worker container (core/v1).",
            ),
            "nodeSelector": _str_map(
                "Node labels the worker pod must be scheduled on.",
                max_properties=32,
                max_value=63,
            ),
            "tolerations": {
                "type": "array",
                "description": "Taints the worker pod tolerates.",
                "maxItems": 32,
                "items": _toleration(),
            },
            "affinity": {
                "type": "object",
                "description": "A core/v1 Affinity, passed to the pod as it is.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "priorityClassName": _str(
                "PriorityClass of the worker pod.", max_length=253, pattern=_DNS_SUBDOMAIN
            ),
        },
        description="Scheduling and resources of the worker pod.",
    )


def spec_schema() -> Schema:
    """Return the structural OpenAPI v3 schema of ``Destination.spec`` (a fresh dict).

    Defaults are declared on the nodes (``default:``); nested objects that carry defaults are
    themselves defaulted to ``{}`` so that the defaults apply when the object is omitted.
    ``retry.maxAttempts`` is required and has no default: 0 means "forever" and must be chosen.
    """
    return _obj(
        {
            "channel": _str(
                "The ingest channel that feeds this destination.",
                max_length=63,
                min_length=1,
                pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
            ),
            "filter": _obj(
                {
                    "messageTypes": {
                        "type": "array",
                        "description": (
                            "MSH-9 patterns accepted, as TYPE or TYPE^EVENT with * and ?"
                            " wildcards, e.g. ADT^A0*; empty or absent accepts every message."
                        ),
                        "maxItems": 64,
                        "items": _str(
                            "An MSH-9 pattern.",
                            max_length=32,
                            min_length=1,
                            pattern=r"^[A-Za-z0-9*?]+(\^[A-Za-z0-9_*?]+)?$",
                        ),
                    },
                    "fields": _filter_fields(),
                },
                description=(
                    "Which of the channel's messages this destination receives: those whose"
                    " type passes messageTypes and for which every item of fields holds."
                ),
            ),
            "sender": _sender({k.name: k.spec_schema() for k in senders.KINDS}),
            "retry": _obj(
                {
                    "maxAttempts": _int(
                        "Attempts before a message is marked failed and the next one goes;"
                        " 0 retries forever (the queue waits).",
                        minimum=0,
                        maximum=1_000_000,
                    ),
                    "backoffSeconds": _int(
                        "Delay after the first failure, doubled per attempt.",
                        minimum=1,
                        maximum=3600,
                        default=5,
                    ),
                    "maxBackoffSeconds": _int(
                        "Ceiling of the delay between attempts.",
                        minimum=1,
                        maximum=86400,
                        default=60,
                    ),
                    "timeoutSeconds": _int(
                        "Bound of one attempt: connect, send, and wait for the acknowledgement.",
                        minimum=1,
                        maximum=600,
                        default=30,
                    ),
                    "unreachable": _str(
                        "What a failure that says the receiver is unreachable (DNS, refused,"
                        " reset before any reply, TLS handshake, no connection in time) does:"
                        " hold keeps the queue waiting without spending an attempt (the sweeper"
                        " raises the destination as stuck); count spends one like any failure.",
                        max_length=5,
                        enum=("hold", "count"),
                        default="hold",
                    ),
                },
                required=("maxAttempts",),
                description="How hard the head of the queue is retried.",
                rules=(RULE_BACKOFF,),
            ),
            "ackPolicy": _obj(
                {
                    key: _str(
                        f"{text} retry keeps the order; fail gives up on the message.",
                        max_length=5,
                        enum=("retry", "fail"),
                        default="fail" if key in _ACK_FAIL_BY_DEFAULT else "retry",
                    )
                    for key, text in _ACK_OUTCOMES
                },
                description="Per negative outcome, retry the head or give up on it.",
                default={},
            ),
            "idleSeconds": _int(
                "Safety poll of an idle worker: an enqueue wakes it at once (LISTEN/NOTIFY);"
                " this is only how often it looks anyway.",
                minimum=1,
                maximum=3600,
                default=60,
            ),
            "suspend": _bool(
                "Hold the queue: the worker keeps its lock and sends nothing.", default=False
            ),
            "worker": _worker(),
            "carriers": _carriers(),
            "alerting": _obj(
                {
                    "stuckAfterSeconds": _int(
                        "Seconds the head may wait before the sweeper places the destination on"
                        " the destination-stuck worklist.",
                        minimum=1,
                        maximum=31_536_000,
                        default=DEFAULT_STUCK_AFTER_SECONDS,
                    ),
                },
                description="When the sweeper raises this destination to people.",
                default={},
            ),
            "schedule": schedule_schema(
                "When messages may be sent (a weekly schedule in a time zone). Outside it the"
                " worker holds the queue without spending attempts, the status says until"
                " when, and the sweeper does not count the time as stuck. Unset: at any time."
            ),
            "replies": _replies(),
            "throttle": _obj(
                {
                    "messagesPerSecond": _int(
                        "Most messages sent per second: sends start at least 1/rate seconds"
                        " apart, in order.",
                        minimum=1,
                        maximum=10_000,
                    ),
                },
                required=("messagesPerSecond",),
                description="How fast messages may be sent. Unset: as fast as the receiver acks.",
            ),
            "lanes": _lanes(),
            "expireAfterSeconds": _int(
                "Pending messages older than this are skipped as expired by the sweeper (audited,"
                " and listed on the delivery-expired worklist). Unset: messages never expire;"
                " expiring clinical messages must be a choice.",
                minimum=60,
                maximum=31_536_000,
            ),
        },
        required=("channel", "sender", "retry"),
        description="The desired state of a delivery destination.",
        rules=(RULE_CARRIERS_DISTINCT, RULE_SFTP_ONE_LANE),
    )


def _lanes() -> Schema:
    return _obj(
        {
            "count": _int(
                "Messages in flight to the receiver at once (MLLP connections, concurrent HTTP"
                " requests); each key's messages still go one at a time, in enqueue order."
                " 1 is the single stream. Ask the receiver's vendor first: it must process"
                " its connections independently.",
                minimum=1,
                maximum=MAX_LANES,
                default=1,
            ),
            "key": _str(
                "What must keep its order: patient (every patient identifier a message names,"
                " PID-2/3/4 and MRG-1 of every PID segment). A message naming several patients"
                " (a merge, a link, a swap) binds them; one naming none is a barrier.",
                max_length=16,
                enum=("patient",),
                default="patient",
            ),
            "window": _int(
                "How many of the oldest pending messages the worker looks over to find ones"
                " that may go while earlier ones wait; it says so when the window is full of"
                " waiting messages.",
                minimum=1,
                maximum=MAX_LANES_WINDOW,
                default=DEFAULT_LANES_WINDOW,
            ),
        },
        description=(
            "Several messages in flight at once, keeping each patient's order. Unset: one"
            " message at a time."
        ),
        default={},
    )


#: A start time: ``HH:MM`` from 00:00 to 23:59.
_START_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
#: An end time: ``HH:MM`` from 00:00 to 24:00.
_END_PATTERN = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"


def schedule_schema(description: str) -> Schema:
    """A weekly schedule in a time zone (:mod:`inturn.worker.spec.schedule`): the node of
    ``spec.schedule``, reused by feed declarations."""
    return _obj(
        {
            "timeZone": _str(
                "IANA time zone the windows are in, e.g. Europe/Berlin; daylight saving time"
                " is the zone's own.",
                max_length=64,
                min_length=1,
                pattern=ZONE_PATTERN,
            ),
            "windows": {
                "type": "array",
                "description": ("Weekly windows; windows that overlap or touch form one opening."),
                "minItems": 1,
                "maxItems": MAX_WINDOWS,
                "items": _obj(
                    {
                        "days": {
                            "type": "array",
                            "description": "Weekdays the window starts on.",
                            "minItems": 1,
                            "maxItems": 7,
                            "items": _str("A weekday.", max_length=3, enum=DAYS),
                        },
                        "start": _str(
                            "Local start time, HH:MM (00:00 to 23:59).",
                            max_length=5,
                            pattern=_START_PATTERN,
                        ),
                        "end": _str(
                            "Local end time, HH:MM (00:00 to 24:00); an end not after the"
                            " start ends the next day (equal: 24 hours).",
                            max_length=5,
                            pattern=_END_PATTERN,
                        ),
                    },
                    required=("days", "start", "end"),
                    description="One weekly window.",
                ),
            },
        },
        required=("timeZone", "windows"),
        description=description,
    )


_TYPE_PATTERN = r"^[A-Za-z0-9*?]+(\^[A-Za-z0-9_*?]+)?$"


def _types(description: str) -> Schema:
    return {
        "type": "array",
        "description": description,
        "minItems": 1,
        "maxItems": 16,
        "items": _str("An MSH-9 pattern.", max_length=32, min_length=1, pattern=_TYPE_PATTERN),
    }


#: An HD first component as it appears in MSH-3/MSH-4: no separator, no control character.
_HD_PATTERN = r"^[^|^~\\&\x00-\x1f\x7f]+$"


def _replies() -> Schema:
    field = _str("A field, e.g. ORC-2.", max_length=7, pattern=FIELD_PATTERN)
    return {
        "type": "array",
        "description": (
            "Replies this destination's orders expect: an order delivered without its reply"
            " arriving in time is placed on the orders worklist (unanswered-order) by the"
            " sweeper."
        ),
        "maxItems": 8,
        "items": _obj(
            {
                "orderTypes": _types(
                    "MSH-9 patterns of the messages sent here that expect a reply, e.g. ORM^O01."
                ),
                "replyTypes": _types("MSH-9 patterns of the replies, e.g. ORU^R01, ORR^O02."),
                "channel": _str(
                    "The ingest channel the replies arrive on.",
                    max_length=63,
                    min_length=1,
                    pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
                ),
                "withinSeconds": _int(
                    "How long a reply may take after the order was delivered.",
                    minimum=60,
                    maximum=31_536_000,
                ),
                "orderField": {
                    **field,
                    "description": "Where the matching key is in the order (first component).",
                    "default": DEFAULT_ORDER_FIELD,
                },
                "replyFields": {
                    "type": "array",
                    "description": "Where the key may be in a reply (first component of each).",
                    "minItems": 1,
                    "maxItems": 4,
                    "items": field,
                    "default": list(DEFAULT_REPLY_FIELDS),
                },
                "from": {
                    "type": "array",
                    "description": (
                        "The senders whose replies may answer these orders (MSH-3 and MSH-4,"
                        " first components). Without it, a reply answers an order only when"
                        " it comes from the application and facility the order was addressed"
                        " to (the reply's MSH-3/MSH-4 equal to the order's MSH-5/MSH-6)."
                    ),
                    "minItems": 1,
                    "maxItems": 16,
                    "items": _obj(
                        {
                            "application": _str(
                                "MSH-3 of the replies (first component).",
                                max_length=180,
                                min_length=1,
                                pattern=_HD_PATTERN,
                            ),
                            "facility": _str(
                                "MSH-4 of the replies (first component); any when absent.",
                                max_length=180,
                                min_length=1,
                                pattern=_HD_PATTERN,
                            ),
                        },
                        required=("application",),
                        description="One sender of replies.",
                    ),
                },
            },
            required=("orderTypes", "replyTypes", "channel", "withinSeconds"),
            description="One expected reply.",
        ),
    }


#: Most conditions in one ``spec.filter.fields`` and values in one condition.
MAX_FIELD_CONDITIONS = 16
MAX_FIELD_VALUES = 64

_VALUELESS_CEL = "self.operator == 'Exists' || self.operator == 'DoesNotExist'"
RULE_FIELD_NO_VALUES = Rule(
    cel=f"!({_VALUELESS_CEL}) || !has(self.values)",
    message="Exists and DoesNotExist take no values",
    check=lambda node: node["operator"] not in field_filter.VALUELESS or "values" not in node,
    field_path=".values",
)
RULE_FIELD_VALUES = Rule(
    cel=f"({_VALUELESS_CEL}) || (has(self.values) && self.values.size() > 0)",
    message="In, NotIn, Matches and NotMatches need at least one value",
    check=lambda node: node["operator"] in field_filter.VALUELESS or bool(node.get("values")),
    field_path=".values",
)
_DELIMITER_FIELD = r"^MSH-[12]([.]|$)"
RULE_FIELD_NOT_DELIMITER = Rule(
    cel=f"!self.field.matches('{_DELIMITER_FIELD}')",
    message="MSH-1 and MSH-2 are the delimiters; filters read MSH-3 and later",
    check=lambda node: re.match(_DELIMITER_FIELD, str(node["field"])) is None,
    field_path=".field",
)


def _filter_fields() -> Schema:
    return {
        "type": "array",
        "description": (
            "Conditions on HL7 fields, all of which must hold, e.g. {field: MSH-4, operator: In,"
            " values: [NORTH]}. A field is SEG-F, SEG-F.C or SEG-F.C.S (first component and"
            " subcomponent when not given); every segment of that ID and every repetition is"
            " read."
        ),
        "maxItems": MAX_FIELD_CONDITIONS,
        "items": _obj(
            {
                "field": _str(
                    "The field, e.g. MSH-4, PV1-3, PID-3.4.",
                    max_length=15,
                    pattern=field_filter.FIELD_REF_PATTERN,
                ),
                "operator": _str(
                    "In, NotIn (equal to one of values), Matches, NotMatches (values are"
                    " patterns with * and ?), Exists, DoesNotExist (no values).",
                    max_length=16,
                    enum=field_filter.OPERATORS,
                ),
                "values": {
                    "type": "array",
                    "description": "Values, or patterns for Matches and NotMatches.",
                    "maxItems": MAX_FIELD_VALUES,
                    "items": _str("A value or pattern.", max_length=199, min_length=1),
                },
            },
            required=("field", "operator"),
            description="One condition on a field.",
            rules=(RULE_FIELD_NO_VALUES, RULE_FIELD_VALUES, RULE_FIELD_NOT_DELIMITER),
        ),
    }


def _carriers() -> Schema:
    return {
        "type": "array",
        "description": (
            "IATA airline designators (e.g. LH) whose reservation messages, such as"
            " cancellation notices, go to this destination. At most one live Destination may"
            " serve a carrier: the operator and inturn local refuse a second one."
        ),
        "maxItems": 64,
        "items": _str("An IATA airline designator.", max_length=3, pattern=CARRIER_PATTERN),
    }


# --- the status -----------------------------------------------------------------------------


def _condition() -> Schema:
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
                "items": _condition(),
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


# --- the worker configuration ---------------------------------------------------------------

WORKER_CONFIG_KIND = "WorkerConfig"


def worker_config_schema() -> Schema:
    """Return the schema of the rendered worker configuration (``worker.json``).

    It is the Destination spec with Secret references resolved to file paths, plus the queue key
    (``destination`` = ``namespace/name``). The shared parts (retry, ackPolicy, channel, message
    types, bounds and defaults) are taken from :func:`spec_schema`, so the two cannot drift.
    """
    spec = spec_schema()["properties"]
    return _obj(
        {
            "apiVersion": _str("Always inturn.dev/v1alpha1.", max_length=64, enum=(API_VERSION,)),
            "kind": _str("Always WorkerConfig.", max_length=32, enum=(WORKER_CONFIG_KIND,)),
            "destination": _str(
                "The queue key: namespace/name of the Destination.",
                max_length=317,
                pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
            ),
            "channel": spec["channel"],
            "messageTypes": spec["filter"]["properties"]["messageTypes"],
            "filterFields": spec["filter"]["properties"]["fields"],
            "carriers": spec["carriers"],
            "sender": _sender({k.name: k.worker_schema() for k in senders.KINDS}),
            "retry": spec["retry"],
            "ackPolicy": spec["ackPolicy"],
            "idleSeconds": spec["idleSeconds"],
            "suspend": spec["suspend"],
            "alerting": spec["alerting"],
            "expireAfterSeconds": spec["expireAfterSeconds"],
            "schedule": spec["schedule"],
            "throttle": spec["throttle"],
            "replies": spec["replies"],
            "lanes": spec["lanes"],
        },
        required=("destination", "channel", "sender", "retry"),
        description="Everything one worker needs to drain one destination.",
    )


# --- the CRD --------------------------------------------------------------------------------

PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Channel", "type": "string", "jsonPath": ".spec.channel"},
    {"name": "Sender", "type": "string", "jsonPath": ".status.sender"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Pending", "type": "integer", "jsonPath": ".status.pending"},
    {"name": "Oldest", "type": "date", "jsonPath": ".status.oldestPendingTime"},
    {
        "name": "Delivering",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Delivering")].reason',
    },
    {"name": "Failed", "type": "integer", "priority": 1, "jsonPath": ".status.failed"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def openapi_schema() -> Schema:
    """Return the whole ``openAPIV3Schema`` of the version (root, spec, status)."""
    return _obj(
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        required=("spec",),
        description=(
            "A Destination: one receiver of one channel's HL7 v2 messages, drained in order by"
            " exactly one worker."
        ),
        rules=(RULE_NAME_LENGTH,),
    )


def crd() -> dict[str, Any]:
    """Return the ``apiextensions.k8s.io/v1`` CustomResourceDefinition of Destination.

    Namespaced, one served and stored version, a ``status`` subresource and no ``scale``
    subresource (replicas are pinned to 1; pause with ``spec.suspend``).
    """
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "inturn", "app.kubernetes.io/part-of": "inturn"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


_HEADER = (
    "# Generated by `python -m inturn.worker.spec.schema --write` from worker/spec/schema.py.\n"
    "# Do not edit: change the schema in Python and regenerate (a unit test checks it).\n"
)


def render_crd_yaml() -> str:
    """Return ``crds/destination.yaml``: the CRD as YAML with a generated-file header."""
    return _HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)


def render_chart_crd_template() -> str:
    """Return the Helm template of the CRD: gated by ``crds.enabled``, kept on uninstall.

    The body is the same document as :func:`render_crd_yaml`, plus the
    ``helm.sh/resource-policy: keep`` annotation when ``crds.keep`` is true and the
    annotations of ``crds.annotations`` (for Argo CD, which ignores Helm's keep policy:
    e.g. ``argocd.argoproj.io/sync-options: Delete=false``).
    """
    doc = crd()
    body = yaml.safe_dump(doc, sort_keys=False, width=100)
    marker = f"  name: {CRD_NAME}\n"
    assert marker in body
    annotations = (
        "  {{- if or .Values.crds.keep .Values.crds.annotations }}\n"
        "  annotations:\n"
        "    {{- if .Values.crds.keep }}\n"
        "    helm.sh/resource-policy: keep\n"
        "    {{- end }}\n"
        "    {{- with .Values.crds.annotations }}\n"
        "    {{- toYaml . | nindent 4 }}\n"
        "    {{- end }}\n"
        "  {{- end }}\n"
    )
    body = body.replace(marker, marker + annotations, 1)
    return _HEADER + "{{- if .Values.crds.enabled }}\n" + body + "{{- end }}\n"


#: Where the generated files live, relative to the repository root.
CRD_PATH = Path("crds/destination.yaml")
CHART_CRD_PATH = Path("charts/inturn/templates/crds/destination.yaml")


def generated_files() -> dict[Path, str]:
    """Return every generated file (path relative to the repository root → text)."""
    return {CRD_PATH: render_crd_yaml(), CHART_CRD_PATH: render_chart_crd_template()}


def main(argv: list[str] | None = None) -> int:
    """``python -m inturn.worker.spec.schema``: print the CRD, or write/check the generated files.

    Returns the process exit code: 1 when ``--check`` finds a stale file, else 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m inturn.worker.spec.schema", description=main.__doc__
    )
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="write crds/ and the chart's copy")
    group.add_argument("--check", action="store_true", help="fail when a generated file is stale")
    group.add_argument("--json", action="store_true", help="print the spec schema as JSON")
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(spec_schema(), indent=2))
        return 0
    if not (args.write or args.check):
        sys.stdout.write(render_crd_yaml())
        return 0
    stale = []
    for rel, text in generated_files().items():
        path = args.root / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(rel))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    if stale:
        print("stale: " + ", ".join(stale) + " (run python -m inturn.worker.spec.schema --write)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
