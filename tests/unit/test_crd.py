"""The Destination CRD: generated files are current, the CRD is valid and structural, examples pass.

Structural-schema rules are those of the Kubernetes documentation ("Specifying a structural
schema", tasks/extend-kubernetes/custom-resources/custom-resource-definitions).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inturn.worker.senders import registry as senders
from inturn.worker.spec import schema
from inturn.worker.spec.destination import apply_defaults, validate, validate_manifest

ROOT = Path(__file__).resolve().parents[2]
#: Kubernetes minor versions we claim (CEL validation rules are GA from 1.29).
CLUSTER_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")


def nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (properties, items, additionalProperties)."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("rel", sorted(schema.generated_files()), ids=str)
def test_generated_files_are_current(rel: Path) -> None:
    path = ROOT / rel
    assert path.exists(), f"{rel} is missing: run python -m inturn.worker.spec.schema --write"
    assert path.read_text() == schema.generated_files()[rel], (
        f"{rel} is stale: run python -m inturn.worker.spec.schema --write"
    )


def test_check_mode_reports_stale(tmp_path: Path) -> None:
    assert schema.main(["--root", str(tmp_path), "--check"]) == 1
    assert schema.main(["--root", str(tmp_path), "--write"]) == 0
    assert schema.main(["--root", str(tmp_path), "--check"]) == 0


@pytest.mark.parametrize("version", CLUSTER_VERSIONS)
def test_crd_is_a_valid_apiextensions_v1_object(version: str) -> None:
    doc = yaml.safe_load((ROOT / schema.CRD_PATH).read_text())
    kubernetes_validate.validate(doc, version, strict=True)


def test_names_scope_and_subresources() -> None:
    spec = schema.crd()["spec"]
    assert spec["group"] == "inturn.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "Destination" and spec["names"]["plural"] == "destinations"
    assert "dest" in spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}  # no scale: replicas are pinned to 1
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Channel", "Sender", "Ready", "Pending", "Oldest", "Age"]
    oldest = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Oldest")
    assert oldest == {"name": "Oldest", "type": "date", "jsonPath": ".status.oldestPendingTime"}


def test_schema_is_structural() -> None:
    root = schema.openapi_schema()
    for path, node in nodes(root):
        where = path or "<root>"
        special = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert "type" in node or special, f"{where}: every node must have a type"
        assert "$ref" not in node, f"{where}: $ref is not allowed"
        assert not ("properties" in node and "additionalProperties" in node), where
        assert node.get("additionalProperties", {}) is not False, where
        for combinator in ("anyOf", "allOf", "oneOf", "not"):
            for branch in node.get(combinator, []) if combinator != "not" else []:
                forbidden = {"description", "default", "additionalProperties", "nullable"}
                assert not forbidden & set(branch), f"{where}: {combinator} with {forbidden}"
                if not node.get("x-kubernetes-int-or-string"):
                    assert "type" not in branch, f"{where}: type inside {combinator}"
        if node.get("x-kubernetes-list-type") == "map":
            required = set(node["items"].get("required", []))
            assert set(node["x-kubernetes-list-map-keys"]) <= required, where
    assert root["properties"]["metadata"] == {"type": "object"}


def test_strings_and_lists_are_bounded_for_cel_cost() -> None:
    for path, node in nodes(schema.openapi_schema()):
        if path.startswith(".metadata") or path in {".apiVersion", ".kind"}:
            continue
        if node.get("type") == "string":
            assert "maxLength" in node or "enum" in node, f"{path}: string without maxLength"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: list without maxItems"
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"{path}: map without maxProperties"


def test_every_default_is_valid_for_its_node() -> None:
    for path, node in nodes(schema.openapi_schema()):
        if "default" in node:
            sub = {k: v for k, v in node.items() if k != "default"}
            value = apply_defaults(sub, node["default"])
            assert validate(sub, value) == [], path


def test_max_attempts_is_required_without_default() -> None:
    retry = schema.spec_schema()["properties"]["retry"]
    assert "maxAttempts" in retry["required"]
    assert "default" not in retry["properties"]["maxAttempts"]


def test_every_cel_rule_has_a_python_twin_and_a_message() -> None:
    found = []
    for path, node in nodes(schema.openapi_schema()):
        for item in node.get("x-kubernetes-validations", []):
            found.append(item["rule"])
            assert item["rule"] in schema.RULES, f"{path}: {item['rule']} has no Python twin"
            assert item["message"] and not item["message"].endswith(".")
    assert schema.RULE_ONE_SENDER.cel in found
    assert "self.maxBackoffSeconds >= self.backoffSeconds" in found


def test_condition_shape_matches_metav1() -> None:
    cond = schema.status_schema()["properties"]["conditions"]
    assert cond["x-kubernetes-list-type"] == "map"
    assert cond["x-kubernetes-list-map-keys"] == ["type"]
    required = set(cond["items"]["required"])
    assert required == {"type", "status", "lastTransitionTime", "reason", "message"}


EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_with_defaults(path: Path) -> None:
    crd_doc = yaml.safe_load((ROOT / schema.CRD_PATH).read_text())
    openapi = crd_doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is None:
            continue
        # the schema as shipped in the CRD file (not the Python object) with its defaults
        defaulted = apply_defaults(openapi, doc)
        jsonschema.Draft7Validator(openapi).validate(defaulted)
        assert validate(openapi["properties"]["spec"], defaulted["spec"], prefix="spec") == []
        assert validate_manifest(doc)["spec"] == defaulted["spec"]


def test_demo_examples_exist_with_the_agreed_endpoints() -> None:
    mllp = yaml.safe_load((ROOT / "examples/local-mllp.yaml").read_text())
    http = yaml.safe_load((ROOT / "examples/local-http.yaml").read_text())
    assert mllp["spec"]["channel"] == http["spec"]["channel"] == "adt"
    assert mllp["spec"]["sender"]["mllp"] == {"host": "127.0.0.1", "port": 2576}
    assert http["spec"]["sender"]["http"]["url"] == "http://127.0.0.1:8090/hl7"
    assert mllp["spec"]["retry"]["maxAttempts"] == http["spec"]["retry"]["maxAttempts"] == 0


def test_the_one_sender_rule_names_every_registered_kind() -> None:
    rule = schema.RULE_ONE_SENDER
    for name in senders.names():
        assert f"has(self.{name})" in rule.cel and name in rule.message
        assert rule.check({name: {}})
    assert not rule.check({})
    assert not rule.check({name: {} for name in senders.names()})
