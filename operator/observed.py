"""What the operator sees of the cluster, as plain data: the Destination snapshot and the
summaries of its children kept in kopf's indices, the drift a worker Deployment must never
have (and the patch that reverts it), and whether kopf peering pauses this operator. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from inturn.operator import manifests
from inturn.worker.spec import schema

Key = tuple[str, str]  # (namespace, name)

#: kopf's peering resources (kopf.dev/v1).
PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"


@dataclass(frozen=True)
class ChildState:
    """A child object as last seen on the watch (the value kept in kopf's indices)."""

    name: str
    spec_hash: str | None
    data_hash: str | None = None
    replicas: int | None = None
    strategy: str | None = None
    available: bool = False


def plain(value: Any) -> Any:
    """Deep-copy a kopf body (mapping views) into plain dicts and lists.

    Iterative, not recursive: a Destination stored nested deeper than the interpreter's stack
    is copied, then refused by validation (:func:`inturn.worker.spec.documents.check_shape`) as
    an invalid spec, instead of ending the reconcile in a ``RecursionError``.
    """

    def empty(item: Any) -> Any:
        if isinstance(item, Mapping):
            return {}
        if isinstance(item, list | tuple):
            return []
        return item

    root = empty(value)
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        if isinstance(source, Mapping):
            for k, v in source.items():
                target[str(k)] = copied = empty(v)
                if copied is not v:
                    stack.append((v, copied))
        elif isinstance(source, list | tuple):
            for v in source:
                target.append(copied := empty(v))
                if copied is not v:
                    stack.append((v, copied))
    return root


def destination_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return the parts of a Destination body the operator uses, as plain data."""
    meta = body.get("metadata", {})
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {
            k: plain(meta[k])
            for k in ("name", "namespace", "uid", "generation", "deletionTimestamp")
            if k in meta
        },
        "spec": plain(body.get("spec") or {}),
        "status": plain(body.get("status") or {}),
    }


def deployment_state(body: Mapping[str, Any]) -> ChildState:
    """Summarise a worker Deployment: hash annotation, replicas, strategy, availability."""
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    st = body.get("status") or {}
    generation = meta.get("generation")
    current = generation is None or st.get("observedGeneration", 0) >= generation
    return ChildState(
        name=str(meta.get("name")),
        spec_hash=(meta.get("annotations") or {}).get(manifests.SPEC_HASH_ANNOTATION),
        replicas=spec.get("replicas"),
        strategy=(spec.get("strategy") or {}).get("type"),
        available=bool(current and (st.get("availableReplicas") or 0) >= 1),
    )


def configmap_state(body: Mapping[str, Any]) -> ChildState:
    """Summarise a worker ConfigMap: hash annotation and a hash of its data."""
    meta = body.get("metadata", {})
    return ChildState(
        name=str(meta.get("name")),
        spec_hash=(meta.get("annotations") or {}).get(manifests.SPEC_HASH_ANNOTATION),
        data_hash=manifests.digest(plain(body.get("data") or {})),
    )


def drift_of(state: ChildState) -> list[str]:
    """Return what is wrong with a worker Deployment that must always hold (empty: nothing)."""
    problems = []
    if state.replicas != 1:
        problems.append(f"replicas {state.replicas} (must be 1)")
    if state.strategy != "Recreate":
        problems.append(f"strategy {state.strategy} (must be Recreate)")
    return problems


#: Merge patch restoring the invariants of a worker Deployment (rollingUpdate must go too).
REVERT_PATCH: dict[str, Any] = {
    "spec": {"replicas": 1, "strategy": {"type": "Recreate", "rollingUpdate": None}}
}


def peering_paused(peers: Mapping[str, Any], identity: str, priority: int, now: datetime) -> bool:
    """Return whether another live peer outranks (or ties) this operator, as kopf decides.

    ``peers`` is the ``status`` of a KopfPeering object: ``{identity: {priority, lastseen,
    lifetime}}``. A tie pauses everyone, as in kopf (equal priorities freeze).
    """
    for other, info in peers.items():
        if other == identity or not isinstance(info, Mapping):
            continue
        try:
            seen = datetime.fromisoformat(str(info.get("lastseen")))
        except ValueError:
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=UTC)
        if seen + timedelta(seconds=int(info.get("lifetime", 60))) <= now:
            continue  # dead
        if int(info.get("priority", 0)) >= priority:
            return True
    return False
