"""kopf handlers of the Destination operator: thin decorators over :mod:`inturn.operator.reconcile`.

Run it with ``inturn operator`` (see :mod:`inturn.operator.cli`) or, for development,
``kopf run -m inturn.operator.handlers`` with the ``INTURN_*`` environment variables of
:meth:`~inturn.operator.config.OperatorConfig.from_env`.

Decisions fixed from the first release (changing them later risks duplicated children):

* kopf keeps its progress and diff-base in annotations under ``inturn.dev/`` and its finalizer is
  named ``inturn.dev/finalizer`` (set in :func:`startup`). No handler requires a finalizer: the
  children go with the Destination through their owner reference, and the registry row is
  marked deleted on the ``DELETED`` watch event (and by the periodic pass if that was missed), so
  deleting a Destination or its namespace never waits for the operator.
* No handler returns a value (kopf would write it into ``status``, which the schema prunes);
  status is written only through the declared fields, only when it changed.
* No kopf timer or daemon: they would add a finalizer to every Destination. One periodic task
  (:meth:`~inturn.operator.reconcile.Runtime.run_pass`) does the level-based work for all
  Destinations with one grouped depth query.
* Children are watched through label-filtered indices and an ``on.event`` handler, which store
  nothing on the Deployments (kopf annotations on a Deployment would propagate to its pods'
  ReplicaSets).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from inturn.operator import manifests
from inturn.operator.config import OperatorConfig
from inturn.operator.errors import TransientError
from inturn.operator.kube import KubeApi, load_configuration
from inturn.operator.metrics import RECONCILE_ERRORS
from inturn.operator.observed import (
    configmap_state,
    deployment_state,
    destination_snapshot,
    drift_of,
)
from inturn.operator.reconcile import Runtime
from inturn.worker.spec import schema

log = logging.getLogger("inturn.operator")

PREFIX = schema.GROUP
FINALIZER = f"{PREFIX}/finalizer"
CHILD_LABELS = {"app.kubernetes.io/managed-by": manifests.MANAGED_BY}
CHILD_SELECTOR = f"app.kubernetes.io/managed-by={manifests.MANAGED_BY}"

#: A handler gives up after this many temporary failures; the periodic pass converges later.
MAX_HANDLER_RETRIES = 8


def run_memo(config: OperatorConfig) -> kopf.Memo:
    """The ``memo`` to pass to ``kopf.run``: the operator's state lives in it, not in module
    globals (``memo.config`` here; ``memo.runtime`` once started). Without it (``kopf run -m``)
    the settings come from the environment."""
    return kopf.Memo(config=config)


def runtime(memo: Any) -> Runtime:
    """Return the :class:`Runtime` created at startup."""
    rt = getattr(memo, "runtime", None)
    if not isinstance(rt, Runtime):
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return rt


def _delay(retry: int) -> float:
    return float(min(60, 2 ** min(retry, 6)))


# --- authentication ---------------------------------------------------------------------------


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """Log kopf in the same way as the operator's own client: in-cluster, else ``$KUBECONFIG``.

    Raises:
        kopf.LoginError: no in-cluster service account and no usable kubeconfig.
    """
    try:
        cfg = load_configuration()
    except Exception as exc:
        raise kopf.LoginError(f"no Kubernetes credentials: {exc}") from exc
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=settings.networking.trust_env,
    )


# --- start and stop ---------------------------------------------------------------------------


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **kwargs: Any) -> None:
    """Fix kopf's storage names, tune it, and start the shared runtime."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING  # no event per successful handler
    settings.networking.error_backoffs = [1, 2, 5, 10, 20, 30]
    settings.watching.label_selectors["apps", "deployments"] = CHILD_SELECTOR
    settings.watching.label_selectors["v1", "configmaps"] = CHILD_SELECTOR
    config = getattr(memo, "config", None)
    if not isinstance(config, OperatorConfig):
        config = memo.config = OperatorConfig.from_env()
    api = KubeApi(load_configuration(config.api_concurrency * 2), config.api_concurrency)
    rt = Runtime(
        config,
        api,
        destinations=kwargs["destinations_idx"],
        deployments=kwargs["deployments_idx"],
        configmaps=kwargs["configmaps_idx"],
    )
    await rt.ensure_peering()
    await rt.start()
    memo.runtime = rt
    log.info(
        "inturn operator started (%s, status every %ss)",
        ", ".join(config.namespaces) or "cluster-wide",
        config.status_interval,
    )


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    """Stop the periodic pass and close connections."""
    rt = getattr(memo, "runtime", None)
    if isinstance(rt, Runtime):
        await rt.stop()
    memo.runtime = None


@kopf.on.probe(id="periodicPassAgeSeconds")
def periodic_pass_age(memo: Any, **_: Any) -> float | None:
    """Liveness detail: seconds since the last periodic pass (None before the first)."""
    import time

    rt = getattr(memo, "runtime", None)
    if not isinstance(rt, Runtime) or rt.last_pass is None:
        return None
    return round(time.monotonic() - rt.last_pass, 1)


@kopf.on.probe(id="databaseRefusals")
def database_refusals(**_: Any) -> list[str] | None:
    """Liveness detail: one line per kind of statement the database refuses now (read-only,
    a lock or statement timeout, the connection gone; the registrar's conditions), None when
    none is refused. The process lives on meanwhile."""
    from inturn.worker.text.conditions import notes

    return notes() or None


# --- indices (live caches; they store nothing on the objects) --------------------------------


@kopf.index(schema.GROUP, schema.VERSION, schema.PLURAL)
def destinations_idx(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """(namespace, name) → the Destination's snapshot."""
    return {(namespace, name): destination_snapshot(body)}


@kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS)
def deployments_idx(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """(namespace, Destination name) → the worker Deployment's state."""
    owner = labels.get(manifests.DESTINATION_LABEL)
    return {(namespace, owner): deployment_state(body)} if owner else {}


@kopf.index("v1", "configmaps", labels=CHILD_LABELS)
def configmaps_idx(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """(namespace, Destination name) → the worker ConfigMap's state."""
    owner = labels.get(manifests.DESTINATION_LABEL)
    return {(namespace, owner): configmap_state(body)} if owner else {}


# --- Destinations ---------------------------------------------------------------------------


@kopf.on.resume(schema.GROUP, schema.VERSION, schema.PLURAL)
@kopf.on.create(schema.GROUP, schema.VERSION, schema.PLURAL)
@kopf.on.update(schema.GROUP, schema.VERSION, schema.PLURAL)
async def reconcile_destination(body: kopf.Body, memo: Any, retry: int, **_: Any) -> None:
    """Create, update and resume converge to the same state (children, registry, status)."""
    rt = runtime(memo)
    rt.mark_indexed()
    try:
        await rt.reconcile(destination_snapshot(body), force=retry > 0)
    except TransientError as exc:
        RECONCILE_ERRORS.labels("destination").inc()
        if retry >= MAX_HANDLER_RETRIES:
            log.warning("giving up retrying now; the periodic pass will converge: %s", exc)
            return
        raise kopf.TemporaryError(str(exc), delay=_delay(retry)) from exc


@kopf.on.event(schema.GROUP, schema.VERSION, schema.PLURAL)
async def destination_event(
    type: str, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    """On deletion, mark the registry row deleted (no finalizer: deletion never waits)."""
    if type == "DELETED" and namespace:
        await runtime(memo).forget((namespace, name))


# --- worker Deployments ---------------------------------------------------------------------


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
async def worker_event(
    type: str, namespace: str | None, labels: kopf.Labels, body: kopf.Body, memo: Any, **_: Any
) -> None:
    """Revert replicas/strategy drift at once; recreate a deleted worker; refresh Ready."""
    rt = runtime(memo)
    rt.mark_indexed()
    owner = labels.get(manifests.DESTINATION_LABEL)
    if not owner or not namespace:
        return
    key = (namespace, str(owner))
    snap = rt.destination(key)
    if snap is None or snap["metadata"].get("deletionTimestamp"):
        return  # the Destination is gone: the garbage collector takes the Deployment
    try:
        if type == "DELETED":
            await rt.reconcile(snap, force=True)
            return
        problems = drift_of(deployment_state(body))
        if problems:
            await rt.revert_drift(key, body, problems)
        await rt.refresh_status(key)
    except TransientError as exc:
        RECONCILE_ERRORS.labels("worker").inc()
        log.warning("worker %s/%s: %s (the periodic pass will retry)", namespace, owner, exc)
