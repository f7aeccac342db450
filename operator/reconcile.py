"""The operator's behaviour, independent of kopf's decorators: reconcile, revert, refresh.

:class:`Runtime` holds what one operator process shares: its settings, the Kubernetes API
facade, its rows in Postgres (:class:`~inturn.operator.registrar.Registrar`), its status patches
(:class:`~inturn.operator.statuses.StatusWriter`), kopf's indices (live caches of Destinations
and of the operator's Deployments and ConfigMaps, filled by kopf's watches, summarised by
:mod:`inturn.operator.observed`) and one lock per Destination, so that a handler and the
periodic pass never reconcile the same Destination at once.

Everything converges on the same state from any starting point (create, update, resume, the
periodic pass, a drift event): render the children (pure), apply only what differs from what
the indices show, register the destination in Postgres only if its row differs, and patch the
status only if it changed. An operator that restarts over a converged cluster therefore writes
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from inturn.operator import manifests
from inturn.operator.config import OperatorConfig
from inturn.operator.errors import TransientError
from inturn.operator.kube import ApiError, KubeApi
from inturn.operator.metrics import RECONCILE_ERRORS
from inturn.operator.observed import (
    PEERING_GROUP,
    PEERING_VERSION,
    REVERT_PATCH,
    ChildState,
    Key,
    drift_of,
    peering_paused,
)
from inturn.operator.registrar import Registrar
from inturn.operator.restore import Finding, Witness, parse_time, went_back
from inturn.operator.statuses import StatusWriter
from inturn.worker.spec.destination import ManifestError
from inturn.worker.store import registry
from inturn.worker.store.restore import Seen

log = logging.getLogger("inturn.operator")


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
        self.registrar = Registrar(config.dsn)
        self.indexed = asyncio.Event()
        self.started = time.monotonic()
        self._locks: dict[Key, asyncio.Lock] = {}
        self.statuses = StatusWriter(api)
        self._invalid_reported: dict[Key, tuple[int, str]] = {}
        self._rendered: dict[Key, tuple[str, manifests.Children]] = {}
        #: the login each Destination's Secret was checked against, once per process
        self._logins: dict[Key, str] = {}
        #: each Destination's restore witness and undecided restore as last written here (the
        #: watch may still show older ones); see :meth:`watch_restores`
        self._witness: dict[Key, Witness] = {}
        self._restored: dict[Key, dict[str, Any] | None] = {}
        self._next_tick = 0.0
        self.depth: dict[str, registry.DestinationDepth] | None = None
        self.depth_seconds: float | None = None  #: duration of the last grouped depth query
        self.pass_seconds: float | None = None  #: duration of the last periodic pass
        self.last_pass: float | None = None  #: monotonic time the last pass ended
        self._task: asyncio.Task[None] | None = None
        self._sem = asyncio.Semaphore(max(1, config.api_concurrency * 2))

    # --- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the database pool (without waiting for it) and start the periodic pass."""
        await self.registrar.open()
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
        await self.registrar.close()
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
            taken = await self.registrar.carriers_taken(children) if register else None
            if taken is not None:
                await self._report_invalid(snap, str(taken))
                return
            self._invalid_reported.pop(key, None)
            login_error = (
                await self._ensure_login(snap, key)
                if self.config.pod.worker_logins == "per-destination"
                else None
            )
            try:
                await self._apply_children(key, children, force=force)
            except ApiError as exc:
                raise TransientError(str(exc)) from exc
            try:
                db_error = (
                    await self.registrar.register(snap, children, registered) if register else None
                )
            except registry.CarrierTaken as exc:  # claimed by another one meanwhile
                await self._report_invalid(snap, str(exc))
                return
            await self._write_status(snap, children=children, applied=True)
            if db_error is not None or login_error is not None:
                raise TransientError(db_error or login_error or "")

    async def _ensure_login(self, snap: Mapping[str, Any], key: Key) -> str | None:
        """Make sure the Destination's own worker login exists with the password of its Secret
        (``--worker-logins per-destination``): a new password and Secret the first time, the
        database's login re-keyed from the Secret once per operator process (a database restored
        or a login dropped by hand comes back). None when done, else why not (retried).

        Raises:
            TransientError: the Kubernetes API failed.
        """
        destination = f"{key[0]}/{key[1]}"
        name = manifests.login_secret_name(key[1])
        try:
            stored = await self.api.get_secret(key[0], name)
        except ApiError as exc:
            raise TransientError(str(exc)) from exc
        if stored is not None and self._logins.get(key) == stored.get(manifests.LOGIN_USER_KEY):
            return None
        password = (stored or {}).get(manifests.LOGIN_PASSWORD_KEY) or secrets.token_urlsafe(32)
        login = await self.registrar.ensure_login(destination, password)
        if login is None:
            return f"{destination}: its worker login could not be made (the database is away)"
        if stored is None:
            try:
                await self.api.create_secret(manifests.login_secret(snap, login, password))
            except ApiError as exc:
                raise TransientError(str(exc)) from exc
            log.info("worker login %s made for %s (Secret %s/%s)", login, destination, key[0], name)
        self._logins[key] = login
        return None

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
            if children.network_policy is not None:  # made with its worker, kept by apply
                how = await self.api.apply(children.network_policy, exists=dep is not None)
                log.info(
                    "NetworkPolicy %s/%s %s", key[0], children.deployment["metadata"]["name"], how
                )

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
        """Patch the status if it changed (:class:`~inturn.operator.statuses.StatusWriter`);
        ``applied``: the children were just made to exist."""
        meta = snap["metadata"]
        await self.statuses.write(
            snap,
            deployment=self.deployment((meta["namespace"], meta["name"])),
            depths=self.depth,
            children=children,
            invalid=invalid,
            applied=applied,
        )

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
        self.statuses.forget(key)
        self._invalid_reported.pop(key, None)
        self._rendered.pop(key, None)
        self._witness.pop(key, None)
        self._restored.pop(key, None)
        await self.registrar.mark_deleted(f"{key[0]}/{key[1]}")
        if self.config.pod.worker_logins == "per-destination":
            self._logins.pop(key, None)
            await self.registrar.drop_login(f"{key[0]}/{key[1]}")

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
        began = time.perf_counter()
        depth = await self.registrar.depth()
        if depth is None:
            return
        self.depth = depth
        self.depth_seconds = time.perf_counter() - began

    async def watch_restores(self) -> None:
        """Once a tick (``restore_tick_seconds``): move the database's clock on, and for each
        Destination record what the database holds (``status.witness``), or, when the database
        holds an older tick than recorded (it was restored), say so once (a log line, an event,
        ``status.restore``) and hold its delivery unless ``spec.afterRestore`` is ``resend``.
        An undecided restore ends when a person lifts the hold (``inturn queue resume``); the
        witness then starts again from the database as it is. See docs/howto/backups.md."""
        now = time.monotonic()
        if now < self._next_tick:
            return
        # A process's first look only reads the clock (a restore made while the operator was
        # stopped is found at once) and writes nothing unless it finds one; the ticks follow.
        first = self._next_tick == 0.0
        self._next_tick = now + self.config.restore_tick_seconds
        found = await self.registrar.restore_pass(move=not first)
        if found is None:
            self._next_tick = 0.0 if first else self._next_tick
            return
        before, tick, seen = found
        for key in list(self.destinations.keys()):
            snap = self.destination(key)
            if snap is None or snap["metadata"].get("deletionTimestamp"):
                continue
            destination = f"{key[0]}/{key[1]}"
            node = snap.get("status") or {}
            policy = str((snap.get("spec") or {}).get("afterRestore") or "hold")
            undecided = self._restored[key] if key in self._restored else node.get("restore")
            recorded = self._witness.get(key) or Witness.from_status(node.get("witness"))
            current = Witness.of(tick, seen.get(destination), recorded)
            try:
                again_back = False
                if undecided and policy == "hold":
                    # the finding lives in the restored database: gone, it went back once more
                    # before a person decided (its hold went with it): found again
                    again_back = await self.registrar.has_finding(destination) is False
                if undecided and not again_back:
                    holding = await self.registrar.held(destination) if policy == "hold" else False
                    if holding is not False:
                        # a person has not decided yet (or the database cannot say): the count
                        # follows what they did meanwhile (mark-delivered brings it to 0)
                        if holding and recorded is not None and isinstance(undecided, dict):
                            await self._recount(key, snap, policy, recorded, seen, undecided)
                        continue
                    if not await self.registrar.forget_finding(destination):
                        continue
                    log.info("destination %s: the restore is decided; witness anew", destination)
                    await self._patch_witness(key, Witness.of(tick, seen.get(destination)), None)
                    continue
                if again_back or went_back(recorded, before):
                    assert recorded is not None
                    found_now = await self.registrar.record_finding(
                        destination, recorded.finding(), recorded.channel_moment()
                    )
                    if found_now is None:
                        continue  # the database failed (logged): found again at the next tick
                    again, (kept_through, kept_at) = found_now
                    channel = (snap.get("spec") or {}).get("channel")
                    finding = Finding(
                        destination,
                        policy,
                        again,
                        recorded,
                        seen.get(destination),
                        str(channel) if channel else None,
                        kept_through,
                        kept_at,
                    )
                    line = finding.line()
                    log.warning("%s", line)
                    if policy == "hold":
                        await self.registrar.hold_after_restore(destination, line)
                    await self.api.post_event(
                        snap,
                        reason="DatabaseRestored",
                        message=line[:1024],
                        instance=self.config.identity,
                    )
                    await self._patch_witness(key, recorded, finding.to_status(datetime.now(UTC)))
                    continue
                if not first or recorded is None:
                    await self._patch_witness(key, current, None)
            except ApiError as exc:
                log.warning("restore witness of %s not written: %s", destination, exc)

    async def _recount(
        self,
        key: Key,
        snap: Mapping[str, Any],
        policy: str,
        recorded: Witness,
        seen: Mapping[str, Seen],
        undecided: dict[str, Any],
    ) -> None:
        """While a restore is undecided: count again what may be sent twice and what was lost
        (``status.restore``; said once already, so no line, no event)."""
        destination = f"{key[0]}/{key[1]}"
        counted = await self.registrar.recount(destination, recorded.channel_moment())
        if counted is None:
            return
        again, (kept_through, kept_at) = counted
        channel = (snap.get("spec") or {}).get("channel")
        finding = Finding(
            destination,
            policy,
            again,
            recorded,
            seen.get(destination),
            str(channel) if channel else None,
            kept_through,
            kept_at,
        )
        detected = parse_time(undecided.get("detectedTime")) or datetime.now(UTC)
        await self._patch_witness(key, recorded, finding.to_status(detected))

    async def _patch_witness(
        self, key: Key, witness: Witness, restore: dict[str, Any] | None
    ) -> None:
        """Write ``status.witness`` and ``status.restore`` (None: removed) when they changed."""
        if self._witness.get(key) == witness and self._restored.get(key, {}) == restore:
            return
        patch = {"witness": witness.to_status(), "restore": restore}
        try:
            await self.api.patch_destination_status(key[0], key[1], patch)
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        self._witness[key] = witness
        self._restored[key] = restore

    async def run_pass(self) -> None:
        """One periodic pass over every Destination: depth, children, registry, status."""
        began = time.perf_counter()
        await self.read_depth()
        await self.watch_restores()
        rows = await self.registrar.rows()
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
        if rows is not None:
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
