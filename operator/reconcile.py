"""The operator's behaviour, independent of kopf's decorators: reconcile, revert, refresh.

:class:`Runtime` holds what one operator process shares: its settings, the Kubernetes API
facade, the Postgres pool, kopf's indices (live caches of Destinations and of the operator's
Deployments and ConfigMaps, filled by kopf's watches) and one lock per Destination, so that a
handler and the periodic pass never reconcile the same Destination at once.

Everything converges on the same state from any starting point (create, update, resume, the
periodic pass, a drift event): render the children (pure), apply only what differs from what
the indices show, register the destination in Postgres only if its row differs, and patch the
status only if it changed. An operator that restarts over a converged cluster therefore writes
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from inturn.operator import manifests, status
from inturn.operator.kube import ApiError, KubeApi
from inturn.operator.manifests import WorkerPodSettings
from inturn.operator.metrics import RECONCILE_ERRORS
from inturn.worker.spec import schema
from inturn.worker.spec.config import DEFAULT_STUCK_AFTER_SECONDS
from inturn.worker.spec.destination import ManifestError
from inturn.worker.spec.schedule import held_until
from inturn.worker.store import registry

log = logging.getLogger("inturn.operator")

Key = tuple[str, str]  # (namespace, name)

#: kopf's peering resources (kopf.dev/v1).
PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process.

    Attributes:
        pod: settings of every worker pod.
        dsn: the operator's own Postgres DSN (registry and status); None disables both.
        namespaces: namespaces watched; empty means cluster-wide.
        status_interval: seconds between periodic passes (depth query, status, drift).
        peering: kopf peering object name, or None to run standalone.
        priority: this process's peering priority.
        identity: this process's peering identity.
        operator_namespace: namespace of the namespaced peering object (``POD_NAMESPACE``).
        api_concurrency: most Kubernetes API calls in flight.
    """

    pod: WorkerPodSettings
    dsn: str | None = None
    namespaces: tuple[str, ...] = ()
    status_interval: float = 15.0
    peering: str | None = None
    priority: int = 0
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    operator_namespace: str | None = None
    api_concurrency: int = 16

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Build the settings from ``INTURN_*`` environment variables (used by ``kopf run``).

        ``INTURN_WORKER_IMAGE`` (required), ``INTURN_DSN``, ``INTURN_DSN_SECRET``,
        ``INTURN_DSN_SECRET_KEY``, ``INTURN_WORKER_SERVICE_ACCOUNT``,
        ``INTURN_STATUS_INTERVAL`` (seconds), ``INTURN_WATCH_NAMESPACES`` (comma-separated).

        Raises:
            ValueError: ``INTURN_WORKER_IMAGE`` is missing or a number is malformed.
        """
        env = os.environ if env is None else env
        image = env.get("INTURN_WORKER_IMAGE")
        if not image:
            raise ValueError("INTURN_WORKER_IMAGE is not set: the worker image is required")
        return cls(
            pod=WorkerPodSettings(
                image=image,
                dsn_secret_name=env.get("INTURN_DSN_SECRET", "inturn-db"),
                dsn_secret_key=env.get("INTURN_DSN_SECRET_KEY", "dsn"),
                service_account_name=env.get("INTURN_WORKER_SERVICE_ACCOUNT") or None,
            ),
            dsn=env.get("INTURN_DSN") or None,
            namespaces=tuple(
                n.strip() for n in env.get("INTURN_WATCH_NAMESPACES", "").split(",") if n.strip()
            ),
            status_interval=float(env.get("INTURN_STATUS_INTERVAL", "15")),
            operator_namespace=env.get("POD_NAMESPACE") or None,
        )


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
    """Deep-copy a kopf body (mapping views) into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


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


class TransientError(Exception):
    """The database or the API is unavailable; the caller should retry later."""


class Runtime:
    """Shared state and behaviour of one running operator (see the module docstring).

    Args:
        config: the operator's settings.
        api: the Kubernetes API facade.
        destinations, deployments, configmaps: kopf indices keyed by (namespace, name of the
            Destination); each value is a store of :func:`destination_snapshot` dicts or
            :class:`ChildState` items.
    """

    def __init__(
        self,
        config: OperatorConfig,
        api: KubeApi,
        *,
        destinations: Mapping[Key, Iterable[Any]],
        deployments: Mapping[Key, Iterable[Any]],
        configmaps: Mapping[Key, Iterable[Any]],
    ) -> None:
        self.config = config
        self.api = api
        self.destinations = destinations
        self.deployments = deployments
        self.configmaps = configmaps
        self.pool: AsyncConnectionPool | None = None
        self.indexed = asyncio.Event()
        self.started = time.monotonic()
        self._locks: dict[Key, asyncio.Lock] = {}
        self._written: dict[Key, dict[str, Any]] = {}
        self._registered: dict[str, tuple[Any, ...]] = {}
        self._invalid_reported: dict[Key, tuple[int, str]] = {}
        self._rendered: dict[Key, tuple[str, manifests.Children]] = {}
        self.depth: dict[str, registry.DestinationDepth] | None = None
        self.depth_seconds: float | None = None  #: duration of the last grouped depth query
        self.pass_seconds: float | None = None  #: duration of the last periodic pass
        self.last_pass: float | None = None  #: monotonic time the last pass ended
        self._task: asyncio.Task[None] | None = None
        self._sem = asyncio.Semaphore(max(1, config.api_concurrency * 2))

    # --- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the database pool (without waiting for it) and start the periodic pass."""
        if self.config.dsn:
            self.pool = AsyncConnectionPool(
                self.config.dsn,
                min_size=1,
                max_size=4,
                open=False,
                kwargs={"autocommit": True},
                timeout=10,
                reconnect_timeout=0,  # keep trying for ever; calls fail fast meanwhile
            )
            await self.pool.open(wait=False)
            await self.read_depth()  # so that the first statuses written are complete
        self._task = asyncio.create_task(self._periodic(), name="inturn periodic pass")

    async def ensure_peering(self) -> None:
        """Create the kopf peering object(s) this operator uses, if missing (idempotent).

        Cluster-wide: a ClusterKopfPeering; namespaced: a KopfPeering in each served namespace.
        Creating it here (not in the Helm chart) avoids installing a custom object in the same
        release as its CRD. Failures are logged: kopf then reports the missing peering itself.
        """
        if self.config.peering is None:
            return
        kind, plural = (
            ("KopfPeering", "kopfpeerings")
            if self.config.namespaces
            else ("ClusterKopfPeering", "clusterkopfpeerings")
        )
        body = {
            "apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}",
            "kind": kind,
            "metadata": {"name": self.config.peering},
        }
        for namespace in self.config.namespaces or (None,):
            try:
                if await self.api.ensure_custom(
                    PEERING_GROUP, PEERING_VERSION, plural, body, namespace
                ):
                    log.info("created %s %s", kind, self.config.peering)
            except ApiError as exc:
                log.warning("could not create %s %s: %s", kind, self.config.peering, exc)

    async def stop(self) -> None:
        """Stop the periodic pass and close the pool and the API client."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.pool is not None:
            await self.pool.close()
        self.api.close()

    def mark_indexed(self) -> None:
        """Note that kopf has called a handler: its indices are complete from now on."""
        self.indexed.set()

    def lock(self, key: Key) -> asyncio.Lock:
        """Return the lock serialising work on one Destination."""
        return self._locks.setdefault(key, asyncio.Lock())

    # --- index lookups ----------------------------------------------------------------------

    @staticmethod
    def _one(index: Mapping[Key, Iterable[Any]], key: Key) -> Any:
        store = index.get(key)
        if store is None:
            return None
        for item in store:
            return item
        return None

    def destination(self, key: Key) -> dict[str, Any] | None:
        """The Destination as last seen, or None."""
        found = self._one(self.destinations, key)
        return found if isinstance(found, dict) else None

    def deployment(self, key: Key) -> ChildState | None:
        """The worker Deployment as last seen, or None."""
        found = self._one(self.deployments, key)
        return found if isinstance(found, ChildState) else None

    def configmap(self, key: Key) -> ChildState | None:
        """The worker ConfigMap as last seen, or None."""
        found = self._one(self.configmaps, key)
        return found if isinstance(found, ChildState) else None

    # --- reconcile ------------------------------------------------------------------------------

    def render(self, snap: Mapping[str, Any]) -> manifests.Children:
        """Render a Destination's children, reusing the last result while its input is the same.

        Raises:
            ManifestError: the spec is invalid.
        """
        meta = snap["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        fingerprint = manifests.digest([meta.get("uid"), snap.get("spec")], 32)
        cached = self._rendered.get(key)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        children = manifests.render(snap, self.config.pod)
        self._rendered[key] = (fingerprint, children)
        return children

    async def reconcile(
        self,
        snap: Mapping[str, Any],
        *,
        force: bool = False,
        registered: Mapping[str, registry.RegisteredDestination] | None = None,
        register: bool = True,
    ) -> None:
        """Converge one Destination: children, registry row, status.

        Args:
            snap: :func:`destination_snapshot` of the Destination (the freshest known).
            force: apply the children even if the indices show them current.
            registered: registry rows read in this pass (skips the upsert when equal).
            register: False skips the registry (the database is known to be down).

        Raises:
            TransientError: the API or the database failed in a way worth retrying.
        """
        meta = snap["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp"):
            return
        async with self.lock(key):
            try:
                children = self.render(snap)
            except ManifestError as exc:
                await self._report_invalid(snap, "; ".join(exc.errors))
                return
            taken = await self._carriers_taken(children) if register else None
            if taken is not None:
                await self._report_invalid(snap, str(taken))
                return
            self._invalid_reported.pop(key, None)
            try:
                await self._apply_children(key, children, force=force)
            except ApiError as exc:
                raise TransientError(str(exc)) from exc
            try:
                db_error = await self._register(snap, children, registered) if register else None
            except registry.CarrierTaken as exc:  # claimed by another one meanwhile
                await self._report_invalid(snap, str(exc))
                return
            await self._write_status(snap, children=children, applied=True)
            if db_error is not None:
                raise TransientError(db_error)

    async def _apply_children(self, key: Key, children: manifests.Children, *, force: bool) -> None:
        want_cm = children.config_map["metadata"]["annotations"][manifests.SPEC_HASH_ANNOTATION]
        cm = self.configmap(key)
        if (
            force
            or cm is None
            or cm.spec_hash != want_cm
            or cm.data_hash != manifests.digest(children.config_map["data"])
        ):
            how = await self.api.apply(children.config_map, exists=cm is not None)
            log.info("ConfigMap %s/%s %s", key[0], children.config_map["metadata"]["name"], how)
        want_dep = children.deployment["metadata"]["annotations"][manifests.SPEC_HASH_ANNOTATION]
        dep = self.deployment(key)
        if dep is not None and drift_of(dep):
            await self.api.merge_patch_deployment(key[0], dep.name, REVERT_PATCH)
        if force or dep is None or dep.spec_hash != want_dep:
            how = await self.api.apply(children.deployment, exists=dep is not None)
            log.info("Deployment %s/%s %s", key[0], children.deployment["metadata"]["name"], how)

    async def _carriers_taken(self, children: manifests.Children) -> registry.CarrierTaken | None:
        """Whether another live Destination already serves one of this one's carriers.

        At most one live Destination may serve a carrier; the API server cannot check that
        across objects, so the operator does before it creates anything, and reports the
        second one as an invalid spec. The registry enforces it again when registering.
        """
        carriers = children.spec.get("carriers") or []
        if self.pool is None or not carriers:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                holders = await registry.carrier_holders(conn, children.key, carriers)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("carrier check for %s failed: %s", children.key, exc)
            return None  # the registration checks again
        return registry.CarrierTaken(children.key, holders) if holders else None

    async def _register(
        self,
        snap: Mapping[str, Any],
        children: manifests.Children,
        registered: Mapping[str, registry.RegisteredDestination] | None,
    ) -> str | None:
        """Upsert the registry row if it differs; return an error text when the DB failed."""
        if self.pool is None:
            return None
        meta = snap["metadata"]
        spec = children.spec
        row = registry.RegisteredDestination(
            destination=children.key,
            namespace=meta["namespace"],
            name=meta["name"],
            channel=spec["channel"],
            message_types=tuple((spec.get("filter") or {}).get("messageTypes", [])),
            generation=int(meta.get("generation") or 0),
            suspended=bool(spec["suspend"]),
            carriers=tuple(sorted(spec.get("carriers") or ())),
            sender_kind=next(iter(spec["sender"]), None),  # the one key: mllp, http, sftp
            sender=manifests.sender_summary(spec),
            stuck_after_seconds=int(
                (spec.get("alerting") or {}).get("stuckAfterSeconds", DEFAULT_STUCK_AFTER_SECONDS)
            ),
            expire_after_seconds=spec.get("expireAfterSeconds"),
            schedule=spec.get("schedule"),
            replies=spec.get("replies") or None,
        )
        if registered is not None and registered.get(children.key) == row:
            return None
        if registered is None and self._registered.get(children.key) == _row_tuple(row):
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                await registry.register(
                    conn,
                    destination=row.destination,
                    namespace=row.namespace,
                    name=row.name,
                    channel=row.channel,
                    message_types=row.message_types,
                    generation=row.generation,
                    suspended=row.suspended,
                    carriers=row.carriers,
                    sender_kind=row.sender_kind,
                    sender=row.sender,
                    stuck_after_seconds=row.stuck_after_seconds,
                    expire_after_seconds=row.expire_after_seconds,
                    schedule=row.schedule,
                    replies=row.replies,
                )
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("registry update for %s failed: %s", children.key, exc)
            return f"the database is unavailable: {type(exc).__name__}"
        self._registered[children.key] = _row_tuple(row)
        return None

    async def _report_invalid(self, snap: Mapping[str, Any], reason: str) -> None:
        meta = snap["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        generation = int(meta.get("generation") or 0)
        if self._invalid_reported.get(key) != (generation, reason):
            self._invalid_reported[key] = (generation, reason)
            log.warning("Destination %s/%s is invalid: %s", key[0], key[1], reason)
            await self.api.post_event(
                snap, reason="InvalidSpec", message=reason, instance=self.config.identity
            )
        await self._write_status(snap, invalid=reason)

    # --- status ---------------------------------------------------------------------------

    async def _write_status(
        self,
        snap: Mapping[str, Any],
        *,
        children: manifests.Children | None = None,
        invalid: str | None = None,
        applied: bool = False,
    ) -> None:
        """Patch the status if it changed; ``applied``: the children were just made to exist."""
        meta = snap["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        generation = int(meta.get("generation") or 0)
        spec = children.spec if children is not None else snap.get("spec") or {}
        dep = self.deployment(key)
        worker = status.WorkerDeployment(
            name=manifests.child_name(key[1]),
            exists=dep is not None or applied,  # the watch may not have shown it yet
            available=dep is not None and dep.available,
        )
        depth: status.QueueDepth | None = None
        if self.depth is not None:
            row = self.depth.get(f"{key[0]}/{key[1]}")
            depth = (
                status.QueueDepth(
                    pending=row.pending,
                    failed=row.failed,
                    oldest=row.oldest,
                    max_attempts=row.max_attempts,
                    head_attempts=row.head_attempts,
                    head_error=row.head_error,
                )
                if row is not None
                else status.QueueDepth()
            )
        current = self._written.get(key)
        if current is None or current.get("observedGeneration") != generation:
            current = snap.get("status") or {}
        now = datetime.now(UTC)
        desired = status.desired_status(
            generation=generation,
            previous=current,
            worker=worker,
            depth=depth,
            suspended=bool(spec.get("suspend", False)),
            sender=manifests.sender_summary(spec) if invalid is None else None,
            invalid=invalid,
            now=now,
            held_until=held_until(spec.get("schedule"), now) if invalid is None else None,
        )
        patch = status.status_patch(current, desired)
        if patch is None:
            return
        try:
            await self.api.patch_destination_status(key[0], key[1], patch)
        except ApiError as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            raise TransientError(str(exc)) from exc
        self._written[key] = desired

    async def refresh_status(self, key: Key) -> None:
        """Recompute one Destination's status from the cached depth (e.g. worker went ready)."""
        snap = self.destination(key)
        if snap is None or snap["metadata"].get("deletionTimestamp"):
            return
        async with self.lock(key):
            try:
                children = self.render(snap)
            except ManifestError as exc:
                await self._write_status(snap, invalid="; ".join(exc.errors))
                return
            await self._write_status(snap, children=children)

    # --- drift and deletion -------------------------------------------------------------------

    async def revert_drift(self, key: Key, body: Mapping[str, Any], problems: list[str]) -> None:
        """Put a worker Deployment back to one replica and Recreate, and say so in events.

        Raises:
            TransientError: the API failed.
        """
        name = str(body.get("metadata", {}).get("name"))
        message = (
            f"Reverted {', '.join(problems)} on worker Deployment {name}:"
            " a destination has exactly one worker."
        )
        log.warning("%s/%s: %s", key[0], name, message)
        try:
            await self.api.merge_patch_deployment(key[0], name, REVERT_PATCH)
        except ApiError as exc:
            if exc.status == 404:
                return
            raise TransientError(str(exc)) from exc
        await self.api.post_event(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": body.get("metadata", {})},
            reason="WorkerDriftReverted",
            message=message,
            instance=self.config.identity,
        )
        snap = self.destination(key)
        if snap is not None:
            await self.api.post_event(
                snap,
                reason="WorkerDriftReverted",
                message=message,
                instance=self.config.identity,
            )

    async def forget(self, key: Key) -> None:
        """The Destination is gone: mark it deleted in the registry (messages are kept)."""
        self._written.pop(key, None)
        self._invalid_reported.pop(key, None)
        self._rendered.pop(key, None)
        destination = f"{key[0]}/{key[1]}"
        self._registered.pop(destination, None)
        if self.pool is None:
            return
        try:
            async with self.pool.connection(timeout=5) as conn:
                if await registry.mark_deleted(conn, destination):
                    log.info(
                        "registry: %s marked deleted; its queued messages are kept", destination
                    )
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("could not mark %s deleted (the periodic pass will): %s", destination, exc)

    # --- the periodic pass ----------------------------------------------------------------------

    def watched(self, namespace: str) -> bool:
        """Whether this operator is responsible for ``namespace``."""
        return not self.config.namespaces or namespace in self.config.namespaces

    async def paused(self) -> bool:
        """Whether kopf peering gives precedence to another operator right now."""
        if self.config.peering is None:
            return False
        # kopf uses a ClusterKopfPeering cluster-wide, a KopfPeering per served namespace else
        namespace = self.config.namespaces[0] if self.config.namespaces else None
        plural = "kopfpeerings" if namespace else "clusterkopfpeerings"
        try:
            obj = await self.api.get_custom(
                PEERING_GROUP, PEERING_VERSION, plural, self.config.peering, namespace
            )
        except ApiError:
            return True  # cannot tell: do not act twice
        peers = (obj or {}).get("status") or {}
        return peering_paused(peers, self.config.identity, self.config.priority, datetime.now(UTC))

    async def read_depth(self) -> None:
        """Run the one grouped depth query; keep the last result when the database fails."""
        if self.pool is None:
            return
        began = time.perf_counter()
        try:
            async with self.pool.connection(timeout=5) as conn:
                self.depth = await registry.status_depth(conn)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("queue depth unavailable: %s", exc)
            return
        self.depth_seconds = time.perf_counter() - began

    async def run_pass(self) -> None:
        """One periodic pass over every Destination: depth, children, registry, status."""
        began = time.perf_counter()
        await self.read_depth()
        rows: dict[str, registry.RegisteredDestination] | None = None
        if self.pool is not None:
            try:
                async with self.pool.connection(timeout=5) as conn:
                    rows = {r.destination: r for r in await registry.list_all(conn)}
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("registry unavailable: %s", exc)
        keys = list(self.destinations.keys())
        log.debug(
            "periodic pass: %d destinations, %d deployments, %d configmaps indexed",
            len(keys),
            len(self.deployments),
            len(self.configmaps),
        )

        async def one(key: Key) -> None:
            snap = self.destination(key)
            if snap is None:
                return
            async with self._sem:
                try:
                    await self.reconcile(snap, registered=rows, register=rows is not None)
                except TransientError as exc:
                    RECONCILE_ERRORS.labels("pass").inc()
                    log.warning("reconcile of %s/%s deferred: %s", key[0], key[1], exc)

        await asyncio.gather(*(one(k) for k in keys))
        if rows is not None and self.pool is not None:
            present = {f"{ns}/{name}" for ns, name in keys}
            for row in rows.values():
                if (
                    not row.deleted
                    and row.destination not in present
                    and self.watched(row.namespace)
                ):
                    await self.forget((row.namespace, row.name))
        self.pass_seconds = time.perf_counter() - began
        self.last_pass = time.monotonic()

    async def _periodic(self) -> None:
        # kopf calls no handler before its indices are populated; wait for the first one (or a
        # minute, for a cluster without any Destination or worker).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.indexed.wait(), timeout=60)
        interval = self.config.status_interval
        while True:
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            try:
                if await self.paused():
                    log.info("peering: another operator has precedence; skipping this pass")
                    continue
                await self.run_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic pass failed; the next one will retry")


def _row_tuple(row: registry.RegisteredDestination) -> tuple[Any, ...]:
    return (
        row.namespace,
        row.name,
        row.channel,
        row.message_types,
        row.generation,
        row.suspended,
        row.carriers,
        row.sender_kind,
        row.sender,
        row.stuck_after_seconds,
        row.expire_after_seconds,
        json.dumps(row.schedule, sort_keys=True),
        json.dumps(row.replies, sort_keys=True),
    )
