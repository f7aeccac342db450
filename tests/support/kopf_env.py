"""The operator under test: kopf's KopfRunner against the kmock Kubernetes emulator (with the
metadata a real API server keeps) and a real Postgres; shared by the operator's test modules."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kopf.testing import KopfRunner

from inturn.worker.spec import schema

ROOT = Path(__file__).resolve().parents[2]


class ApiServerLikeEmulator(kmock.KubernetesEmulator):
    """kmock plus the metadata a real API server maintains, which kopf relies on.

    On create: ``uid`` (kopf's indices tell objects apart by it), ``resourceVersion``,
    ``generation`` and ``creationTimestamp``. On a merge patch: a new ``resourceVersion``, and
    ``generation`` + 1 when ``spec`` changes outside the ``status`` subresource.
    """

    _versions = itertools.count(1000)

    async def _handle(self, request: Any) -> Any:
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
                meta["resourceVersion"] = str(next(self._versions))
            elif request.action == kmock.action.UPDATE and request.name is not None:
                meta["resourceVersion"] = str(next(self._versions))
                key = (request.resource, request.namespace, request.name)
                if "spec" in data and request.subresource is None and key in self.objects:
                    current = self.objects[key]
                    if not current.deleted:
                        old = current.raw.get("metadata", {}).get("generation", 1)
                        meta["generation"] = int(old) + 1
        return await super()._handle(request)


DEST = "inturn.dev/v1alpha1/destinations"
DEPLOY = "apps/v1/deployments"
CM = "v1/configmaps"
EVENTS = "v1/events"
NS = "ward"
IMAGE = "ghcr.io/example/inturn:test"


def destination(name: str, example: str = "local-mllp.yaml", generation: int = 1) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["metadata"] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "generation": generation,
        "resourceVersion": "1",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    return doc


def prepare(emulator: kmock.KubernetesEmulator) -> None:
    """Declare the resources kopf needs to start watching, and the namespace."""
    emulator.resources.load_bundled()
    emulator.resources[DEST] = {
        "kind": "Destination",
        "singular": "destination",
        "namespaced": True,
        "verbs": {"get", "list", "watch", "patch", "create", "delete", "update"},
        "shortnames": {"dest"},
        "subresources": {"status"},
    }
    emulator.objects["apiextensions.k8s.io/v1/customresourcedefinitions", None, schema.CRD_NAME] = (
        schema.crd()
    )
    emulator.objects["v1/namespaces", None, NS] = {"metadata": {"name": NS}}


@pytest.fixture
def env(
    kmock: kmock.KubernetesEmulator, fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> kmock.KubernetesEmulator:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "kmock", "user": {"token": "t"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setenv("INTURN_WORKER_IMAGE", IMAGE)
    monkeypatch.setenv("INTURN_DSN", fresh_db)
    monkeypatch.setenv("INTURN_STATUS_INTERVAL", "1")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    prepare(kmock)
    return kmock


@contextlib.asynccontextmanager
async def operator() -> AsyncIterator[KopfRunner]:
    """Run the operator in a thread; stop it without blocking the emulator's event loop."""
    runner = KopfRunner(
        ["run", "--standalone", "--all-namespaces", "--verbose", "-m", "inturn.operator.handlers"],
        timeout=60,
    )
    runner.__enter__()
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


async def eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll ``check`` until it returns a truthy value (or its assertion passes)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (AssertionError, KeyError, ValueError, TypeError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {check}")
        await asyncio.sleep(0.1)


def obj(emulator: kmock.KubernetesEmulator, resource: str, name: str) -> dict[str, Any]:
    found = emulator.objects[resource, NS, name]
    assert not found.deleted
    return dict(found.raw)
