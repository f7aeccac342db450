"""The Helm chart, linted and rendered by the real Helm, every object validated for Kubernetes.

Rendering goes through ``tests/helm_chart.py`` (Helm's Go SDK via ``helm-python-sdk``) for the
default values and each values file in ``charts/inturn/ci/``; every object is validated with
``kubernetes-validate`` (strict) for the oldest version the chart claims and the newest ones the
validator knows.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from inturn.worker.feeds.declare import parse_feeds
from inturn.worker.spec import schema
from tests.support.helm_chart import (
    ROOT,
    find,
    lint,
    of_kind,
    pod_specs,
    render,
    render_templates,
    validate,
    values_files,
)

#: "default" plus every values file under charts/inturn/ci/.
VALUE_SETS = ["default", *values_files()]


def _files(name: str) -> list[str]:
    return [] if name == "default" else [name]


def _cluster_versions() -> list[str]:
    """The chart's oldest claimed version (1.29, CEL rules GA) and the three newest known."""
    known = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(map(int, v.split("."))))
    return ["1.29.0", *known[-3:]]


def test_values_files_cover_the_promised_modes() -> None:
    assert {"namespaced", "crds-off", "sweeper", "monitoring", "ingest-secure"} <= set(
        values_files()
    )


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_strict_is_clean(name: str) -> None:
    assert lint(files=_files(name)) == []


#: Kinds of the Prometheus Operator: kubernetes-validate has no schemas for them (they are
#: CRDs), so test_monitoring_objects asserts their fields instead.
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_objects_are_valid(name: str) -> None:
    objs = [o for o in render(files=_files(name)) if o["apiVersion"] != PROMETHEUS_OPERATOR]
    assert objs
    for version in _cluster_versions():
        for obj in objs:
            validate(obj, version)


def test_the_placeholder_image_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"image\.repository is required"):
        render_templates(image=False)


def test_values_schema_rejects_typos() -> None:
    with pytest.raises(helm.HelmValuesError, match="statusInterval"):
        render({"operator": {"statusInterval": 5}})


def test_chart_crd_is_the_crds_folder_crd_and_is_kept() -> None:
    dest = find(render(), "CustomResourceDefinition", schema.CRD_NAME)
    assert dest["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert dest == yaml.safe_load((ROOT / "crds" / "destination.yaml").read_text())
    assert dest == schema.crd()
    assert not of_kind(render(files=["crds-off"]), "CustomResourceDefinition")


def test_crds_take_extra_annotations_for_argo_cd() -> None:
    keep = {"argocd.argoproj.io/sync-options": "Delete=false,Prune=false"}
    objs = render({"crds": {"annotations": keep}})
    for crd in of_kind(objs, "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep", **keep}
    for crd in of_kind(
        render({"crds": {"keep": False, "annotations": keep}}), "CustomResourceDefinition"
    ):
        assert crd["metadata"]["annotations"] == keep
    for crd in of_kind(render({"crds": {"keep": False}}), "CustomResourceDefinition"):
        assert "annotations" not in crd["metadata"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_notes_say_what_was_installed_and_what_to_do_next(name: str) -> None:
    notes = render_templates(files=_files(name))["inturn/templates/NOTES.txt"]
    assert "is installed as release" in notes
    assert "inturn send --mllp 127.0.0.1:2575 examples/messages/" in notes
    assert "kubectl apply -f examples/kubernetes/first-destination.yaml" in notes
    assert "{{" not in notes and "<no value>" not in notes
    for path in (
        "examples/kubernetes/first-destination.yaml",
        "examples/messages",
        "docs/howto/kubernetes.md",
    ):
        assert (ROOT / path).exists()


def test_notes_say_when_nobody_may_send_yet() -> None:
    closed = render_templates()["inturn/templates/NOTES.txt"]
    assert "Nobody may send yet" in closed
    opened = render_templates({"networkPolicy": {"senders": {"namespaces": ["his"]}}})
    assert "Nobody may send yet" not in opened["inturn/templates/NOTES.txt"]


def test_operator_is_a_single_peered_replica() -> None:
    objs = render()
    op = find(objs, "Deployment", "inturn-operator")
    assert op["spec"]["replicas"] == 1 and op["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = op["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["inturn"] and c["args"][0] == "operator"
    assert "--peering=inturn" in c["args"]
    assert "--image=registry.example.test/inturn:0.1.0-test" in c["args"]
    assert c["image"] == "registry.example.test/inturn:0.1.0-test"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    crds = {o["metadata"]["name"] for o in of_kind(objs, "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= crds


#: The operator's rules, whole: (apiGroup, resource) -> verbs. Anything more fails the test.
OPERATOR_RULES: dict[tuple[str, str], set[str]] = {
    ("inturn.dev", "destinations"): {"get", "list", "watch", "patch"},
    ("inturn.dev", "destinations/status"): {"get", "patch"},
    ("inturn.dev", "destinations/finalizers"): {"update"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
#: Watching the whole cluster, the operator makes each worker's NetworkPolicy (issue 39, part 4).
WORKER_POLICIES: dict[tuple[str, str], set[str]] = {
    ("networking.k8s.io", "networkpolicies"): {"get", "create", "patch"}
}
CLUSTER_DISCOVERY: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch", "create"},
}


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("name", VALUE_SETS)
def test_no_secret_access_and_no_wildcards_anywhere(name: str) -> None:
    for role in of_kind(render(files=_files(name)), "ClusterRole", "Role"):
        for (group, resource), verbs in _grants(role).items():
            assert resource != "secrets" and "*" not in (group, resource)
            assert "*" not in verbs


def test_operator_rbac_is_exactly_what_it_needs() -> None:
    cluster = find(render(), "ClusterRole", "inturn-operator-cluster")
    assert _grants(cluster) == OPERATOR_RULES | CLUSTER_DISCOVERY | WORKER_POLICIES

    objs = render(files=["namespaced"])
    assert _grants(find(objs, "ClusterRole", "inturn-operator-cluster")) == CLUSTER_DISCOVERY
    peering = {("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch", "create"}}
    for ns in ("ward-a", "ward-b"):
        assert _grants(find(objs, "Role", "inturn-operator", ns)) == OPERATOR_RULES | peering
        binding = find(objs, "RoleBinding", "inturn-operator", ns)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "inturn-operator", "namespace": "inturn"}
        ]
    args = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--namespace=ward-a" in args and "--namespace=ward-b" in args


def test_per_destination_logins_let_the_operator_read_and_make_secrets_only() -> None:
    """operator.workerLogins per-destination: the one Secret access of the chart, get and
    create (no list, watch, update or delete), and the flag on the operator."""
    objs = render({"operator": {"workerLogins": "per-destination"}})
    grants = _grants(find(objs, "ClusterRole", "inturn-operator-cluster"))
    assert grants == OPERATOR_RULES | CLUSTER_DISCOVERY | WORKER_POLICIES | {
        ("", "secrets"): {"get", "create"}
    }
    args = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--worker-logins=per-destination" in args
    default = find(render(), "Deployment", "inturn-operator")["spec"]["template"]["spec"]
    assert not [a for a in default["containers"][0]["args"] if a.startswith("--worker-logins")]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_pod_is_restricted_with_a_read_only_root(name: str) -> None:
    pods = 0
    for obj in render(files=_files(name)):
        for pod in pod_specs(obj):
            pods += 1
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["runAsUser"] == 10001
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
            for c in pod["containers"] + pod.get("initContainers", []):
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"] == {"drop": ["ALL"]}
                assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
                assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            # Only the operator talks to the Kubernetes API.
            if obj["metadata"]["name"] == "inturn-operator":
                assert pod["serviceAccountName"] == "inturn-operator"
                assert pod.get("automountServiceAccountToken", True) is True
            else:
                assert pod["automountServiceAccountToken"] is False
    assert pods >= 4


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_container_takes_the_dsn_from_the_secret(name: str) -> None:
    for obj in render(files=_files(name)):
        for pod in pod_specs(obj):
            for c in pod["containers"]:
                dsn = [e for e in c["env"] if e["name"] == "INTURN_DSN"]
                assert dsn == [
                    {
                        "name": "INTURN_DSN",
                        "valueFrom": {"secretKeyRef": {"name": "inturn-db", "key": "dsn"}},
                    }
                ], (obj["kind"], obj["metadata"]["name"])


def test_dsn_secret_name_and_key_are_values() -> None:
    objs = render({"database": {"existingSecret": "pg", "key": "url"}})
    op = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "INTURN_DSN", "valueFrom": {"secretKeyRef": {"name": "pg", "key": "url"}}} in (
        op["env"]
    )
    assert "--dsn-secret=pg" in op["args"] and "--dsn-secret-key=url" in op["args"]


def test_sweeper_cronjob_runs_inturn_sweep_within_its_period() -> None:
    sweeper = find(render(), "CronJob", "inturn-sweeper")["spec"]
    assert sweeper["schedule"] == "*/5 * * * *"
    job = sweeper["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] == 240  # shorter than the 5-minute period
    container = job["template"]["spec"]["containers"][0]
    assert container["command"] == ["inturn", "sweep", "--limit=500"]
    assert not [e for e in container["env"] if e["name"].startswith("INTURN_WORKLIST_")]
    off = render({"sweeper": {"enabled": False}})
    assert not [o for o in off if o["metadata"]["name"] == "inturn-sweeper"]
    objs = render(
        {
            "sweeper": {"limit": 50, "only": ["delivery"]},
            "worklist": {
                "notifyChannel": "inturn_worklist",
                "webhook": {"url": "https://hooks/w", "secretRef": {"name": "wh", "key": "k"}},
                "nats": {"url": "nats://nats:4222"},
            },
        }
    )
    container = find(objs, "CronJob", "inturn-sweeper")["spec"]["jobTemplate"]["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert container["command"] == ["inturn", "sweep", "--limit=50", "--only=delivery"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["INTURN_WORKLIST_NOTIFY"] == "inturn_worklist"
    assert env["INTURN_WORKLIST_WEBHOOK_URL"] == "https://hooks/w"
    assert env["INTURN_WORKLIST_WEBHOOK_SECRET"] == {"secretKeyRef": {"name": "wh", "key": "k"}}
    assert env["INTURN_WORKLIST_NATS_URL"] == "nats://nats:4222"
    # The operator gives the workers the same publishers, the HMAC key by Secret reference.
    operator = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]
    args = operator["containers"][0]["args"]
    assert "--worker-env=INTURN_WORKLIST_NATS_URL=nats://nats:4222" in args
    assert "--worker-secret-env=INTURN_WORKLIST_WEBHOOK_SECRET=wh/k" in args
    plain = find(render(), "Deployment", "inturn-operator")["spec"]["template"]["spec"]
    assert not [
        a
        for a in plain["containers"][0]["args"]
        if a.startswith("--worker-") and not a.startswith("--worker-network-policy=")
    ]


def test_cronjobs_and_migrate_hook() -> None:
    objs = render()
    for name in ("inturn-purge", "inturn-sweeper"):
        cron = find(objs, "CronJob", name)["spec"]
        assert cron["concurrencyPolicy"] == "Forbid"
        assert cron["startingDeadlineSeconds"] == 300
        assert cron["successfulJobsHistoryLimit"] == 3 and cron["failedJobsHistoryLimit"] == 3
        assert cron["timeZone"] == "Etc/UTC"
        job = cron["jobTemplate"]["spec"]
        assert job["backoffLimit"] == 2
        assert job["ttlSecondsAfterFinished"] == 86400
        assert job["template"]["spec"]["restartPolicy"] == "Never"
    purge = find(objs, "CronJob", "inturn-purge")
    assert purge["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 1800
    container = purge["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "inturn",
        "purge",
        "--older-than=7d",
        "--worklist-cleared=90d",
        "--hot-window=15m",
        "--epoch=1d",
    ]
    assert purge["spec"]["schedule"] == "*/10 * * * *"
    migrate = find(objs, "Job", "inturn-migrate")
    assert migrate["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert migrate["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "inturn",
        "migrate",
    ]


def test_ingest_listens_on_every_channel() -> None:
    objs = render(files=["namespaced"])
    dep = find(objs, "Deployment", "inturn-ingest")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["ingest", "--listen=adt=0.0.0.0:2575", "--listen=lab=0.0.0.0:2576"]
    svc = find(objs, "Service", "inturn-ingest")
    assert [p["port"] for p in svc["spec"]["ports"]] == [2575, 2576]  # HTTP is off by default
    assert "--ops=0.0.0.0:9090" in args and not [a for a in args if a.startswith("--http")]


def test_a_channel_declares_what_an_unrouted_message_gets() -> None:
    channels = [
        {"name": "adt", "port": 2575},
        {"name": "lab", "port": 2576, "unrouted": "hold"},
        {"name": "rad", "port": 2577, "unrouted": "accept"},
        {"name": "ris", "port": 2578, "unrouted": "reject"},
    ]
    objs = render({"ingest": {"channels": channels}})
    args = find(objs, "Deployment", "inturn-ingest")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert [a for a in args if "unrouted" in a] == [
        "--hold-unrouted=lab",
        "--accept-unrouted=rad",
    ]
    with pytest.raises(helm.HelmValuesError, match="unrouted"):
        render({"ingest": {"channels": [{"name": "adt", "port": 2575, "unrouted": "drop"}]}})


def test_secured_ingest_mounts_tls_and_credentials_and_keeps_ops_apart() -> None:
    objs = render(files=["ingest-secure"])
    pod = find(objs, "Deployment", "inturn-ingest")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"] == [
        "ingest",
        "--listen=adt=0.0.0.0:2575",
        "--allow-network=adt=10.20.0.0/16",
        "--allow-network=adt=192.0.2.7/32",
        "--allow-subject=adt=ris.hospital.example",
        "--listen=lab=0.0.0.0:2576",
        "--ops=0.0.0.0:9090",
        "--max-frame-bytes=16Mi",
        "--tls-cert=/etc/inturn/tls/tls.crt",
        "--tls-key=/etc/inturn/tls/tls.key",
        "--tls-client-ca=/etc/inturn/tls/ca.crt",
        "--http=0.0.0.0:8443",
        "--http-credentials=/etc/inturn/credentials/credentials.yaml",
        "--feeds=/etc/inturn/feeds/feeds.yaml",
        "--feed-flush-seconds=30",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "inturn-ingest-tls"
    assert volumes["credentials"]["secret"]["secretName"] == "inturn-ingest-credentials"
    assert volumes["credentials"]["secret"]["items"] == [
        {"key": "credentials.yaml", "path": "credentials.yaml"}
    ]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["tls"]["readOnly"] and mounts["credentials"]["readOnly"]
    assert c["livenessProbe"]["httpGet"]["port"] == "ops"
    assert c["readinessProbe"]["httpGet"]["port"] == "ops"
    senders = find(objs, "Service", "inturn-ingest")
    assert [p["port"] for p in senders["spec"]["ports"]] == [8443, 2575, 2576]
    ops = find(objs, "Service", "inturn-ingest-ops")
    assert [(p["name"], p["port"]) for p in ops["spec"]["ports"]] == [("ops", 9090)]
    insecure = render({"ingest": {"http": {"enabled": True, "insecure": True}}})
    (c,) = find(insecure, "Deployment", "inturn-ingest")["spec"]["template"]["spec"]["containers"]
    assert "--http-insecure" in c["args"]
    assert "credentials" not in {m["name"] for m in c["volumeMounts"]}


def test_components_can_be_turned_off() -> None:
    off = {"enabled": False}
    parts = ("operator", "ingest", "migrate", "purge", "sweeper", "crds")
    assert render(dict.fromkeys(parts, off)) == []


def _dsn_refs(obj: dict[str, Any]) -> list[dict[str, str]]:
    return [
        e["valueFrom"]["secretKeyRef"]
        for pod in pod_specs(obj)
        for c in pod["containers"]
        for e in c["env"]
        if e["name"] == "INTURN_DSN"
    ]


def test_each_component_takes_its_own_dsn_secret_or_the_shared_one() -> None:
    own = {
        "ingest": {"existingSecret": "db-ingest"},
        "operator": {"existingSecret": "db-operator", "key": "uri"},
        "worker": {"existingSecret": "db-worker"},
        "purge": {"existingSecret": "db-purge"},
        "sweeper": {"existingSecret": "db-sweeper"},
    }
    objs = render({"database": {"components": own}, "sweeper": {"enabled": True}})
    expected = {
        ("Deployment", "inturn-ingest"): {"name": "db-ingest", "key": "dsn"},
        ("Deployment", "inturn-operator"): {"name": "db-operator", "key": "uri"},
        ("CronJob", "inturn-purge"): {"name": "db-purge", "key": "dsn"},
        ("CronJob", "inturn-sweeper"): {"name": "db-sweeper", "key": "dsn"},
        ("Job", "inturn-migrate"): {"name": "inturn-db", "key": "dsn"},  # falls back
    }
    for (kind, name), ref in expected.items():
        assert _dsn_refs(find(objs, kind, name)) == [ref], name
    # workers get the worker Secret by name (the operator never reads it)
    args = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--dsn-secret=db-worker" in args and "--dsn-secret-key=dsn" in args


def test_migrate_hook_creates_roles_when_asked() -> None:
    (c,) = find(render(), "Job", "inturn-migrate")["spec"]["template"]["spec"]["containers"]
    assert "args" not in c
    objs = render({"database": {"roles": {"create": True, "prefix": "pacs_"}}})
    (c,) = find(objs, "Job", "inturn-migrate")["spec"]["template"]["spec"]["containers"]
    assert c["command"] + c["args"] == [
        "inturn",
        "migrate",
        "--create-roles",
        "--role-prefix=pacs_",
    ]
    with pytest.raises(helm.HelmValuesError, match="prefix"):
        render({"database": {"roles": {"prefix": "Bad-Prefix"}}})


# --- network policies ---------------------------------------------------------------------------

POSTGRES_ANYWHERE = {"ports": [{"protocol": "TCP", "port": 5432}]}
DNS = {
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
}
MONITORING_NS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
}


def _policies(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
        for o in of_kind(objs, "NetworkPolicy")
    }


def test_network_policies_by_default_close_everything_but_what_is_served() -> None:
    policies = _policies(render())
    assert set(policies) == {
        ("inturn", "inturn-ingest"),
        ("inturn", "inturn-operator"),
        ("inturn", "inturn-jobs"),
    }  # cluster-wide operator, no namespaces named: no worker policy (README says so)
    for spec in policies.values():
        assert spec["policyTypes"] == ["Ingress", "Egress"]
    ingest = policies[("inturn", "inturn-ingest")]
    assert ingest["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ingest"
    # no senders configured: the MLLP ports are reachable from nowhere; ops from monitoring
    assert ingest["ingress"] == [
        {"from": [MONITORING_NS], "ports": [{"protocol": "TCP", "port": 9090}]}
    ]
    assert ingest["egress"] == [POSTGRES_ANYWHERE, DNS]
    operator = policies[("inturn", "inturn-operator")]
    assert operator["ingress"] == [
        {
            "from": [MONITORING_NS],
            "ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 9090}],
        }
    ]
    assert operator["egress"] == [
        POSTGRES_ANYWHERE,
        DNS,
        {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
    ]
    jobs = policies[("inturn", "inturn-jobs")]
    assert jobs["ingress"] == [] and jobs["egress"] == [POSTGRES_ANYWHERE, DNS]
    assert jobs["podSelector"]["matchExpressions"] == [
        {
            "key": "app.kubernetes.io/component",
            "operator": "In",
            "values": ["migrate", "purge", "sweeper"],
        }
    ]
    assert not of_kind(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_worker_policies_in_each_destination_namespace_leave_receivers_open() -> None:
    policies = _policies(render(files=["namespaced"]))
    for ns in ("ward-a", "ward-b"):
        spec = policies[(ns, "inturn-workers")]
        assert spec["podSelector"] == {
            "matchLabels": {
                "app.kubernetes.io/name": "inturn-worker",
                "app.kubernetes.io/managed-by": "inturn-operator",
            }
        }
        assert spec["ingress"] == [
            {"from": [MONITORING_NS], "ports": [{"protocol": "TCP", "port": 8080}]}
        ]
        assert spec["egress"] == [POSTGRES_ANYWHERE, DNS, {}]  # {}: receivers anywhere


def test_network_policy_rules_follow_their_values() -> None:
    policies = _policies(render(files=["ingest-secure"]))
    postgres = {
        "ports": [{"protocol": "TCP", "port": 5432}],
        "to": [{"ipBlock": {"cidr": "10.40.0.5/32"}}],
    }
    prometheus = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ingest = policies[("inturn", "inturn-ingest")]
    assert ingest["ingress"] == [
        {
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "his"}}},
                {"ipBlock": {"cidr": "10.20.0.0/16"}},
            ],
            "ports": [
                {"protocol": "TCP", "port": 2575},
                {"protocol": "TCP", "port": 2576},
                {"protocol": "TCP", "port": 8443},
            ],
        },
        {"from": [MONITORING_NS, prometheus], "ports": [{"protocol": "TCP", "port": 9090}]},
    ]
    assert ingest["egress"] == [postgres, DNS]
    workers = policies[("ward-a", "inturn-workers")]
    assert workers["egress"] == [
        postgres,
        DNS,
        {
            "to": [{"ipBlock": {"cidr": "10.30.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 2575}],
        },
    ]
    # no monitoring at all: no ingress rule is rendered (an empty "from" would admit anyone)
    closed = _policies(render({"networkPolicy": {"monitoring": {"namespaces": []}}}))
    assert closed[("inturn", "inturn-ingest")]["ingress"] in (None, [])
    assert closed[("inturn", "inturn-operator")]["ingress"] in (None, [])


# --- secrets: each component only its own --------------------------------------------------------


def _secrets_used(pod: dict[str, Any]) -> set[str]:
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for c in pod["containers"] + pod.get("initContainers", []):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        names.update(e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e)
    return names


def test_each_component_references_only_the_secrets_it_needs() -> None:
    own = {c: {"existingSecret": f"db-{c}"} for c in ("ingest", "operator", "purge", "sweeper")}
    objs = render(
        {"database": {"components": own}, "sweeper": {"enabled": True}},
        files=["ingest-secure"],
    )
    expected = {
        "inturn-ingest": {"db-ingest", "inturn-ingest-tls", "inturn-ingest-credentials"},
        "inturn-operator": {"db-operator"},
        "inturn-purge": {"db-purge"},
        "inturn-sweeper": {"db-sweeper"},
        "inturn-migrate": {"inturn-db"},
    }
    used = {o["metadata"]["name"]: _secrets_used(p) for o in objs for p in pod_specs(o)}
    assert used == expected


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_operator_service_account_cannot_read_secrets(name: str) -> None:
    """Follow every binding whose subject is the operator's service account to its role."""
    objs = render(files=_files(name))
    roles = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o for o in objs}
    bound = 0
    for binding in of_kind(objs, "ClusterRoleBinding", "RoleBinding"):
        subjects = binding["subjects"]
        if {"kind": "ServiceAccount", "name": "inturn-operator", "namespace": "inturn"} not in (
            subjects
        ):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles[(ref["kind"], ref["name"], namespace)]
        assert "aggregationRule" not in role
        for (group, resource), verbs in _grants(role).items():
            assert group != "" or resource not in ("secrets", "*"), (resource, verbs)
        bound += 1
    assert bound >= 1


def test_monitoring_is_off_by_default() -> None:
    assert not [o for o in render() if o["apiVersion"] == PROMETHEUS_OPERATOR]


def test_monitoring_objects() -> None:
    objs = render(files=["monitoring"])
    sm = find(objs, "ServiceMonitor", "inturn-ingest")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"] == [{"port": "ops", "path": "/metrics", "interval": "30s"}]
    ops = find(objs, "Service", "inturn-ingest-ops")
    assert sm["spec"]["selector"]["matchLabels"].items() <= ops["metadata"]["labels"].items()
    assert "ops" in {p["name"] for p in ops["spec"]["ports"]}

    op_pm = find(objs, "PodMonitor", "inturn-operator")
    operator = find(objs, "Deployment", "inturn-operator")["spec"]["template"]
    assert (
        op_pm["spec"]["selector"]["matchLabels"].items() <= operator["metadata"]["labels"].items()
    )
    (c,) = operator["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    assert "--metrics=0.0.0.0:9090" in c["args"]
    assert op_pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"

    workers = find(objs, "PodMonitor", "inturn-workers")
    assert workers["spec"]["namespaceSelector"] == {"any": True}
    assert workers["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "inturn-worker",
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "inturn",
    }
    assert workers["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    namespaced = render(files=["namespaced", "monitoring"])
    assert find(namespaced, "PodMonitor", "inturn-workers")["spec"]["namespaceSelector"] == {
        "matchNames": ["ward-a", "ward-b"]
    }

    rule = find(objs, "PrometheusRule", "inturn")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts:
        by_name.setdefault(alert["alert"], []).append(alert)
    assert sorted(by_name) == [
        "InturnCronJobNoRecentSuccess",
        "InturnDeliveryFailures",
        "InturnDestinationHeld",
        "InturnHistoryDayNotTurned",
        "InturnHistoryDropOverdue",
        "InturnOldestPendingTooOld",
        "InturnOperatorReconcileErrors",
        "InturnWorkerNotReady",
    ]
    # the history's maintenance, from ingest's gauges (issue 37)
    for name, gauge in (
        ("InturnHistoryDayNotTurned", "inturn_history_epoch_overdue_seconds"),
        ("InturnHistoryDropOverdue", "inturn_history_drop_overdue_seconds"),
    ):
        (late,) = by_name[name]
        assert late["expr"] == f"max by (namespace) ({gauge}) > 3600"
    (oldest,) = by_name["InturnOldestPendingTooOld"]
    assert oldest["expr"].startswith("max by (namespace, destination) (inturn_queue_oldest_age")
    assert oldest["expr"].endswith("> 900")
    (held,) = by_name["InturnDestinationHeld"]
    assert held["expr"] == "max by (namespace, destination) (inturn_destination_held) == 1"
    assert held["for"] == "1h"
    (failures,) = by_name["InturnDeliveryFailures"]
    assert "increase(inturn_gave_up_total[15m])" in failures["expr"]
    (errors,) = by_name["InturnOperatorReconcileErrors"]
    assert "inturn_operator_reconcile_errors_total" in errors["expr"]
    assert errors["for"] == "15m"
    (not_ready,) = by_name["InturnWorkerNotReady"]
    assert "kube_deployment_status_replicas_available" in not_ready["expr"]
    crons = {a["labels"]["cronjob"]: a["expr"] for a in by_name["InturnCronJobNoRecentSuccess"]}
    assert crons == {
        "inturn-purge": 'time() - kube_cronjob_status_last_successful_time{namespace="inturn",'
        ' cronjob="inturn-purge"} > 3600',
        "inturn-sweeper": 'time() - kube_cronjob_status_last_successful_time{namespace="inturn",'
        ' cronjob="inturn-sweeper"} > 1800',
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    # the sweeper's alert goes with the sweeper (on by default)
    only_rules = render(
        {"monitoring": {"prometheusRule": {"enabled": True}}, "sweeper": {"enabled": False}}
    )
    rule = find(only_rules, "PrometheusRule", "inturn")
    crons_default = [
        r["labels"]["cronjob"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if r["alert"] == "InturnCronJobNoRecentSuccess"
    ]
    assert crons_default == ["inturn-purge"]


def test_sweeper_gets_the_reservation_settings() -> None:
    cron = find(render(files=["sweeper"]), "CronJob", "inturn-sweeper")
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: v for k, v in env.items() if k.startswith("INTURN_SWEEP_")} == {
        "INTURN_SWEEP_PENDING_AFTER": "4h",
        "INTURN_SWEEP_TICKETING_LEAD": "24h",
        "INTURN_SWEEP_AUTO_CANCEL": "true",
        "INTURN_SWEEP_HOST_CARRIERS": "LH OS",
    }


def test_ingest_declares_the_feeds_of_its_values() -> None:
    feeds = [
        {"channel": "adt", "silentAfterSeconds": 1800, "perSender": True},
        {
            "channel": "lab",
            "silentAfterSeconds": 600,
            "schedule": {
                "timeZone": "Europe/Berlin",
                "windows": [{"days": ["Mon", "Fri"], "start": "06:00", "end": "20:00"}],
            },
        },
    ]
    objs = render({"ingest": {"feeds": feeds, "feedFlushSeconds": 10}})
    pod = find(objs, "Deployment", "inturn-ingest")["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert "--feeds=/etc/inturn/feeds/feeds.yaml" in c["args"]
    assert "--feed-flush-seconds=10" in c["args"]
    assert {"name": "feeds", "mountPath": "/etc/inturn/feeds", "readOnly": True} in c[
        "volumeMounts"
    ]
    cm = find(objs, "ConfigMap", "inturn-ingest-feeds")
    declared = parse_feeds(yaml.safe_load(cm["data"]["feeds.yaml"]))
    assert [(f.channel, f.per_sender, f.schedule is not None) for f in declared] == [
        ("adt", True, False),
        ("lab", False, True),
    ]
    # a changed declaration rolls the pods (ingest declares at start)
    other = render({"ingest": {"feeds": feeds[:1]}})
    annotation = "inturn.dev/feeds-checksum"
    rolled = find(other, "Deployment", "inturn-ingest")["spec"]["template"]["metadata"]
    assert rolled["annotations"][annotation] != pod["metadata"]["annotations"][annotation]
    # none declared by default: an empty list, which declares none
    default = find(render(), "ConfigMap", "inturn-ingest-feeds")
    assert parse_feeds(yaml.safe_load(default["data"]["feeds.yaml"])) == []
    with pytest.raises(Exception, match="silentAfterSeconds"):
        render({"ingest": {"feeds": [{"channel": "adt", "silentAfterSeconds": 5}]}})


def test_encryption_secret_is_mounted_where_payloads_are_stored_or_read() -> None:
    objs = render(
        {"encryption": {"secretName": "inturn-payload-keys"}, "console": {"enabled": True}}
    )
    for name in ("inturn-ingest", "inturn-console"):
        pod = find(objs, "Deployment", name)["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert env["INTURN_PAYLOAD_KEYS"]["value"] == "/etc/inturn/payload-keys"
        assert env["INTURN_KEY_DSN"]["valueFrom"]["secretKeyRef"] == {
            "name": "inturn-keys",
            "key": "dsn",
        }
        assert {
            "name": "payload-keys",
            "mountPath": "/etc/inturn/payload-keys",
            "readOnly": True,
        } in c["volumeMounts"]
        assert any(
            v.get("secret", {}).get("secretName") == "inturn-payload-keys" for v in pod["volumes"]
        )
    (op,) = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]["containers"]
    assert "--payload-keys-secret=inturn-payload-keys" in op["args"]
    off = render()
    assert "INTURN_PAYLOAD_KEYS" not in str(off) and "payload-keys-secret" not in str(off)


def test_watching_the_whole_cluster_the_operator_makes_each_workers_network_policy() -> None:
    """No namespace is known to the chart: the operator gets the workers' NetworkPolicy peers
    (the chart's own monitoring, Postgres, DNS and receivers values) and makes one per
    Destination; with namespaces listed the chart makes them and the operator none."""
    import json

    args = find(render(), "Deployment", "inturn-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    [flag] = [a for a in args if a.startswith("--worker-network-policy=")]
    peers = json.loads(flag.split("=", 1)[1])
    assert peers["postgresPort"] == 5432 and peers["receivers"] == []
    assert peers["monitoring"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert peers["dnsTo"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }
    namespaced = find(render(files=["namespaced"]), "Deployment", "inturn-operator")
    args = namespaced["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--worker-network-policy")]
    off = find(render({"networkPolicy": {"enabled": False}}), "Deployment", "inturn-operator")
    args = off["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--worker-network-policy")]
