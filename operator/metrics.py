"""Prometheus metrics of the operator, served on ``inturn operator --metrics [HOST:]PORT``.

kopf exposes none of its own; what the chart's PrometheusRule alerts on is counted here.
"""

from __future__ import annotations

from prometheus_client import Counter, start_http_server

RECONCILE_ERRORS = Counter(
    "inturn_operator_reconcile_errors",
    "Reconciles that failed (and will be retried), by where they ran: destination (a create,"
    " update or resume handler), worker (a worker Deployment event), pass (the periodic pass).",
    ["handler"],
)
for _handler in ("destination", "worker", "pass"):
    RECONCILE_ERRORS.labels(_handler)  # exported as 0 from the start, so increase() works


#: Where ``--metrics PORT`` listens when no host is given: this machine only.
DEFAULT_HOST = "127.0.0.1"


def serve(address: str) -> int:
    """Serve ``/metrics`` on ``[HOST:]PORT`` in a daemon thread; without a host on 127.0.0.1
    (:data:`DEFAULT_HOST`: the endpoint is unauthenticated; a pod passes 0.0.0.0, as the chart
    does, for Prometheus).

    Returns the bound port (useful with port 0). Raises ValueError for a malformed address and
    OSError when the port is taken.
    """
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"--metrics: expected [HOST:]PORT, got {address!r}")
    server, _thread = start_http_server(int(port), addr=host or DEFAULT_HOST)
    return int(server.server_port)
