"""Pure rendering: one Destination in, its worker's ConfigMap and Deployment out.

No I/O and no kopf: the handlers call :func:`render` and apply what it returns. Everything here is
deterministic (same Destination, same settings → byte-identical objects), which is what makes
create, update, resume and the periodic reconcile converge on the same state, and what lets the
operator detect drift by comparing hashes instead of reading whole objects back.

Conventions followed (sources):

* labels ``app.kubernetes.io/*`` (kubernetes.io/docs/concepts/overview/working-with-objects/
  common-labels); the selector uses only the immutable name + instance labels;
* an owner reference with ``controller: true`` to the Destination, so that the garbage collector
  removes the children when the Destination goes (no finalizer needed);
* the ``restricted`` Pod Security Standard (non-root, no privilege escalation, all capabilities
  dropped, ``RuntimeDefault`` seccomp) plus a read-only root filesystem with ``/tmp`` in an
  ``emptyDir``;
* ``replicas: 1`` and ``strategy: Recreate``: a rollout stops the old worker before the new one
  starts (the worker's advisory lock makes a rare overlap harmless, not this).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inturn.worker.senders import registry as senders
from inturn.worker.spec import schema
from inturn.worker.spec.destination import (
    DEFAULT_SECRETS_DIR,
    destination_key,
    render_from_manifest,
    validate_manifest,
)

#: Annotation/label prefix owned by the operator.
PREFIX = schema.GROUP
#: Value of ``app.kubernetes.io/managed-by`` on every child; the drift watch filters on it.
MANAGED_BY = "inturn-operator"
#: Label naming the owning Destination on every child (value: its name).
DESTINATION_LABEL = f"{PREFIX}/destination"
#: Pod template annotation: hash of the rendered worker configuration (a change rolls the pod).
CONFIG_HASH_ANNOTATION = f"{PREFIX}/config-hash"
#: Child annotation: hash of the whole desired child object (drift detection without reads).
SPEC_HASH_ANNOTATION = f"{PREFIX}/spec-hash"

CONFIG_KEY = "worker.json"
CONFIG_PATH = f"/etc/inturn/{CONFIG_KEY}"
#: Where a worker pod serves /healthz, /readyz and /metrics: every interface of the pod.
WORKER_HTTP_HOST = "0.0.0.0"
CONTAINER_NAME = "worker"

DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}


@dataclass(frozen=True)
class WorkerPodSettings:
    """Operator-wide settings of every worker pod (from the operator's command line / chart).

    Attributes:
        image: the inturn container image (the same image runs operator and workers).
        image_pull_policy: ``IfNotPresent``, ``Always`` or ``Never``.
        dsn_secret_name, dsn_secret_key: the Secret (in each Destination's namespace) and key
            holding the Postgres DSN, given to the worker as ``INTURN_DSN`` by ``secretKeyRef``.
        service_account_name: service account of worker pods (None: the namespace default);
            worker pods never mount an API token.
        image_pull_secrets: names of image pull Secrets.
        http_port: the worker's HTTP port (``/healthz``, ``/readyz``, ``/metrics``).
        log_json: start workers with ``--log-json``.
        run_as_user: the non-root UID (and GID, fsGroup) of the worker container.
        secrets_dir: where referenced Secrets are mounted (``<dir>/<secret>/<key>``).
        env: extra environment variables of every worker, ``(name, value)`` (the worklist
            publishers' ``INTURN_WORKLIST_*``).
        secret_env: extra environment variables from Secrets in the Destination's namespace,
            ``(name, secret, key)`` (e.g. the worklist webhook's HMAC key).
        payload_keys_secret: the Secret of master keys (one key per master key ID) mounted
            as a folder at :data:`PAYLOAD_KEYS_DIR` and named by ``INTURN_PAYLOAD_KEYS``: the
            worker opens encrypted payloads (None: encryption off).
        key_dsn_secret, key_dsn_secret_key: the Secret and key of the key store's DSN, given
            as ``INTURN_KEY_DSN`` (with ``payload_keys_secret``).
        network_policy: the worker NetworkPolicy's peers (``--worker-network-policy``, see
            :func:`network_policy`), or None: the operator makes none (the chart makes one per
            watched namespace instead).
        worker_logins: ``shared`` (every worker logs in as the DSN's user) or
            ``per-destination`` (each worker as its destination's own login, from the Secret
            :func:`login_secret_name` names: ``INTURN_DB_USER`` and ``INTURN_DB_PASSWORD``;
            docs/explanation/security.md, "One login per destination").
    """

    image: str
    image_pull_policy: str = "IfNotPresent"
    dsn_secret_name: str = "inturn-db"
    dsn_secret_key: str = "dsn"
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    http_port: int = 8080
    log_json: bool = True
    run_as_user: int = 10001
    secrets_dir: str = DEFAULT_SECRETS_DIR
    env: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[tuple[str, str, str], ...] = ()
    payload_keys_secret: str | None = None
    key_dsn_secret: str = "inturn-keys"
    key_dsn_secret_key: str = "dsn"
    worker_logins: str = "shared"
    network_policy: Mapping[str, Any] | None = None


#: How worker pods log in to Postgres (:attr:`WorkerPodSettings.worker_logins`).
WORKER_LOGINS = ("shared", "per-destination")
#: The keys of a destination's login Secret.
LOGIN_USER_KEY = "user"
LOGIN_PASSWORD_KEY = "password"


#: The keys ``--worker-network-policy`` takes (each optional): who may scrape a worker's HTTP
#: port, where Postgres and DNS are, and the receivers' egress rules (empty: any address).
NETWORK_POLICY_KEYS = ("monitoring", "postgresPort", "postgresTo", "dnsTo", "receivers")


def parse_network_policy(text: str | None) -> dict[str, Any] | None:
    """The ``--worker-network-policy`` JSON object, checked for its keys and shapes.

    Raises:
        ValueError: not a JSON object, an unknown key, or a value of the wrong shape.
    """
    if not text:
        return None
    from inturn.worker.spec.documents import load_json

    try:
        value = load_json(text)
    except ValueError as exc:
        raise ValueError(f"--worker-network-policy: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("--worker-network-policy: a JSON object")
    unknown = sorted(set(value) - set(NETWORK_POLICY_KEYS))
    if unknown:
        raise ValueError(f"--worker-network-policy: unknown key(s) {', '.join(unknown)}")
    for key in ("monitoring", "postgresTo", "dnsTo", "receivers"):
        if not isinstance(value.get(key, []), list):
            raise ValueError(f"--worker-network-policy: {key} is a list")
    port = value.get("postgresPort", 5432)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError("--worker-network-policy: postgresPort is a port number")
    return value


def network_policy(body: Mapping[str, Any], settings: WorkerPodSettings) -> dict[str, Any] | None:
    """The NetworkPolicy of a Destination's worker pods (``<name>-worker``, owned by the
    Destination), when the operator is told to make one: in from the monitoring peers to the
    HTTP port (health and metrics) only; out to Postgres, DNS and the receivers (any address
    unless ``receivers`` narrows it: receivers are anywhere). Kubernetes API conventions:
    ``networking.k8s.io/v1`` (an empty ``from`` would admit everyone, so no ingress rule is
    written without peers)."""
    peers = settings.network_policy
    if peers is None:
        return None
    meta = body["metadata"]
    postgres: dict[str, Any] = {
        "ports": [{"protocol": "TCP", "port": int(peers.get("postgresPort", 5432))}]
    }
    if peers.get("postgresTo"):
        postgres["to"] = list(peers["postgresTo"])
    dns: dict[str, Any] = {
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    }
    if peers.get("dnsTo"):
        dns["to"] = list(peers["dnsTo"])
    monitoring = list(peers.get("monitoring") or [])
    obj: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": child_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": labels(meta["name"]),
            "ownerReferences": [owner_reference(body)],
        },
        "spec": {
            "podSelector": {"matchLabels": selector_labels(meta["name"])},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": (
                [
                    {
                        "from": monitoring,
                        "ports": [{"protocol": "TCP", "port": settings.http_port}],
                    }
                ]
                if monitoring
                else []
            ),
            "egress": [postgres, dns, *(list(peers.get("receivers") or []) or [{}])],
        },
    }
    return _with_spec_hash(obj)


def login_secret_name(name: str) -> str:
    """The Secret holding a Destination's own worker login (``<name>-worker-login``), in the
    Destination's namespace and owned by it."""
    return f"{child_name(name)}-login"


def login_secret(destination: Mapping[str, Any], user: str, password: str) -> dict[str, Any]:
    """The Secret of ``destination``'s own worker login: ``user`` and ``password`` (the clear
    password the worker gives Postgres; the database holds only its SCRAM verifier), owned by
    the Destination so that the API server's garbage collector deletes it with it."""
    meta = destination["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": login_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": labels(meta["name"]),
            "ownerReferences": [owner_reference(destination)],
        },
        "stringData": {LOGIN_USER_KEY: user, LOGIN_PASSWORD_KEY: password},
    }


#: Where a worker finds its master keys (``INTURN_PAYLOAD_KEYS``), when encryption is on.
PAYLOAD_KEYS_DIR = "/etc/inturn/payload-keys"

#: Variables the operator sets itself and that ``--worker-env`` may not replace.
_RESERVED_ENV = (
    "INTURN_DSN",
    "INTURN_WORKER_RUNTIME",
    "INTURN_PAYLOAD_KEYS",
    "INTURN_KEY_DSN",
    "INTURN_DB_USER",
    "INTURN_DB_PASSWORD",
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_worker_env(
    plain: Sequence[str], secret: Sequence[str]
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, str], ...]]:
    """Parse ``NAME=VALUE`` and ``NAME=SECRET/KEY`` items for :class:`WorkerPodSettings`.

    Raises:
        ValueError: a malformed item, a bad variable name, or a variable the operator sets
            itself (``INTURN_DSN``).
    """

    def name_of(item: str) -> tuple[str, str]:
        name, sep, rest = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise ValueError(f"{item!r}: expected NAME=VALUE with NAME a variable name")
        if name in _RESERVED_ENV:
            raise ValueError(f"{name} is set by the operator itself")
        return name, rest

    env = tuple(name_of(item) for item in plain)
    refs: list[tuple[str, str, str]] = []
    for item in secret:
        name, rest = name_of(item)
        secret_name, sep, key = rest.partition("/")
        if not sep or not secret_name or not key:
            raise ValueError(f"{item!r}: expected NAME=SECRET/KEY")
        refs.append((name, secret_name, key))
    return env, tuple(refs)


@dataclass(frozen=True)
class Children:
    """What one Destination renders to.

    Attributes:
        key: ``namespace/name`` (the queue key).
        config_map, deployment: complete objects, ready to create or apply.
        config_hash: hash of the rendered worker configuration.
        worker_config: the rendered worker configuration (JSON object).
        spec: the Destination's spec with schema defaults applied.
    """

    key: str
    config_map: dict[str, Any]
    deployment: dict[str, Any]
    config_hash: str
    worker_config: dict[str, Any] = field(repr=False)
    spec: dict[str, Any] = field(repr=False)
    network_policy: dict[str, Any] | None = field(default=None, repr=False)


def child_name(name: str) -> str:
    """Return the fixed name of a Destination's ConfigMap and Deployment: ``<name>-worker``."""
    return f"{name}-worker"


def selector_labels(name: str) -> dict[str, str]:
    """Return the immutable selector labels of a Destination's worker pods."""
    return {"app.kubernetes.io/name": "inturn-worker", "app.kubernetes.io/instance": name}


def labels(name: str) -> dict[str, str]:
    """Return the labels of every child object (and the worker pods) of Destination ``name``."""
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "inturn",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        DESTINATION_LABEL: name,
    }


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return the controller owner reference to a Destination (``metadata.uid`` required).

    ``blockOwnerDeletion`` lets foreground deletion wait for the children; it needs the operator
    to be allowed to update ``destinations/finalizers`` (the chart grants it).
    """
    meta = body["metadata"]
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def digest(value: Any, length: int = 16) -> str:
    """Return the first ``length`` hex digits of SHA-256 over canonical JSON of ``value``."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _with_spec_hash(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = digest(obj)
    return obj


def config_map(
    body: Mapping[str, Any], worker_config: Mapping[str, Any], config_text: str
) -> dict[str, Any]:
    """Return the worker's ConfigMap: ``data["worker.json"]`` = the rendered configuration."""
    meta = body["metadata"]
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": child_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": labels(meta["name"]),
            "annotations": {f"{PREFIX}/destination": str(worker_config["destination"])},
            "ownerReferences": [owner_reference(body)],
        },
        "data": {CONFIG_KEY: config_text},
    }
    return _with_spec_hash(obj)


def _resources(spec: Mapping[str, Any]) -> dict[str, Any]:
    wanted = (spec.get("worker") or {}).get("resources") or {}
    return {
        part: dict(wanted[part]) if wanted.get(part) else dict(DEFAULT_RESOURCES[part])
        for part in ("requests", "limits")
    }


#: Seconds a worker pod stays bound to a node that stopped reporting (``unreachable``) or is not
#: ready, before Kubernetes evicts it and the Deployment starts a replacement elsewhere. The
#: default Kubernetes adds is 300 (taint-based evictions, DefaultTolerationSeconds admission);
#: a worker's Postgres session ends within ``SESSION_LOSS_BOUND_SECONDS`` (35 s) of losing its
#: node, so after 30 s the replacement can take over at once, and where the old pod still
#: reaches Postgres, its advisory lock keeps the replacement waiting: never two senders.
NODE_LOSS_TOLERATION_SECONDS = 30
#: The node conditions (as ``NoExecute`` taints) that evict a pod after its toleration.
NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def node_loss_tolerations(own: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The worker pod's tolerations: ``own`` (``spec.worker.tolerations``) followed by a
    ``NoExecute`` toleration of :data:`NODE_LOSS_TOLERATION_SECONDS` for each of
    :data:`NODE_LOSS_TAINTS` that ``own`` does not name (a Destination's own value wins)."""
    named = {t.get("key") for t in own}
    added = [
        {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": NODE_LOSS_TOLERATION_SECONDS,
        }
        for key in NODE_LOSS_TAINTS
        if key not in named
    ]
    return [dict(t) for t in own] + added


def termination_grace_seconds(timeout_seconds: int) -> int:
    """Grace period of a worker pod: longer than one attempt, so a rollout never cuts a send."""
    return max(30, int(timeout_seconds) + 15)


def deployment(
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    config_hash: str,
    settings: WorkerPodSettings,
) -> dict[str, Any]:
    """Return the worker Deployment of a Destination (``spec`` with defaults applied)."""
    meta = body["metadata"]
    name = meta["name"]
    secrets = senders.secret_keys(spec["sender"])
    volumes: list[dict[str, Any]] = [
        {
            "name": "config",
            "configMap": {
                "name": child_name(name),
                "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
                "defaultMode": 0o444,
            },
        },
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_PATH, "subPath": CONFIG_KEY, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    for i, secret in enumerate(sorted(secrets)):
        volume = f"secret-{i}"
        volumes.append(
            {
                "name": volume,
                "secret": {
                    "secretName": secret,
                    "items": [{"key": k, "path": k} for k in sorted(secrets[secret])],
                    "defaultMode": 0o440,
                },
            }
        )
        mounts.append(
            {"name": volume, "mountPath": f"{settings.secrets_dir}/{secret}", "readOnly": True}
        )
    encryption: list[dict[str, Any]] = []
    if settings.payload_keys_secret:
        volumes.append(
            {
                "name": "payload-keys",
                "secret": {"secretName": settings.payload_keys_secret, "defaultMode": 0o440},
            }
        )
        mounts.append({"name": "payload-keys", "mountPath": PAYLOAD_KEYS_DIR, "readOnly": True})
        encryption = [
            {"name": "INTURN_PAYLOAD_KEYS", "value": PAYLOAD_KEYS_DIR},
            {
                "name": "INTURN_KEY_DSN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": settings.key_dsn_secret,
                        "key": settings.key_dsn_secret_key,
                    }
                },
            },
        ]
    # every interface: the kubelet's probes and Prometheus reach the pod's IP (the CLI's own
    # default is loopback, for a worker run outside a pod)
    command = [
        "inturn",
        "worker",
        "--config",
        CONFIG_PATH,
        "--http-host",
        WORKER_HTTP_HOST,
        "--http-port",
        str(settings.http_port),
    ]
    if settings.log_json:
        command.append("--log-json")
    login: list[dict[str, Any]] = []
    if settings.worker_logins == "per-destination":
        secret = login_secret_name(body["metadata"]["name"])
        login = [
            {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            for env, key in (
                ("INTURN_DB_USER", LOGIN_USER_KEY),
                ("INTURN_DB_PASSWORD", LOGIN_PASSWORD_KEY),
            )
        ]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": [
            {
                "name": "INTURN_DSN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": settings.dsn_secret_name,
                        "key": settings.dsn_secret_key,
                    }
                },
            },
            *login,
            *encryption,
            *({"name": name, "value": value} for name, value in settings.env),
            *(
                {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
                for name, secret, key in settings.secret_env
            ),
        ],
        "ports": [{"name": "http", "containerPort": settings.http_port, "protocol": "TCP"}],
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 2,
            "failureThreshold": 30,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "resources": _resources(spec),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(spec["retry"]["timeoutSeconds"]),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if settings.service_account_name:
        pod["serviceAccountName"] = settings.service_account_name
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    worker = spec.get("worker") or {}
    for key in ("nodeSelector", "affinity", "priorityClassName"):
        if worker.get(key):
            pod[key] = worker[key]
    pod["tolerations"] = node_loss_tolerations(worker.get("tolerations") or ())
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": child_name(name),
            "namespace": meta["namespace"],
            "labels": labels(name),
            "annotations": {f"{PREFIX}/destination": destination_key(body)},
            "ownerReferences": [owner_reference(body)],
        },
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 3,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector_labels(name)},
            "template": {
                "metadata": {
                    "labels": labels(name),
                    "annotations": {
                        CONFIG_HASH_ANNOTATION: config_hash,
                        "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
                    },
                },
                "spec": pod,
            },
        },
    }
    return _with_spec_hash(obj)


def render(body: Mapping[str, Any], settings: WorkerPodSettings) -> Children:
    """Render a Destination (as stored by the API server) into its worker's children.

    ``body`` needs ``metadata.name``, ``metadata.namespace``, ``metadata.uid`` and ``spec``; the
    schema defaults are applied here too, so an object stored before a default was added renders
    the same as a fresh one.

    Raises:
        inturn.worker.spec.destination.ManifestError: the spec is not valid (reason
            ``InvalidSpec``).
    """
    doc = {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {k: body["metadata"][k] for k in ("name", "namespace")},
        "spec": body.get("spec"),
    }
    valid = validate_manifest(doc)
    worker_config = render_from_manifest(valid, secrets_dir=settings.secrets_dir)
    text = json.dumps(worker_config, indent=2, sort_keys=True) + "\n"
    config_hash = digest(text)
    return Children(
        key=destination_key(doc),
        config_map=config_map(body, worker_config, text),
        deployment=deployment(body, valid["spec"], config_hash, settings),
        config_hash=config_hash,
        worker_config=worker_config,
        spec=valid["spec"],
        network_policy=network_policy(body, settings),
    )


def sender_summary(spec: Mapping[str, Any]) -> str:
    """Return a one-line, credential-free description of the sender, for ``status.sender``
    (the kind's :meth:`~inturn.worker.senders.kind.SenderKind.summary`, ``none`` when unset)."""
    return senders.summary(spec.get("sender") or {})
