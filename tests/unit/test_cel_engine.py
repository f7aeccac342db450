"""Every CEL rule of the generated CRD (``x-kubernetes-validations`` in crds/destination.yaml)
run by a real CEL engine, cel-python (``celpy``, a maintained implementation of the CEL
specification), on what the API server would see: the shipped example manifests, the
Destination manifests of the documentation, and the bad inputs the schema tests use. Each
rule's answer must equal its Python twin's (:data:`inturn.worker.spec.openapi.RULES`), and the
lines the engine's refusals make must be the rule lines our validation prints.

As the API server does, a document is defaulted by the CRD's own schema first, and a node's
rules run only when nothing at or under it is structurally wrong (Kubernetes skips the rules of
a node that failed its schema). The rules use standard CEL only (``has``, ``size``,
``matches``, ``contains``, ``all``, ``filter``, the conditional): none of the Kubernetes
extension libraries (lists, strings, regex, quantity, url, ``oldSelf`` transition rules), so
celpy evaluates all of them; :func:`test_the_rules_use_no_kubernetes_extension` keeps it so.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from inturn.worker.spec import schema
from inturn.worker.spec.openapi import RULES
from inturn.worker.spec.validation import apply_defaults, validate_paths

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / schema.CRD_PATH).read_text())
OPENAPI: dict[str, Any] = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
assert schema.openapi_schema()  # the packs' spec fields found: their rules' twins registered
ENV = celpy.Environment()
PROGRAMS: dict[str, Any] = {}


@dataclass(frozen=True)
class Judged:
    """One rule evaluated on one node: where, the rule, the engine's and the twin's answer."""

    where: str
    rule: Mapping[str, str]
    engine: bool
    twin: bool

    @property
    def line(self) -> str:
        """The ``path: message`` line a refusal makes (the API server's field path)."""
        path = self.where + self.rule.get("fieldPath", "")
        return f"{path.lstrip('.') or '<root>'}: {self.rule['message']}"


def crd_rules(node: Any, path: str = "") -> Iterator[tuple[str, Mapping[str, str]]]:
    """Every rule of the schema with the schema path of its node."""
    if not isinstance(node, Mapping):
        return
    for item in node.get("x-kubernetes-validations", ()):
        yield path, item
    for key, sub in node.get("properties", {}).items():
        yield from crd_rules(sub, f"{path}.{key}")
    yield from crd_rules(node.get("items"), f"{path}[]")
    yield from crd_rules(node.get("additionalProperties"), f"{path}{{}}")


def engine(rule: str, value: Any) -> bool:
    """``rule`` evaluated by celpy with ``self`` bound to ``value``; an evaluation error
    fails the test (the API server refuses an object whose rule errs)."""
    program = PROGRAMS.get(rule)
    if program is None:
        program = PROGRAMS[rule] = ENV.program(ENV.compile(rule))
    result = program.evaluate({"self": celpy.json_to_cel(value)})
    assert isinstance(result, celpy.celtypes.BoolType), f"{rule!r} on {value!r}: {result!r}"
    return bool(result)


def judge(
    node_schema: Mapping[str, Any],
    value: Any,
    broken: frozenset[tuple[str | int, ...]],
    where: str = "",
    at: tuple[str | int, ...] = (),
) -> Iterator[Judged]:
    """Every rule of every structurally clean node of ``value``, by the engine and the twin."""
    if isinstance(value, dict):
        if not any(path[: len(at)] == at for path in broken):
            for item in node_schema.get("x-kubernetes-validations", ()):
                twin = RULES[item["rule"]].check(value)
                yield Judged(where, item, engine(item["rule"], value), twin)
        for key, sub in node_schema.get("properties", {}).items():
            if key in value:
                yield from judge(sub, value[key], broken, f"{where}.{key}", (*at, key))
        extra = node_schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key, sub_value in value.items():
                yield from judge(extra, sub_value, broken, f"{where}.{key}", (*at, key))
    elif isinstance(value, list) and isinstance(node_schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from judge(node_schema["items"], item, broken, f"{where}[{i}]", (*at, i))


def evaluate(doc: Mapping[str, Any]) -> tuple[list[Judged], list[str]]:
    """The rules judged on ``doc`` (defaulted by the CRD) and our validation's problem lines."""
    defaulted = apply_defaults(OPENAPI, doc)
    problems, broken = validate_paths(OPENAPI, defaulted)
    return list(judge(OPENAPI, defaulted, broken)), problems


# --- the corpus -------------------------------------------------------------------------------


def destinations(text: str) -> list[dict[str, Any]]:
    return [
        d
        for d in yaml.safe_load_all(text)
        if isinstance(d, dict) and d.get("kind") == "Destination"
    ]


EXAMPLES = {
    f"examples/{p.relative_to(ROOT / 'examples')}#{n}": doc
    for p in sorted((ROOT / "examples").rglob("*.yaml"))
    for n, doc in enumerate(destinations(p.read_text()))
}
FENCE = re.compile(r"^```ya?ml\n(.*?)^```", re.M | re.S)
DOCS = {
    f"docs/{p.relative_to(ROOT / 'docs')}#{n}": doc
    for p in sorted((ROOT / "docs").rglob("*.md"))
    for n, doc in enumerate(
        d for block in FENCE.findall(p.read_text()) for d in destinations(block)
    )
}

BASE: dict[str, Any] = {  # tests/unit/test_destination.py's
    "apiVersion": "inturn.dev/v1alpha1",
    "kind": "Destination",
    "metadata": {"name": "lis", "namespace": "ward"},
    "spec": {
        "channel": "adt",
        "sender": {"mllp": {"host": "10.0.0.5", "port": 2575}},
        "retry": {"maxAttempts": 3},
    },
}
SFTP: dict[str, Any] = {  # tests/integration/test_sftp.py's sender
    "host": "sftp.partner.example",
    "username": "hospital",
    "secretRef": {"name": "partner-sftp", "privateKeyKey": "id_ed25519"},
    "directory": "inbound",
}
TLS_HALF = {"secretRef": {"name": "s", "certKey": "c"}}
TLS_PAIR = {"secretRef": {"name": "s", "certKey": "c", "keyKey": "k"}}


def bad(spec: Mapping[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(copy.deepcopy(dict(spec or {})))
    doc["metadata"].update(metadata)
    return doc


def sftp(**changes: Any) -> dict[str, Any]:
    return {"sender": {"sftp": {**SFTP, **changes}}}


def fields(*items: dict[str, Any]) -> dict[str, Any]:
    return {"filter": {"fields": list(items)}}


#: The bad inputs of the schema tests (test_destination, test_hl7_filter, test_sftp), with the
#: rule message each must be refused with.
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "two senders": (
        bad({"sender": {"mllp": {"host": "a", "port": 1}, "http": {"url": "http://b/x"}}}),
        "spec.sender: exactly one of mllp, http, sftp must be set",
    ),
    "no sender": (bad({"sender": {}}), "spec.sender: exactly one of mllp, http, sftp must be set"),
    "backoff above its maximum": (
        bad({"retry": {"maxAttempts": 1, "backoffSeconds": 90}}),
        "spec.retry: maxBackoffSeconds must be greater than or equal to backoffSeconds",
    ),
    "mllp tls half a pair": (
        bad({"sender": {"mllp": {"host": "a", "port": 1, "tls": TLS_HALF}}}),
        "spec.sender.mllp.tls.secretRef: certKey and keyKey must be set together",
    ),
    "http tls half a pair": (
        bad({"sender": {"http": {"url": "https://b/x", "tls": TLS_HALF}}}),
        "spec.sender.http.tls.secretRef: certKey and keyKey must be set together",
    ),
    "a long name": (
        bad(name="x" * 57),
        "metadata.name: must be at most 56 characters, so that the worker's name"
        " '<name>-worker' stays a valid label value",
    ),
    "sftp with lanes": (
        bad({**sftp(), "lanes": {"count": 2}}),
        "spec.lanes.count: sftp takes one lane only (lanes.count 1): a receiver reads an SFTP"
        " folder in the order of its file names, so files written at once could be read out of"
        " order",
    ),
    "sftp file name without id": (
        bad(sftp(fileName="out.hl7")),
        "spec.sender.sftp: fileName must contain {id} or {controlId}, so that each message has"
        " its own file",
    ),
    "sftp temporary name is the name": (
        bad(sftp(temporaryName="{name}")),
        "spec.sender.sftp: temporaryName must contain {name} and differ from it, e.g. .{name}.part",
    ),
    "sftp temporary name without the name": (
        bad(sftp(temporaryName="upload.part")),
        "spec.sender.sftp: temporaryName must contain {name} and differ from it, e.g. .{name}.part",
    ),
    "sftp with neither key": (
        bad(sftp(secretRef={"name": "s"})),
        "spec.sender.sftp.secretRef: exactly one of privateKeyKey and passwordKey must be set",
    ),
    "sftp with both keys": (
        bad(sftp(secretRef={"name": "s", "privateKeyKey": "k", "passwordKey": "p"})),
        "spec.sender.sftp.secretRef: exactly one of privateKeyKey and passwordKey must be set",
    ),
    "filter on a delimiter": (
        bad(fields({"field": "MSH-2", "operator": "Exists"})),
        "spec.filter.fields[0].field: MSH-1 and MSH-2 are the delimiters; filters read MSH-3 and"
        " later",
    ),
    "filter on a delimiter's component": (
        bad(fields({"field": "MSH-1.1", "operator": "In", "values": ["|"]})),
        "spec.filter.fields[0].field: MSH-1 and MSH-2 are the delimiters; filters read MSH-3 and"
        " later",
    ),
    "In without values": (
        bad(fields({"field": "PV1-3", "operator": "In"})),
        "spec.filter.fields[0].values: In, NotIn, Matches and NotMatches need at least one value",
    ),
    "In with no value": (
        bad(fields({"field": "PV1-3", "operator": "In", "values": []})),
        "spec.filter.fields[0].values: In, NotIn, Matches and NotMatches need at least one value",
    ),
    "DoesNotExist with values": (
        bad(fields({"field": "PV1-3", "operator": "DoesNotExist", "values": ["4W"]})),
        "spec.filter.fields[0].values: Exists and DoesNotExist take no values",
    ),
    "a carrier twice": (
        bad({"carriers": ["LH", "UA", "LH"]}),
        "spec.carriers: each carrier may be listed once",
    ),
    "a profile clearing PID-3": (
        bad({"profile": {"clear": ["PID-13", "PID-3.1"]}}),
        "spec.profile.clear: MSH-1 and MSH-2 (the delimiters), MSH-10 (the receiver's ACK names"
        " it) and PID-3 (the patient) may not be changed by a profile",
    ),
    "a profile mapping MSH-10": (
        bad({"profile": {"maps": [{"field": "MSH-10", "table": {"a": "b"}}]}}),
        "spec.profile.maps[0].field: MSH-1 and MSH-2 (the delimiters), MSH-10 (the receiver's"
        " ACK names it) and PID-3 (the patient) may not be changed by a profile",
    ),
}
#: Good neighbours of the bad inputs: each rule's accepting side beyond the examples.
GOOD: dict[str, dict[str, Any]] = {
    "sftp one lane": bad({**sftp(), "lanes": {"count": 1}}),
    "sftp temporary name": bad(sftp(temporaryName=".{name}.part", fileName="{controlId}.hl7")),
    "sftp password": bad(sftp(secretRef={"name": "s", "passwordKey": "p"})),
    "MSH-21 is no delimiter": bad(fields({"field": "MSH-21", "operator": "Exists"})),
    "Matches with a value": bad(
        fields({"field": "PV1-3", "operator": "Matches", "values": ["^4"]})
    ),
    "mllp tls pair": bad({"sender": {"mllp": {"host": "a", "port": 1, "tls": TLS_PAIR}}}),
    "http tls pair": bad({"sender": {"http": {"url": "https://b/x", "tls": TLS_PAIR}}}),
    "carriers once each": bad({"carriers": ["LH", "UA"]}),
    "a 56-character name": bad(name="x" * 56),
    "a profile": bad(
        {
            "profile": {
                "clear": ["PID-13", "PID-30"],
                "maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}, "otherwise": "hold"}],
            }
        }
    ),
}


# --- the tests --------------------------------------------------------------------------------


def test_the_corpus_holds_every_example_and_documented_manifest() -> None:
    assert len(EXAMPLES) >= 9 and len(DOCS) >= 5, (sorted(EXAMPLES), sorted(DOCS))
    assert {"examples/sftp-drop.yaml#0", "examples/engine/lis-by-facility.yaml#1"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted({**EXAMPLES, **DOCS, **GOOD}))
def test_the_engine_accepts_what_we_accept(name: str) -> None:
    doc = {**EXAMPLES, **DOCS, **GOOD}[name]
    judged, problems = evaluate(doc)
    assert problems == []
    assert judged and all(j.engine and j.twin for j in judged), [
        (j.line, j.engine, j.twin) for j in judged if not (j.engine and j.twin)
    ]


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_engine_refuses_what_we_refuse_with_the_same_line(name: str) -> None:
    doc, line = BAD[name]
    judged, problems = evaluate(doc)
    assert [(j.line, j.engine) for j in judged] == [(j.line, j.twin) for j in judged]
    refused = sorted(j.line for j in judged if not j.engine)
    assert refused == [line]
    assert problems == [line]  # our validation: the same one line, nothing else


def test_every_rule_of_the_crd_was_run_both_ways() -> None:
    """Across the corpus, every rule of the CRD was accepted and refused at least once by the
    engine, so that no rule passes here only because it was never reached."""
    answers: dict[tuple[str, str], set[bool]] = {
        (path, item["rule"]): set() for path, item in crd_rules(OPENAPI)
    }
    docs = [*EXAMPLES.values(), *DOCS.values(), *GOOD.values(), *(d for d, _ in BAD.values())]
    for doc in docs:
        for j in evaluate(doc)[0]:
            answers[re.sub(r"\[\d+\]", "[]", j.where), j.rule["rule"]].add(j.engine)
    assert len(answers) == 15  # 14 rules, the TLS pair's on both senders
    assert {key: seen for key, seen in answers.items() if seen != {True, False}} == {}


#: What a Kubernetes-only CEL library would be called by (k8s.io/apiserver/pkg/cel/library and
#: the transition rules); celpy has none of them.
KUBERNETES_ONLY = re.compile(
    r"\boldSelf\b|\.(isSorted|sum|min|max|indexOf|lastIndexOf|lowerAscii|upperAscii|replace"
    r"|split|join|substring|trim|find|findAll|isURL|url|getScheme|getHost|isQuantity|quantity"
    r"|isIP|ip|isCIDR|cidr|format|quote|reverse)\(|\b(url|quantity|ip|cidr)\("
)


def test_the_rules_use_no_kubernetes_extension() -> None:
    rules = [item["rule"] for _, item in crd_rules(OPENAPI)]
    assert [r for r in rules if KUBERNETES_ONLY.search(r)] == []
    for rule in rules:  # and each compiles in the engine
        ENV.compile(rule)
