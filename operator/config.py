"""The settings of one operator process (:class:`OperatorConfig`), from its command line
(``inturn operator``) or, under ``kopf run``, from the environment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from inturn.operator.manifests import WorkerPodSettings


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
        ``INTURN_STATUS_INTERVAL`` (seconds), ``INTURN_WATCH_NAMESPACES`` (comma-separated),
        ``INTURN_PAYLOAD_KEYS_SECRET``, ``INTURN_KEY_DSN_SECRET``, ``INTURN_KEY_DSN_SECRET_KEY``.

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
                payload_keys_secret=env.get("INTURN_PAYLOAD_KEYS_SECRET") or None,
                key_dsn_secret=env.get("INTURN_KEY_DSN_SECRET", "inturn-keys"),
                key_dsn_secret_key=env.get("INTURN_KEY_DSN_SECRET_KEY", "dsn"),
            ),
            dsn=env.get("INTURN_DSN") or None,
            namespaces=tuple(
                n.strip() for n in env.get("INTURN_WATCH_NAMESPACES", "").split(",") if n.strip()
            ),
            status_interval=float(env.get("INTURN_STATUS_INTERVAL", "15")),
            operator_namespace=env.get("POD_NAMESPACE") or None,
        )
