"""The few Kubernetes API calls the operator makes besides kopf's own, over the official client.

The synchronous ``kubernetes`` client runs in a bounded thread pool so that the event loop (and
kopf's watches) never block. Objects go in and come out as plain dicts (``_preload_content=False``),
never as generated models.

Children are applied with server-side apply (``application/apply-patch+yaml``, a fixed field
manager, ``force=True``): the operator owns every field it sets, and a re-apply takes them back
from anyone who changed them (kubernetes.io/docs/reference/using-api/server-side-apply, "Using
server-side apply in a controller"). An API server that answers 404 to an apply of a missing
object (some emulators do) gets a create instead, and a create that races another one (409) is
followed by the apply again: the outcome is the same object either way.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import kubernetes
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from inturn.worker.spec import schema

log = logging.getLogger("inturn.operator")

FIELD_MANAGER = "inturn-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"

T = TypeVar("T")


class ApiError(Exception):
    """A Kubernetes API call failed.

    Attributes:
        status: the HTTP status (0 when the server could not be reached).
        transient: worth retrying (server errors, throttling, timeouts, no connection).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API error {status}: {message}")
        self.status = status
        self.transient = status == 0 or status == 429 or status >= 500


def load_configuration(pool_size: int = 32) -> kubernetes.client.Configuration:
    """Return the client configuration: in-cluster service account, else ``$KUBECONFIG``.

    Raises:
        kubernetes.config.ConfigException: neither is available.
    """
    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except ConfigException:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg
        )
    cfg.connection_pool_maxsize = pool_size
    return cfg


class KubeApi:
    """Async facade over the synchronous client for ConfigMaps, Deployments, status and events.

    Args:
        configuration: client configuration (see :func:`load_configuration`).
        concurrency: most API calls in flight (threads).
    """

    def __init__(self, configuration: kubernetes.client.Configuration, concurrency: int = 16):
        self._client = kubernetes.client.ApiClient(configuration)
        self._core = kubernetes.client.CoreV1Api(self._client)
        self._apps = kubernetes.client.AppsV1Api(self._client)
        self._custom = kubernetes.client.CustomObjectsApi(self._client)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="inturn-kube")
        self.calls = 0  #: API calls made (for the benchmark and tests)

    def close(self) -> None:
        """Stop the threads and close the connection pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()  # type: ignore[no-untyped-call]

    async def _run(self, fn: Callable[[], Any]) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            self.calls += 1
            try:
                resp = fn()
            except ApiException as exc:
                raise ApiError(int(exc.status or 0), str(exc.reason)) from None
            except (OSError, kubernetes.client.exceptions.OpenApiException) as exc:
                raise ApiError(0, str(exc)) from None
            data = getattr(resp, "data", b"") or b"{}"
            try:
                out = json.loads(data)
            except ValueError:
                return {}
            return out if isinstance(out, dict) else {}

        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def apply(self, obj: Mapping[str, Any], *, exists: bool = True) -> str:
        """Make a ConfigMap, Deployment or NetworkPolicy exactly ``obj``: server-side apply, or
        create.

        Args:
            exists: whether the object is believed to exist. If so, apply first (and create on
                404); if not, create first (and apply on 409) — one request in the usual case.

        Returns:
            ``"applied"`` or ``"created"``.

        Raises:
            ApiError: the API refused or could not be reached.
        """
        kind = obj["kind"]
        name = obj["metadata"]["name"]
        namespace = obj["metadata"]["namespace"]
        body: Any = dict(obj)
        if kind == "ConfigMap":
            patch: Callable[[], Any] = lambda: self._core.patch_namespaced_config_map(  # noqa: E731
                name,
                namespace,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
                _preload_content=False,
            )
            create: Callable[[], Any] = lambda: self._core.create_namespaced_config_map(  # noqa: E731
                namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
            )
        elif kind == "Deployment":
            patch = lambda: self._apps.patch_namespaced_deployment(  # noqa: E731
                name,
                namespace,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
                _preload_content=False,
            )
            create = lambda: self._apps.create_namespaced_deployment(  # noqa: E731
                namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
            )
        elif kind == "NetworkPolicy":
            networking = kubernetes.client.NetworkingV1Api(self._core.api_client)
            patch = lambda: networking.patch_namespaced_network_policy(  # noqa: E731
                name,
                namespace,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
                _preload_content=False,
            )
            create = lambda: networking.create_namespaced_network_policy(  # noqa: E731
                namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
            )
        else:  # pragma: no cover - programming error
            raise ValueError(f"cannot apply a {kind}")
        if exists:
            try:
                await self._run(patch)
                return "applied"
            except ApiError as exc:
                if exc.status != 404:
                    raise
        try:
            await self._run(create)
            return "created"
        except ApiError as exc:
            if exc.status != 409:
                raise
        await self._run(patch)
        return "applied"

    async def merge_patch_deployment(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> None:
        """JSON-merge-patch a Deployment (used to revert replicas/strategy drift).

        Raises:
            ApiError: the API refused (404 when it is gone) or could not be reached.
        """
        await self._run(
            lambda: self._apps.patch_namespaced_deployment(
                name,
                namespace,
                dict(patch),
                field_manager=FIELD_MANAGER,
                _content_type=MERGE,
                _preload_content=False,
            )
        )

    async def patch_destination_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch ``status`` of a Destination through its ``/status`` subresource.

        Raises:
            ApiError: the API refused (404 when the Destination is gone) or is unreachable.
        """
        await self._run(
            lambda: self._custom.patch_namespaced_custom_object_status(
                schema.GROUP,
                schema.VERSION,
                namespace,
                schema.PLURAL,
                name,
                {"status": dict(status)},
                field_manager=FIELD_MANAGER,
                _content_type=MERGE,
                _preload_content=False,
            )
        )

    async def get_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """The string values of a Secret (``data`` decoded from base64, or ``stringData`` as a
        server that has not converted it returns it), or None when it does not exist.

        Raises:
            ApiError: any error but 404.
        """
        try:
            body = await self._run(
                lambda: self._core.read_namespaced_secret(name, namespace, _preload_content=False)
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        values = {k: str(v) for k, v in (body.get("stringData") or {}).items()}
        for key, value in (body.get("data") or {}).items():
            values[key] = base64.b64decode(str(value)).decode()
        return values

    async def create_secret(self, obj: Mapping[str, Any]) -> bool:
        """Create a Secret; False when one of that name exists already (409).

        Raises:
            ApiError: any other refusal, or the API is unreachable.
        """
        namespace = obj["metadata"]["namespace"]
        body: Any = dict(obj)
        try:
            await self._run(
                lambda: self._core.create_namespaced_secret(
                    namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
                )
            )
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def get_custom(
        self, group: str, version: str, plural: str, name: str, namespace: str | None
    ) -> dict[str, Any] | None:
        """Return a custom object (namespaced when ``namespace`` is given), or None if absent.

        Raises:
            ApiError: any error but 404.
        """
        try:
            if namespace:
                return await self._run(
                    lambda: self._custom.get_namespaced_custom_object(
                        group, version, namespace, plural, name, _preload_content=False
                    )
                )
            return await self._run(
                lambda: self._custom.get_cluster_custom_object(
                    group, version, plural, name, _preload_content=False
                )
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def ensure_custom(
        self, group: str, version: str, plural: str, body: Mapping[str, Any], namespace: str | None
    ) -> bool:
        """Create a custom object unless it exists; return True when it was created.

        Raises:
            ApiError: any error but 409 (already exists).
        """
        obj: Any = dict(body)
        try:
            if namespace:
                await self._run(
                    lambda: self._custom.create_namespaced_custom_object(
                        group, version, namespace, plural, obj, _preload_content=False
                    )
                )
            else:
                await self._run(
                    lambda: self._custom.create_cluster_custom_object(
                        group, version, plural, obj, _preload_content=False
                    )
                )
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def post_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Warning",
        instance: str = "",
    ) -> None:
        """Create a core/v1 Event about ``involved`` (a body with apiVersion, kind, metadata).

        Failures are logged and swallowed: an event is informational.
        """
        meta = involved.get("metadata", {})
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = meta.get("namespace") or "default"
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta.get('name')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                **({"uid": meta["uid"]} if meta.get("uid") else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": instance or FIELD_MANAGER,
        }
        try:
            await self._run(
                lambda: self._core.create_namespaced_event(namespace, event, _preload_content=False)
            )
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, meta.get("name"), exc)
