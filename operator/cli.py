"""``inturn operator`` (run the Destination operator) and ``inturn crd`` (print the CRD).

Registered lazily by :mod:`inturn.worker.cli`, so the worker never imports kopf.
"""

from __future__ import annotations

from pathlib import Path

import click

from inturn.worker.cli.options import dsn_option
from inturn.worker.spec import schema


@click.command("operator")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    envvar="INTURN_WATCH_NAMESPACES",
    help="Watch only this namespace (repeatable). Default: the whole cluster.",
)
@click.option("--image", envvar="INTURN_WORKER_IMAGE", required=True, help="Worker image.")
@click.option(
    "--image-pull-policy",
    type=click.Choice(["IfNotPresent", "Always", "Never"]),
    default="IfNotPresent",
    show_default=True,
    help="Pull policy of worker pods.",
)
@click.option("--image-pull-secret", multiple=True, help="Image pull Secret of workers.")
@dsn_option("The operator's own Postgres connection string.")
@click.option(
    "--dsn-secret",
    envvar="INTURN_DSN_SECRET",
    default="inturn-db",
    show_default=True,
    help="Secret (in each Destination's namespace) holding the workers' DSN.",
)
@click.option(
    "--dsn-secret-key",
    envvar="INTURN_DSN_SECRET_KEY",
    default="dsn",
    show_default=True,
    help="Key of --dsn-secret holding the DSN.",
)
@click.option(
    "--payload-keys-secret",
    envvar="INTURN_PAYLOAD_KEYS_SECRET",
    default=None,
    help="Secret of master keys (in each Destination's namespace) mounted in every worker:"
    " payloads are encrypted at rest (the chart's encryption.secretName).",
)
@click.option(
    "--key-dsn-secret",
    envvar="INTURN_KEY_DSN_SECRET",
    default="inturn-keys",
    show_default=True,
    help="Secret (in each Destination's namespace) holding the key store's DSN.",
)
@click.option(
    "--key-dsn-secret-key",
    envvar="INTURN_KEY_DSN_SECRET_KEY",
    default="dsn",
    show_default=True,
    help="Key of --key-dsn-secret holding the DSN.",
)
@click.option(
    "--worker-logins",
    envvar="INTURN_WORKER_LOGINS",
    type=click.Choice(["shared", "per-destination"]),
    default="shared",
    show_default=True,
    help="How workers log in to Postgres: all as --dsn-secret's user (shared), or each as its"
    " destination's own login, which the operator makes with the Destination (a role that"
    " reaches that destination's rows only) and keeps in a Secret <name>-worker-login.",
)
@click.option(
    "--worker-network-policy",
    envvar="INTURN_WORKER_NETWORK_POLICY",
    default=None,
    metavar="JSON",
    help="Make a NetworkPolicy for each Destination's worker pods (owned by it): a JSON object"
    ' of its peers, e.g. {"monitoring": [{"namespaceSelector": ...}], "postgresPort": 5432,'
    ' "postgresTo": [...], "dnsTo": [...], "receivers": [...]} (each optional; receivers'
    " empty: any address). Unset: none (the chart makes one per watched namespace).",
)
@click.option(
    "--worker-service-account",
    envvar="INTURN_WORKER_SERVICE_ACCOUNT",
    default=None,
    help="Service account of worker pods (no API token is mounted).",
)
@click.option(
    "--status-interval",
    type=click.FloatRange(1, 3600),
    default=15,
    show_default=True,
    help="Seconds between periodic passes (depth query, status, drift, registry).",
)
@click.option(
    "--liveness",
    default="http://127.0.0.1:8080/healthz",
    show_default=True,
    help="Liveness endpoint URL ('' to disable); this machine only unless its host says"
    " otherwise (the chart passes http://0.0.0.0:8080/healthz, for the kubelet's probe).",
)
@click.option(
    "--metrics",
    metavar="[HOST:]PORT",
    default="",
    help="Serve Prometheus metrics (/metrics) here ('' to disable, the default); host"
    " 127.0.0.1 unless given (the chart passes 0.0.0.0, for Prometheus).",
)
@click.option(
    "--peering",
    envvar="INTURN_OPERATOR_PEERING",
    default=None,
    help="kopf peering object name: a second replica waits instead of acting. Default: standalone.",
)
@click.option("--priority", type=int, default=None, help="Peering priority (default: random).")
@click.option(
    "--log-format",
    envvar="INTURN_LOG_FORMAT",
    show_envvar=True,
    type=click.Choice(["plain", "full", "json"]),
    default="full",
    show_default=True,
    help="kopf's log format (json also makes the workers log JSON).",
)
@click.option(
    "--verbose", envvar="INTURN_VERBOSE", show_envvar=True, is_flag=True, help="Debug logging."
)
@click.option(
    "--worker-env",
    multiple=True,
    metavar="NAME=VALUE",
    help="An environment variable of every worker (e.g. INTURN_WORKLIST_NATS_URL=...); repeatable.",
)
@click.option(
    "--worker-secret-env",
    multiple=True,
    metavar="NAME=SECRET/KEY",
    help="An environment variable of every worker from a key of a Secret in the Destination's"
    " namespace (e.g. INTURN_WORKLIST_WEBHOOK_SECRET=worklist-hook/secret); repeatable.",
)
def operator_command(
    namespaces: tuple[str, ...],
    image: str,
    image_pull_policy: str,
    image_pull_secret: tuple[str, ...],
    dsn: str | None,
    dsn_secret: str,
    dsn_secret_key: str,
    payload_keys_secret: str | None,
    key_dsn_secret: str,
    key_dsn_secret_key: str,
    worker_logins: str,
    worker_network_policy: str | None,
    worker_service_account: str | None,
    status_interval: float,
    liveness: str,
    metrics: str,
    peering: str | None,
    priority: int | None,
    log_format: str,
    worker_env: tuple[str, ...],
    worker_secret_env: tuple[str, ...],
    verbose: bool,
) -> None:
    """Run the Destination operator (kopf): one worker Deployment per Destination."""

    import kopf

    from inturn.operator import handlers
    from inturn.operator.config import OperatorConfig
    from inturn.worker.errors import Invalid

    try:
        config = OperatorConfig.from_options(
            image=image,
            image_pull_policy=image_pull_policy,
            image_pull_secrets=image_pull_secret,
            dsn=dsn,
            dsn_secret=dsn_secret,
            dsn_secret_key=dsn_secret_key,
            worker_service_account=worker_service_account,
            status_interval=status_interval,
            namespaces=namespaces,
            peering=peering,
            priority=priority,
            log_json=log_format == "json",
            worker_env=worker_env,
            worker_secret_env=worker_secret_env,
            payload_keys_secret=payload_keys_secret,
            key_dsn_secret=key_dsn_secret,
            key_dsn_secret_key=key_dsn_secret_key,
            worker_logins=worker_logins,
            worker_network_policy=worker_network_policy,
        )
    except Invalid as exc:
        raise click.BadParameter(str(exc)) from None
    names, identity, priority = config.namespaces, config.identity, config.priority
    if metrics:
        from inturn.operator.metrics import serve

        try:
            serve(metrics)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics") from exc
    kopf.configure(
        verbose=verbose,
        log_format={
            "plain": kopf.LogFormat.PLAIN,
            "full": kopf.LogFormat.FULL,
            "json": kopf.LogFormat.JSON,
        }[log_format],
    )
    kopf.run(
        clusterwide=not names,
        namespaces=names,
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        identity=identity,  # type: ignore[arg-type]  # a NewType of str
        liveness_endpoint=liveness or None,
        memo=handlers.run_memo(config),
    )


@click.command("crd")
@click.option("--chart", is_flag=True, help="Print the Helm chart's template instead.")
@click.option(
    "--check",
    "check_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Fail if the generated files under this repository root are stale.",
)
def crd_command(chart: bool, check_root: Path | None) -> None:
    """Print the Destination CustomResourceDefinition (generated from the schema)."""
    if check_root is not None:
        code = schema.main(["--root", str(check_root), "--check"])
        if code:
            raise click.exceptions.Exit(code)
        return
    click.echo(schema.render_chart_crd_template() if chart else schema.render_crd_yaml(), nl=False)
