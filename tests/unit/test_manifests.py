"""Pure rendering of a Destination into its worker's ConfigMap and Deployment, and its status.

Rendered objects are validated against the real Kubernetes OpenAPI schemas of every cluster
version we claim (the ``kubernetes-validate`` package, strict: unknown fields are errors).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inturn.operator import manifests, status
from inturn.operator.manifests import WorkerPodSettings, render, sender_summary
from inturn.worker.spec.destination import ManifestError, load_manifest, load_worker_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
SETTINGS = WorkerPodSettings(image="ghcr.io/example/inturn:0.1.0")


def stored(
    doc: dict[str, Any], uid: str = "9f0c0b9e-0000-4000-8000-000000000001"
) -> dict[str, Any]:
    """A manifest as the API server stores it: namespace and uid set."""
    body = copy.deepcopy(doc)
    body["metadata"].setdefault("namespace", "default")
    body["metadata"]["uid"] = uid
    body["metadata"]["generation"] = 1
    return body


def example(name: str) -> dict[str, Any]:
    return stored(yaml.safe_load((ROOT / "examples" / name).read_text()))


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("version", CLUSTER_VERSIONS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_children_are_valid_kubernetes_objects(name: str, version: str) -> None:
    children = render(example(name), SETTINGS)
    kubernetes_validate.validate(children.config_map, version, strict=True)
    kubernetes_validate.validate(children.deployment, version, strict=True)


@pytest.mark.parametrize("name", EXAMPLES)
def test_config_map_holds_the_worker_configuration(name: str) -> None:
    body = example(name)
    children = render(body, SETTINGS)
    text = children.config_map["data"]["worker.json"]
    assert load_worker_config(json.loads(text)) == load_manifest(body)
    pod = children.deployment["spec"]["template"]
    assert pod["metadata"]["annotations"][manifests.CONFIG_HASH_ANNOTATION] == manifests.digest(
        text
    )


def test_rendering_is_deterministic() -> None:
    a = render(example("lab-mllp-tls.yaml"), SETTINGS)
    b = render(example("lab-mllp-tls.yaml"), SETTINGS)
    assert json.dumps(a.deployment, sort_keys=True) == json.dumps(b.deployment, sort_keys=True)
    assert a.config_map == b.config_map


def test_names_labels_owner_and_singleton() -> None:
    d = render(example("local-mllp.yaml"), SETTINGS).deployment
    assert d["metadata"]["name"] == "local-mllp-worker"
    assert d["metadata"]["namespace"] == "default"
    labels = d["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == manifests.MANAGED_BY
    assert labels[manifests.DESTINATION_LABEL] == "local-mllp"
    assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert d["spec"]["template"]["metadata"]["labels"] == labels
    (owner,) = d["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "inturn.dev/v1alpha1",
        "kind": "Destination",
        "name": "local-mllp",
        "uid": "9f0c0b9e-0000-4000-8000-000000000001",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert d["spec"]["replicas"] == 1
    assert d["spec"]["strategy"] == {"type": "Recreate"}


def test_pod_is_restricted_and_read_only() -> None:
    pod = render(example("local-http.yaml"), SETTINGS).deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/tmp"] == "tmp"
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert c["command"][:4] == ["inturn", "worker", "--config", "/etc/inturn/worker.json"]
    # the pod's probes reach its IP: every interface, said explicitly (the CLI's default is
    # loopback)
    assert c["command"][4:8] == ["--http-host", "0.0.0.0", "--http-port", "8080"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["resources"]["limits"]["memory"] == "256Mi"


def test_dsn_comes_from_the_secret_by_reference() -> None:
    settings = WorkerPodSettings(image="i", dsn_secret_name="pg", dsn_secret_key="uri")
    (c,) = render(example("local-mllp.yaml"), settings).deployment["spec"]["template"]["spec"][
        "containers"
    ]
    assert c["env"] == [
        {"name": "INTURN_DSN", "valueFrom": {"secretKeyRef": {"name": "pg", "key": "uri"}}}
    ]


def test_workers_get_the_worklist_publishers_env() -> None:
    env, secret_env = manifests.parse_worker_env(
        ["INTURN_WORKLIST_NATS_URL=nats://nats:4222", "INTURN_WORKLIST_NOTIFY=inturn_worklist"],
        ["INTURN_WORKLIST_WEBHOOK_SECRET=worklist-hook/secret"],
    )
    settings = WorkerPodSettings(image="i", env=env, secret_env=secret_env)
    (c,) = render(example("local-mllp.yaml"), settings).deployment["spec"]["template"]["spec"][
        "containers"
    ]
    assert c["env"][1:] == [
        {"name": "INTURN_WORKLIST_NATS_URL", "value": "nats://nats:4222"},
        {"name": "INTURN_WORKLIST_NOTIFY", "value": "inturn_worklist"},
        {
            "name": "INTURN_WORKLIST_WEBHOOK_SECRET",
            "valueFrom": {"secretKeyRef": {"name": "worklist-hook", "key": "secret"}},
        },
    ]


@pytest.mark.parametrize(
    ("plain", "secret", "message"),
    [
        (["NOEQUALS"], [], "expected NAME=VALUE"),
        (["INTURN_DSN=postgres://x"], [], "set by the operator itself"),
        ([], ["X=secret-without-key"], "expected NAME=SECRET/KEY"),
        (["1BAD=x"], [], "variable name"),
    ],
)
def test_worker_env_is_checked(plain: list[str], secret: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        manifests.parse_worker_env(plain, secret)


def test_grace_period_outlasts_an_attempt() -> None:
    body = example("local-mllp.yaml")
    body["spec"]["retry"]["timeoutSeconds"] = 120
    pod = render(body, SETTINGS).deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 120
    assert manifests.termination_grace_seconds(30) > 30


def test_tls_and_credential_secrets_are_mounted_by_reference() -> None:
    pod = render(example("lab-mllp-tls.yaml"), SETTINGS).deployment["spec"]["template"]["spec"]
    secret_volumes = [v for v in pod["volumes"] if "secret" in v]
    assert secret_volumes == [
        {
            "name": "secret-0",
            "secret": {
                "secretName": "lab-partner-tls",
                "items": [
                    {"key": "ca.crt", "path": "ca.crt"},
                    {"key": "tls.crt", "path": "tls.crt"},
                    {"key": "tls.key", "path": "tls.key"},
                ],
                "defaultMode": 0o440,
            },
        }
    ]
    (c,) = pod["containers"]
    assert {
        "name": "secret-0",
        "mountPath": "/etc/inturn/secrets/lab-partner-tls",
        "readOnly": True,
    } in c["volumeMounts"]
    http = render(example("adt-http-filtered.yaml"), SETTINGS)
    assert (
        "/etc/inturn/secrets/bed-board-credentials/headers"
        in http.config_map["data"]["worker.json"]
    )


def test_worker_scheduling_settings_are_passed_through() -> None:
    pod = render(example("lab-mllp-tls.yaml"), SETTINGS).deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert pod["priorityClassName"] == "inturn-workers"
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"memory": "256Mi"},
    }


def test_a_spec_change_rolls_the_pod_and_label_churn_does_not() -> None:
    body = example("local-mllp.yaml")
    before = render(body, SETTINGS)
    relabelled = copy.deepcopy(body)
    relabelled["metadata"]["labels"] = {"argocd.argoproj.io/instance": "x"}
    assert render(relabelled, SETTINGS).deployment == before.deployment
    changed = copy.deepcopy(body)
    changed["spec"]["retry"]["maxAttempts"] = 7
    after = render(changed, SETTINGS)
    assert after.config_hash != before.config_hash
    spec_hash = manifests.SPEC_HASH_ANNOTATION
    assert (
        after.deployment["metadata"]["annotations"][spec_hash]
        != before.deployment["metadata"]["annotations"][spec_hash]
    )


def test_invalid_spec_raises_manifest_error() -> None:
    body = example("local-mllp.yaml")
    del body["spec"]["retry"]["maxAttempts"]
    with pytest.raises(ManifestError, match=r"spec\.retry\.maxAttempts: required"):
        render(body, SETTINGS)


@pytest.mark.parametrize(
    ("sender", "summary"),
    [
        ({"mllp": {"host": "h", "port": 1}}, "mllp://h:1"),
        ({"mllp": {"host": "h", "port": 1, "tls": {}}}, "mllps://h:1"),
        ({"http": {"url": "https://u:p@h:8443/a/b?token=x#f"}}, "https://h:8443/a/b"),
    ],
)
def test_sender_summary_has_no_credentials(sender: dict[str, Any], summary: str) -> None:
    assert sender_summary({"sender": sender}) == summary


# --- status -----------------------------------------------------------------------------------

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
WORKER_UP = status.WorkerDeployment(name="d-worker", exists=True, available=True)


def desired(**kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "generation": 3,
        "previous": None,
        "worker": WORKER_UP,
        "depth": status.QueueDepth(),
        "suspended": False,
        "sender": "mllp://h:1",
        "now": T0,
    }
    args.update(kwargs)
    return status.desired_status(**args)


def cond(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == type_)


def test_idle_and_ready() -> None:
    st = desired()
    assert st["observedGeneration"] == 3
    assert cond(st, "Ready") | {} == {
        "type": "Ready",
        "status": "True",
        "observedGeneration": 3,
        "lastTransitionTime": "2026-01-02T03:04:05Z",
        "reason": "WorkerAvailable",
        "message": "The worker Deployment d-worker is available.",
    }
    assert cond(st, "Delivering")["reason"] == "Idle"
    assert (st["pending"], st["failed"], st["mostAttempts"]) == (0, 0, 0)
    assert "oldestPendingTime" not in st


def test_blocked_head_shows_the_error_class_only() -> None:
    depth = status.QueueDepth(
        pending=4,
        oldest=T0 - timedelta(minutes=5),
        max_attempts=6,
        head_attempts=6,
        head_error="connection: refused by 10.0.0.5 MSH|^~\\&|SECRET PAYLOAD",
    )
    st = desired(depth=depth)
    c = cond(st, "Delivering")
    assert (c["status"], c["reason"]) == ("False", "Blocked")
    assert "connection" in c["message"] and "refused" not in c["message"]
    assert "MSH" not in json.dumps(st)
    assert st["oldestPendingTime"] == "2026-01-02T02:59:05Z"
    assert st["mostAttempts"] == 6


def test_an_unreachable_receiver_is_not_draining() -> None:
    depth = status.QueueDepth(
        pending=3,
        oldest=T0 - timedelta(minutes=5),
        head_attempts=0,
        head_error="unreachable: connect lab:2575: [Errno 111] Connection refused",
    )
    c = cond(desired(depth=depth), "Delivering")
    assert (c["status"], c["reason"]) == ("False", "Unreachable")
    assert "no attempt is spent" in c["message"] and "2575" not in c["message"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("AE: unknown patient", "AE"),
        ("timeout", "timeout"),
        ("MSH|^~\\&|x: y", "unknown"),
        (None, "unknown"),
    ],
)
def test_error_class(raw: str | None, expected: str) -> None:
    assert status.error_class(raw) == expected


def test_transition_time_changes_only_on_a_flip() -> None:
    first = desired()
    later = T0 + timedelta(minutes=1)
    same = desired(previous=first, now=later, depth=status.QueueDepth(pending=2))
    assert cond(same, "Delivering")["reason"] == "Draining"
    assert cond(same, "Delivering")["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    down = desired(
        previous=same, now=later, worker=status.WorkerDeployment(name="d-worker", exists=True)
    )
    assert cond(down, "Ready")["status"] == "False"
    assert cond(down, "Ready")["reason"] == "WorkerUnavailable"
    assert cond(down, "Ready")["lastTransitionTime"] == "2026-01-02T03:05:05Z"


def test_unknown_depth_keeps_the_last_figures() -> None:
    first = desired(depth=status.QueueDepth(pending=9, oldest=T0))
    st = desired(previous=first, depth=None)
    assert st["pending"] == 9 and st["oldestPendingTime"] == first["oldestPendingTime"]
    assert cond(st, "Delivering") == cond(first, "Delivering")
    assert cond(desired(depth=None), "Delivering")["reason"] == "QueueUnknown"


def test_invalid_spec_and_suspend() -> None:
    st = desired(invalid="spec.retry.maxAttempts: required", sender=None, suspended=True)
    assert cond(st, "Ready")["reason"] == "InvalidSpec"
    assert "spec.retry.maxAttempts: required" in cond(st, "Ready")["message"]
    assert cond(st, "Delivering")["reason"] == "Suspended"


def test_patch_only_on_change() -> None:
    st = desired(depth=status.QueueDepth(pending=1, oldest=T0))
    assert status.status_patch(None, st) == st
    assert status.status_patch(st, st) is None
    drained = desired(previous=st, depth=status.QueueDepth())
    patch = status.status_patch(st, drained)
    assert patch is not None
    assert patch["oldestPendingTime"] is None and patch["pending"] == 0
    assert "worker" not in patch and "sender" not in patch
    # a field the operator does not own is never touched
    assert status.status_patch({**st, "foreign": 1}, st) is None


def test_a_lost_node_evicts_the_worker_after_thirty_seconds_not_five_minutes() -> None:
    pod = render(example("local-mllp.yaml"), SETTINGS).deployment["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": manifests.NODE_LOSS_TOLERATION_SECONDS,
        }
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]
    assert manifests.NODE_LOSS_TOLERATION_SECONDS == 30


def test_a_destination_s_own_node_loss_toleration_wins() -> None:
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    body = example("lab-mllp-tls.yaml")
    body["spec"]["worker"]["tolerations"].append(own)
    pod = render(body, SETTINGS).deployment["spec"]["template"]["spec"]
    keys = [t["key"] for t in pod["tolerations"]]
    assert keys == ["dedicated", "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"]
    assert pod["tolerations"][1] == own  # no tolerationSeconds: the Destination's choice


def test_lanes_are_in_the_status_and_a_failing_patient_does_not_block_them() -> None:
    view = {
        "count": 8,
        "heads": [12, 14],
        "windowFull": False,
        "oldestWaiting": {"id": 11, "reason": "backoff", "text": "its last attempt failed"},
    }
    depth = status.QueueDepth(
        pending=40, oldest=T0, max_attempts=3, head_attempts=3, head_error="AE: x", lanes=view
    )
    st = desired(depth=depth)
    assert st["lanes"] == view
    c = cond(st, "Delivering")
    assert (c["status"], c["reason"]) == ("True", "Draining")
    assert "8 lanes" in c["message"] and "AE" in c["message"]
    # every lane held (no head): blocked, as with one stream
    held = status.QueueDepth(pending=3, head_attempts=2, lanes={**view, "heads": []})
    assert cond(desired(depth=held), "Delivering")["reason"] == "Blocked"
    # lanes gone from the depth: the field is removed from the status
    patch = status.status_patch(st, desired(depth=status.QueueDepth(pending=1)))
    assert patch is not None and patch["lanes"] is None


def test_workers_get_the_master_keys_folder_and_the_key_store_when_encryption_is_on() -> None:
    settings = WorkerPodSettings(
        image="i", payload_keys_secret="payload-keys", key_dsn_secret="ks", key_dsn_secret_key="u"
    )
    pod = render(example("local-mllp.yaml"), settings).deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["env"][1:3] == [
        {"name": "INTURN_PAYLOAD_KEYS", "value": manifests.PAYLOAD_KEYS_DIR},
        {"name": "INTURN_KEY_DSN", "valueFrom": {"secretKeyRef": {"name": "ks", "key": "u"}}},
    ]
    assert {"name": "payload-keys", "mountPath": manifests.PAYLOAD_KEYS_DIR, "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {
        "name": "payload-keys",
        "secret": {"secretName": "payload-keys", "defaultMode": 0o440},
    } in pod["volumes"]
    plain = render(example("local-mllp.yaml"), WorkerPodSettings(image="i")).deployment
    assert "INTURN_PAYLOAD_KEYS" not in str(plain)
