"""A Destination's status as the operator writes it: computed from what it sees (the worker
Deployment, the last queue depth, the spec), patched only when it changed, and only once per
change, from the last status this process wrote (the watch may still show an older one).

The status itself is built purely in :mod:`inturn.operator.status`; this module decides when to
patch it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from inturn.operator import manifests, status
from inturn.operator.errors import TransientError
from inturn.operator.kube import ApiError, KubeApi
from inturn.operator.observed import ChildState, Key
from inturn.worker.spec.schedule import held_until
from inturn.worker.store import registry


class StatusWriter:
    """The status patches of one operator (see the module docstring).

    Args:
        api: the Kubernetes API facade.
    """

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._written: dict[Key, dict[str, Any]] = {}

    async def write(
        self,
        snap: Mapping[str, Any],
        *,
        deployment: ChildState | None,
        depths: Mapping[str, registry.DestinationDepth] | None,
        children: manifests.Children | None = None,
        invalid: str | None = None,
        applied: bool = False,
    ) -> None:
        """Patch the status of the Destination ``snap`` if it changed.

        Args:
            snap: the Destination's snapshot
                (:func:`~inturn.operator.observed.destination_snapshot`).
            deployment: its worker Deployment as last seen, or None.
            depths: the last grouped depth by ``namespace/name`` (None: not known, so the
                status shows no depth).
            children: its rendered children (their spec is the normalised one), or None.
            invalid: why its spec is invalid, or None.
            applied: the children were just made to exist.

        Raises:
            TransientError: the API failed (a 404, the Destination deleted meanwhile, is not).
        """
        meta = snap["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        generation = int(meta.get("generation") or 0)
        spec = children.spec if children is not None else snap.get("spec") or {}
        worker = status.WorkerDeployment(
            name=manifests.child_name(key[1]),
            exists=deployment is not None or applied,  # the watch may not have shown it yet
            available=deployment is not None and deployment.available,
        )
        depth: status.QueueDepth | None = None
        if depths is not None:
            row = depths.get(f"{key[0]}/{key[1]}")
            depth = (
                status.QueueDepth(
                    pending=row.pending,
                    failed=row.failed,
                    oldest=row.oldest,
                    max_attempts=row.max_attempts,
                    head_attempts=row.head_attempts,
                    head_error=row.head_error,
                    lanes=row.lane_view,
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

    def forget(self, key: Key) -> None:
        """The Destination ``key`` is gone: drop what was written for it."""
        self._written.pop(key, None)
