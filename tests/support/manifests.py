"""Destination manifests as the Kubernetes API hands them over (plain dicts), for the tests of
the manifest's schema, its CEL twins and the worker configuration rendered from it."""

from __future__ import annotations

from typing import Any


def mllp(host: str = "10.0.0.5", port: int = 2575) -> dict[str, Any]:
    """The ``spec.sender`` node of an MLLP receiver at ``host``:``port``."""
    return {"mllp": {"host": host, "port": port}}


def destination(
    name: str = "lis",
    namespace: str = "ward",
    *,
    channel: str = "adt",
    sender: dict[str, Any] | None = None,
    max_attempts: int = 3,
    **spec: Any,
) -> dict[str, Any]:
    """A new Destination ``namespace/name`` on ``channel``: ``sender`` (default :func:`mllp`),
    given up after ``max_attempts`` (0: never), and more ``spec`` fields as given (their
    camelCase names: ``filter``, ``schedule``, ``throttle``, ...). Each call builds new dicts,
    so a test may change what it gets."""
    return {
        "apiVersion": "inturn.dev/v1alpha1",
        "kind": "Destination",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "channel": channel,
            "sender": sender or mllp(),
            "retry": {"maxAttempts": max_attempts},
            **spec,
        },
    }
