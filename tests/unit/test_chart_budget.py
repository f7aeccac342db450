"""The chart fits a cluster's budget (issue 39, part 4): ingest's replicas have a
PodDisruptionBudget, rendered only where there is more than one replica to keep."""

from __future__ import annotations

from tests.support.helm_chart import of_kind, render


def _budgets(overrides: dict[str, object] | None = None) -> list[dict[str, object]]:
    return of_kind(render(overrides), "PodDisruptionBudget")


def test_ingest_replicas_have_a_disruption_budget() -> None:
    [pdb] = _budgets()
    assert pdb["metadata"]["name"] == "inturn-ingest"  # type: ignore[index]
    spec = pdb["spec"]
    assert spec["maxUnavailable"] == 1  # type: ignore[index]
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "ingest"  # type: ignore[index]


def test_one_replica_or_switched_off_has_none() -> None:
    assert _budgets({"ingest": {"replicas": 1}}) == []
    assert _budgets({"ingest": {"podDisruptionBudget": {"enabled": False}}}) == []
    assert _budgets({"ingest": {"enabled": False}}) == []
