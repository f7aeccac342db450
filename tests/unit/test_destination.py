"""Destination manifests and rendered worker configurations → WorkerConfig, and their errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from inturn.worker.senders.http import HttpSenderConfig
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.spec.config import WorkerConfig, from_dict, to_dict
from inturn.worker.spec.destination import (
    DEFAULT_SECRETS_DIR,
    ManifestError,
    load_file,
    load_manifest,
    load_worker_config,
    render_worker_config,
    validate_manifest,
)
from tests.support.manifests import destination

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE = destination()


def manifest(**spec_changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for key, value in spec_changes.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return doc


def errors_of(doc: Any) -> tuple[str, ...]:
    with pytest.raises(ManifestError) as info:
        load_manifest(doc)
    return info.value.errors


def test_minimal_manifest_gets_the_schema_defaults() -> None:
    cfg = load_manifest(BASE)
    assert cfg.destination == "ward/lis"
    assert cfg.channel == "adt"
    assert cfg.sender == MllpSenderConfig(host="10.0.0.5", port=2575)
    assert (cfg.retry.max_attempts, cfg.retry.backoff_seconds) == (3, 5)
    assert (cfg.retry.max_backoff_seconds, cfg.retry.timeout_seconds) == (60, 30)
    assert cfg.ack_policy.AE == "retry" and cfg.ack_policy.controlIdMismatch == "retry"
    # the refusals no later attempt can change have no default: they follow maxAttempts (3
    # here: they give up at once)
    assert (cfg.ack_policy.unsendable, cfg.ack_policy.profile) == (None, None)
    assert cfg.ack_policy.action("profile", cfg.retry.max_attempts) == "fail"
    assert cfg.ack_policy.action("profile", 0) == "retry"
    assert (cfg.idle_seconds, cfg.suspend, cfg.message_types) == (60, False, ())


def test_ack_policy_profile_retry_is_taken_and_survives_the_rendered_form() -> None:
    cfg = load_manifest(manifest(ackPolicy={"profile": "retry"}))
    assert (cfg.ack_policy.profile, cfg.ack_policy.unsendable) == ("retry", None)
    assert to_dict(cfg)["ackPolicy"]["profile"] == "retry"
    assert "unsendable" not in to_dict(cfg)["ackPolicy"]  # unset stays unset
    assert from_dict(to_dict(cfg)) == cfg
    assert errors_of(manifest(ackPolicy={"profile": "drop"})) == (
        "spec.ackPolicy.profile: must be one of retry, fail",
    )


def test_namespace_defaults_to_default() -> None:
    doc = copy.deepcopy(BASE)
    del doc["metadata"]["namespace"]
    assert load_manifest(doc).destination == "default/lis"


def test_input_is_not_modified() -> None:
    doc = copy.deepcopy(BASE)
    load_manifest(doc)
    assert doc == BASE


def test_max_attempts_is_required() -> None:
    assert errors_of(manifest(retry={"backoffSeconds": 5})) == ("spec.retry.maxAttempts: required",)


def test_message_names_the_source_and_field() -> None:
    with pytest.raises(ManifestError, match=r"^ward/lis: spec\.retry\.maxAttempts: required$"):
        load_manifest(manifest(retry={}))


@pytest.mark.parametrize(
    "sender",
    [
        {"mllp": {"host": "a", "port": 1}, "http": {"url": "http://b/x"}},
        {},
    ],
)
def test_exactly_one_sender(sender: dict[str, Any]) -> None:
    assert errors_of(manifest(sender=sender)) == (
        "spec.sender: exactly one of mllp, http, sftp must be set",
    )


def test_max_backoff_not_below_backoff() -> None:
    assert errors_of(manifest(retry={"maxAttempts": 1, "backoffSeconds": 90})) == (
        "spec.retry: maxBackoffSeconds must be greater than or equal to backoffSeconds",
    )


def test_unknown_field_is_reported_like_kubectl_strict() -> None:
    assert errors_of(manifest(retry={"maxAttempts": 1, "maxAtempts": 2})) == (
        "spec.retry.maxAtempts: unknown field",
    )


@pytest.mark.parametrize(
    ("sender", "expected"),
    [
        ({"mllp": {"host": "a", "port": "2575"}}, "spec.sender.mllp.port: must be an integer"),
        ({"mllp": {"host": "a", "port": 70000}}, "spec.sender.mllp.port: must be <= 65535"),
        ({"mllp": {"host": "", "port": 1}}, "spec.sender.mllp.host: must not be empty"),
        ({"http": {"url": "ftp://x/y"}}, "spec.sender.http.url: 'ftp://x/y' does not match"),
        (
            {"mllp": {"host": "a", "port": 1, "tls": {"secretRef": {"name": "s", "certKey": "c"}}}},
            "spec.sender.mllp.tls.secretRef: certKey and keyKey must be set together",
        ),
    ],
)
def test_field_errors(sender: dict[str, Any], expected: str) -> None:
    (error,) = errors_of(manifest(sender=sender))
    assert error.startswith(expected)


def test_enum_and_list_bounds() -> None:
    errors = errors_of(
        manifest(ackPolicy={"AE": "drop"}, filter={"messageTypes": ["ADT"] * 65}),
    )
    assert errors == (
        "spec.ackPolicy.AE: must be one of retry, fail",
        "spec.filter.messageTypes: must have at most 64 items",
    )


def test_every_problem_is_reported_at_once() -> None:
    doc = manifest(channel=None, retry={})
    doc["apiVersion"] = "v1"
    assert errors_of(doc) == (
        "apiVersion: must be inturn.dev/v1alpha1, not 'v1'",
        "spec.channel: required",
        "spec.retry.maxAttempts: required",
    )


def test_name_length_leaves_room_for_the_worker_suffix() -> None:
    doc = copy.deepcopy(BASE)
    doc["metadata"]["name"] = "x" * 57
    assert errors_of(doc) == (
        "metadata.name: must be at most 56 characters, so that the worker's name"
        " '<name>-worker' stays a valid label value",
    )


@pytest.mark.parametrize("bad", [None, [], "text", {"kind": "Destination"}])
def test_garbage_gives_a_message_not_a_traceback(bad: Any) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(bad)
    assert str(info.value)


def test_secret_references_become_files_under_the_mount() -> None:
    tls = {"serverName": "lis.example", "secretRef": {"name": "p", "certKey": "c", "keyKey": "k"}}
    cfg = load_manifest(manifest(sender={"mllp": {"host": "h", "port": 1, "tls": tls}}))
    assert isinstance(cfg.sender, MllpSenderConfig) and cfg.sender.tls is not None
    assert cfg.sender.tls.ca_file == f"{DEFAULT_SECRETS_DIR}/p/ca.crt"
    assert cfg.sender.tls.cert_file == f"{DEFAULT_SECRETS_DIR}/p/c"
    assert cfg.sender.tls.key_file == f"{DEFAULT_SECRETS_DIR}/p/k"
    assert cfg.sender.tls.server_name == "lis.example"

    http = {"url": "https://x/y", "secretRef": {"name": "creds"}}
    cfg = load_manifest(manifest(sender={"http": http}), secrets_dir="/tmp/s")
    assert isinstance(cfg.sender, HttpSenderConfig)
    assert cfg.sender.headers_file == "/tmp/s/creds/headers"


def test_validate_manifest_returns_the_defaulted_copy() -> None:
    valid = validate_manifest(BASE)
    assert valid["spec"]["ackPolicy"]["AR"] == "retry"
    assert valid["spec"]["suspend"] is False
    assert "ackPolicy" not in BASE["spec"]


# --- rendered worker configurations ---------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_render_and_load_are_inverse(path: Path) -> None:
    for cfg in load_file(path):
        rendered = render_worker_config(cfg)
        assert rendered["kind"] == "WorkerConfig"
        assert load_worker_config(json.loads(json.dumps(rendered))) == cfg
        assert from_dict(to_dict(cfg)) == cfg


def test_worker_config_defaults_and_errors() -> None:
    minimal = {
        "destination": "ns/d",
        "channel": "adt",
        "sender": {"http": {"url": "http://h/p"}},
        "retry": {"maxAttempts": 0},
    }
    cfg = load_worker_config(minimal)
    assert isinstance(cfg, WorkerConfig) and cfg.retry.backoff_seconds == 5
    with pytest.raises(ManifestError, match=r"sender\.http\.secretRef: unknown field"):
        load_worker_config(
            {**minimal, "sender": {"http": {"url": "http://h/p", "secretRef": {"name": "x"}}}}
        )
    with pytest.raises(ManifestError, match=r"^ns/d: retry\.maxAttempts: required$"):
        load_worker_config({**minimal, "retry": {}})
    with pytest.raises(ManifestError, match=r"kind: must be one of WorkerConfig"):
        load_worker_config({**minimal, "kind": "Destination"})


# --- files ------------------------------------------------------------------------------------


def test_load_file_reads_every_document(tmp_path: Path) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(
        "\n---\n".join((EXAMPLES / n).read_text() for n in ("local-mllp.yaml", "local-http.yaml"))
        + "\n---\n"
    )
    keys = [cfg.destination for cfg in load_file(path)]
    assert keys == ["default/local-mllp", "default/local-http"]


def test_load_file_names_the_document(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text((EXAMPLES / "local-mllp.yaml").read_text() + "\n---\n" + "kind: Pod\n")
    with pytest.raises(ManifestError, match=r"bad\.yaml#2: kind: must be Destination or"):
        load_file(path)


def test_load_file_reports_yaml_errors_by_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("kind: Destination\nspec: [\n")
    with pytest.raises(ManifestError, match=r"broken\.yaml: line \d+: not valid YAML"):
        load_file(path)


def test_local_secrets_dir_is_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tls.yaml"
    path.write_text((EXAMPLES / "lab-mllp-tls.yaml").read_text())
    (cfg,) = load_file(path, secrets_dir="secrets")
    assert isinstance(cfg.sender, MllpSenderConfig) and cfg.sender.tls is not None
    assert cfg.sender.tls.ca_file == str(tmp_path / "secrets" / "lab-partner-tls" / "ca.crt")


def test_list_documents_are_expanded(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [BASE, BASE]}))
    assert [c.destination for c in load_file(path)] == ["ward/lis", "ward/lis"]


def test_sweeper_thresholds_default_and_carry_through() -> None:
    cfg = load_manifest(manifest())
    assert (cfg.stuck_after_seconds, cfg.expire_after_seconds) == (900, None)
    cfg = load_manifest(manifest(alerting={"stuckAfterSeconds": 120}, expireAfterSeconds=86400))
    assert (cfg.stuck_after_seconds, cfg.expire_after_seconds) == (120, 86400)
    assert from_dict(to_dict(cfg)) == cfg
    assert load_worker_config(render_worker_config(cfg)) == cfg


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"expireAfterSeconds": 30}, r"spec\.expireAfterSeconds: .*60"),
        ({"alerting": {"stuckAfterSeconds": 0}}, r"spec\.alerting\.stuckAfterSeconds: .*1"),
        ({"alerting": {"stuckAfter": 5}}, r"spec\.alerting\.stuckAfter: unknown field"),
    ],
)
def test_sweeper_thresholds_are_validated(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        load_manifest(manifest(**changes))


def test_lanes_default_to_one_and_carry_through() -> None:
    cfg = load_manifest(BASE)
    assert (cfg.lanes, cfg.lanes_window) == (1, 10_000)
    assert "lanes" not in to_dict(cfg)  # one lane renders as it did before lanes existed
    cfg = load_manifest(manifest(lanes={"count": 8}))
    assert (cfg.lanes, cfg.lanes_window) == (8, 10_000)
    assert from_dict(to_dict(cfg)) == cfg
    assert to_dict(cfg)["lanes"] == {"count": 8, "key": "patient", "window": 10_000}
    cfg = load_manifest(manifest(lanes={"count": 32, "key": "patient", "window": 500}))
    assert (cfg.lanes, cfg.lanes_window) == (32, 500)
    assert load_worker_config(render_worker_config(cfg)) == cfg


@pytest.mark.parametrize(
    ("lanes", "message"),
    [
        ({"count": 0}, r"spec\.lanes\.count: .*1"),
        ({"count": 33}, r"spec\.lanes\.count: .*32"),
        ({"key": "visit"}, r"spec\.lanes\.key: .*patient"),
        ({"window": 0}, r"spec\.lanes\.window: .*1"),
        ({"window": 100_001}, r"spec\.lanes\.window: .*100000"),
    ],
)
def test_lanes_are_bounded(lanes: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        load_manifest(manifest(lanes=lanes))


def test_sftp_refuses_lanes_with_a_reason() -> None:
    ref = {"name": "drop", "knownHostsKey": "known_hosts", "privateKeyKey": "id_ed25519"}
    sftp = {
        "sftp": {"host": "files.example", "username": "drop", "directory": "/in", "secretRef": ref}
    }
    with pytest.raises(ManifestError, match=r"spec\.lanes\.count: sftp takes one lane only"):
        load_manifest(manifest(sender=sftp, lanes={"count": 2}))
    assert load_manifest(manifest(sender=sftp, lanes={"count": 1})).lanes == 1
    assert load_manifest(manifest(sender=sftp)).lanes == 1
