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

The fields of one subject are built in a module of their own, each pure data:
:mod:`.schema_pod` (``spec.worker``), :mod:`.schema_delivery` (``schedule``, ``lanes``),
:mod:`.schema_routing` (``filter.fields``), :mod:`.schema_profile` (``profile``) and
:mod:`.schema_status` (``status``); the rule packs declare their own fields (``replies``,
``carriers``, ...), which :mod:`.schema_packs` finds through their entry points and which follow
inturn's own in ``spec`` and the worker configuration. This module keeps the names, the shared
rules, ``spec`` itself, the worker configuration's schema and the CRD.

The module is pure data and never imports the operator. Field conventions follow the Kubernetes
API conventions (kubernetes/community, contributors/devel/sig-architecture/api-conventions.md):
integer durations with a ``Seconds`` suffix, camelCase names, references to Secrets as
``secretRef`` in the same namespace, unions as optional members plus a validation rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from inturn.worker.senders import registry as senders
from inturn.worker.spec import openapi
from inturn.worker.spec.config import DEFAULT_STUCK_AFTER_SECONDS
from inturn.worker.spec.openapi import Rule, Schema
from inturn.worker.spec.openapi import boolean as _bool
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import string as _str
from inturn.worker.spec.schema_delivery import RULE_SFTP_ONE_LANE, lanes_schema, schedule_schema
from inturn.worker.spec.schema_packs import pack_fields
from inturn.worker.spec.schema_pod import worker_schema
from inturn.worker.spec.schema_profile import profile_schema
from inturn.worker.spec.schema_routing import filter_fields_schema
from inturn.worker.spec.schema_status import status_schema

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
        " MSH-10). Unset: fail when retry.maxAttempts is above 0, retry (held at the head,"
        " raised as stuck) when it is 0.",
    ),
    (
        "profile",
        "A message the receiver profile (spec.profile) refuses: a character with no place in"
        " the target charset under unmappable refuse, bytes that do not decode as its MSH-18"
        " says, a map's otherwise hold, no usable MSH. The same message and profile refuse"
        " every time. Unset: fail (at once) when retry.maxAttempts is above 0, retry (held at"
        " the head, raised as stuck, until the profile is corrected or a person skips it) when"
        " it is 0, which never lets a message leave the stream.",
    ),
)
#: Outcomes no later attempt can fix: no default, they follow retry.maxAttempts
#: (:meth:`inturn.worker.spec.config.AckPolicy.action`).
_ACK_BY_MAX_ATTEMPTS = frozenset({"unsendable", "profile"})


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
                    "fields": filter_fields_schema(),
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
                        default=None if key in _ACK_BY_MAX_ATTEMPTS else "retry",
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
            "worker": worker_schema(),
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
            "lanes": lanes_schema(),
            "profile": profile_schema(),
            "afterRestore": _str(
                "What the operator does when the queue database went back in time (restored"
                " from a backup, a failover to a lagging replica): hold (delivery waits until a"
                " person decides: inturn queue mark-delivered, then resume) or resend (the"
                " messages delivered since the backup go again; the receiver deduplicates by"
                " MSH-10). Either way it says so in the status, an event and one log line.",
                max_length=16,
                enum=("hold", "resend"),
                default="hold",
            ),
            "expireAfterSeconds": _int(
                "Pending messages older than this are skipped as expired by the sweeper (audited,"
                " and listed on the delivery-expired worklist). Unset: messages never expire;"
                " expiring clinical messages must be a choice.",
                minimum=60,
                maximum=31_536_000,
            ),
            # the installed packs' fields (replies, carriers, ...), as each pack declares them
            **{f.name: f.schema() for f in pack_fields()},
        },
        required=("channel", "sender", "retry"),
        description="The desired state of a delivery destination.",
        rules=(RULE_SFTP_ONE_LANE, *(r for f in pack_fields() for r in f.rules)),
    )


# --- the status -----------------------------------------------------------------------------


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
            "sender": _sender({k.name: k.worker_schema() for k in senders.KINDS}),
            "retry": spec["retry"],
            "ackPolicy": spec["ackPolicy"],
            "idleSeconds": spec["idleSeconds"],
            "suspend": spec["suspend"],
            "alerting": spec["alerting"],
            "expireAfterSeconds": spec["expireAfterSeconds"],
            "schedule": spec["schedule"],
            "throttle": spec["throttle"],
            "lanes": spec["lanes"],
            "profile": spec["profile"],
            **{f.name: spec[f.name] for f in pack_fields() if f.worker},
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
