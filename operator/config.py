"""The settings of one operator process (:class:`OperatorConfig`), from its command line
(``inturn operator``) or, under ``kopf run``, from the environment.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inturn.operator.manifests import (
    WORKER_LOGINS,
    WorkerPodSettings,
    parse_network_policy,
    parse_worker_env,
)
from inturn.worker.errors import Invalid


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
        restore_tick_seconds: how often the database's clock is moved on and each
            Destination's restore witness recorded (``INTURN_RESTORE_TICK_SECONDS``; a restore
            is noticed within a tick, and a database that lost less than a tick's worth of
            writes is not told from one that lost none).
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
    restore_tick_seconds: float = 60.0

    @classmethod
    def from_options(
        cls,
        *,
        image: str | None,
        image_pull_policy: str = "IfNotPresent",
        image_pull_secrets: Sequence[str] = (),
        dsn: str | None = None,
        dsn_secret: str = "inturn-db",
        dsn_secret_key: str = "dsn",
        worker_service_account: str | None = None,
        status_interval: float = 15.0,
        namespaces: Sequence[str] = (),
        peering: str | None = None,
        priority: int | None = None,
        log_json: bool = False,
        worker_env: Sequence[str] = (),
        worker_secret_env: Sequence[str] = (),
        payload_keys_secret: str | None = None,
        key_dsn_secret: str = "inturn-keys",
        key_dsn_secret_key: str = "dsn",
        worker_logins: str = "shared",
        worker_network_policy: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> OperatorConfig:
        """The one place an operator's settings are built: from ``inturn operator``'s options
        (:mod:`inturn.operator.cli`) and, under ``kopf run``, from the environment
        (:meth:`from_env`).

        ``namespaces`` items may hold several names, separated by commas or spaces; without
        ``priority`` a peering operator draws one at random (equal priorities would freeze
        every peer, as kopf decides). The identity is ``POD_NAME`` from ``env`` (the process
        environment by default), else ``<host>-<pid>``.

        Raises:
            Invalid: no ``image``, a malformed ``worker_env``/``worker_secret_env`` item
                (the message names the option), or ``worker_logins`` not one of
                :data:`~inturn.operator.manifests.WORKER_LOGINS`.
        """
        env = os.environ if env is None else env
        if not image:
            raise Invalid("the worker image is required (--image, INTURN_WORKER_IMAGE)")
        if worker_logins not in WORKER_LOGINS:
            raise Invalid(
                f"--worker-logins: one of {', '.join(WORKER_LOGINS)}, not {worker_logins!r}"
            )
        try:
            plain_env, secret_env = parse_worker_env(worker_env, worker_secret_env)
        except ValueError as exc:
            raise Invalid(f"--worker-env: {exc}") from None
        try:
            policy = parse_network_policy(worker_network_policy)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if priority is None:
            priority = random.randint(1, 2**30) if peering else 0
        return cls(
            pod=WorkerPodSettings(
                image=image,
                image_pull_policy=image_pull_policy,
                dsn_secret_name=dsn_secret,
                dsn_secret_key=dsn_secret_key,
                service_account_name=worker_service_account or None,
                image_pull_secrets=tuple(image_pull_secrets),
                log_json=log_json,
                env=plain_env,
                secret_env=secret_env,
                payload_keys_secret=payload_keys_secret or None,
                key_dsn_secret=key_dsn_secret,
                key_dsn_secret_key=key_dsn_secret_key,
                worker_logins=worker_logins,
                network_policy=policy,
            ),
            dsn=dsn or None,
            namespaces=tuple(n for item in namespaces for n in item.replace(",", " ").split()),
            status_interval=status_interval,
            peering=peering,
            priority=priority,
            identity=env.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
            operator_namespace=env.get("POD_NAMESPACE") or None,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Build the settings from ``INTURN_*`` environment variables (used by ``kopf run``),
        through :meth:`from_options`.

        ``INTURN_WORKER_IMAGE`` (required), ``INTURN_DSN``, ``INTURN_DSN_SECRET``,
        ``INTURN_DSN_SECRET_KEY``, ``INTURN_WORKER_SERVICE_ACCOUNT``,
        ``INTURN_STATUS_INTERVAL`` (seconds), ``INTURN_WATCH_NAMESPACES`` (comma-separated),
        ``INTURN_PAYLOAD_KEYS_SECRET``, ``INTURN_KEY_DSN_SECRET``, ``INTURN_KEY_DSN_SECRET_KEY``,
        ``INTURN_WORKER_LOGINS`` (``shared`` or ``per-destination``),
        ``INTURN_WORKER_NETWORK_POLICY`` (JSON: the workers' NetworkPolicy peers).

        Raises:
            Invalid: ``INTURN_WORKER_IMAGE`` is missing, a number is malformed, or an unknown
                worker login mode.
        """
        env = os.environ if env is None else env
        try:
            interval = float(env.get("INTURN_STATUS_INTERVAL", "15"))
        except ValueError:
            raise Invalid("INTURN_STATUS_INTERVAL must be a number of seconds") from None
        try:
            tick = float(env.get("INTURN_RESTORE_TICK_SECONDS", "60"))
        except ValueError:
            raise Invalid("INTURN_RESTORE_TICK_SECONDS must be a number of seconds") from None
        made = cls.from_options(
            image=env.get("INTURN_WORKER_IMAGE"),
            dsn=env.get("INTURN_DSN"),
            dsn_secret=env.get("INTURN_DSN_SECRET", "inturn-db"),
            dsn_secret_key=env.get("INTURN_DSN_SECRET_KEY", "dsn"),
            worker_service_account=env.get("INTURN_WORKER_SERVICE_ACCOUNT"),
            status_interval=interval,
            namespaces=(env.get("INTURN_WATCH_NAMESPACES", ""),),
            payload_keys_secret=env.get("INTURN_PAYLOAD_KEYS_SECRET"),
            key_dsn_secret=env.get("INTURN_KEY_DSN_SECRET", "inturn-keys"),
            key_dsn_secret_key=env.get("INTURN_KEY_DSN_SECRET_KEY", "dsn"),
            worker_logins=env.get("INTURN_WORKER_LOGINS", "shared"),
            worker_network_policy=env.get("INTURN_WORKER_NETWORK_POLICY") or None,
            env=env,
        )
        return dataclasses.replace(made, restore_tick_seconds=max(1.0, tick))
