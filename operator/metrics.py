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


def serve(address: str) -> int:
    """Serve ``/metrics`` on ``[HOST:]PORT`` (default host 0.0.0.0) in a daemon thread.

    Returns the bound port (useful with port 0). Raises ValueError for a malformed address and
    OSError when the port is taken.
    """
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"--metrics: expected [HOST:]PORT, got {address!r}")
    server, _thread = start_http_server(int(port), addr=host or "0.0.0.0")
    return int(server.server_port)
