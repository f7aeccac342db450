"""The operator's /metrics endpoint (a real socket) and its reconcile-error counter."""

from __future__ import annotations

import urllib.request

import pytest

from inturn.operator.metrics import RECONCILE_ERRORS, serve


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inturn_operator_reconcile_errors_total")
    }


def test_reconcile_errors_are_exported_from_zero_and_counted() -> None:
    port = serve("127.0.0.1:0")
    before = scrape(port)
    assert set(before) == {
        f'inturn_operator_reconcile_errors_total{{handler="{h}"}}'
        for h in ("destination", "worker", "pass")
    }
    RECONCILE_ERRORS.labels("pass").inc()
    after = scrape(port)
    key = 'inturn_operator_reconcile_errors_total{handler="pass"}'
    assert after[key] == before[key] + 1


def test_a_malformed_address_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[HOST:\]PORT"):
        serve("localhost:http")
