"""The chart's values for the lease and for running behind a pooler reach the workers through
the operator's --worker-env and --worker-secret-env (issue 29)."""

from __future__ import annotations

from tests.support.helm_chart import find, render


def _operator_args(overrides: dict[str, object] | None = None) -> list[str]:
    operator = find(render(overrides), "Deployment", "inturn-operator")
    return list(operator["spec"]["template"]["spec"]["containers"][0]["args"])


def test_by_default_the_workers_keep_their_own_lease_and_poll_defaults() -> None:
    assert not [a for a in _operator_args() if "LEASE" in a or "POLL" in a or "LISTEN" in a]


def test_lease_poll_and_listen_values_become_worker_environment() -> None:
    args = _operator_args(
        {
            "workers": {
                "lease": {"ttlSeconds": 20, "renewSeconds": 5, "acquireSeconds": 2},
                "pollSeconds": 0.5,
                "listenSecret": {"name": "inturn-db-direct", "key": "dsn"},
            }
        }
    )
    assert "--worker-env=INTURN_LEASE_TTL_SECONDS=20" in args
    assert "--worker-env=INTURN_LEASE_RENEW_SECONDS=5" in args
    assert "--worker-env=INTURN_LEASE_ACQUIRE_SECONDS=2" in args
    assert "--worker-env=INTURN_POLL_SECONDS=0.5" in args
    assert "--worker-secret-env=INTURN_LISTEN_DSN=inturn-db-direct/dsn" in args
