"""The chart gives ingest the memory its configuration needs, by the formula the docs give
(docs/explanation/memory.md) and :func:`inturn.worker.ingest.budget.limit_for` computes, and
tells ingest its limit so that the message budget follows from it."""

from __future__ import annotations

from typing import Any

import pytest

from inturn.worker.ingest.budget import (
    BASE_BYTES,
    CONNECTION_BYTES,
    COPIES,
    budget_for,
    limit_for,
)
from tests.support.helm_chart import find, lint, render

MIB = 1024 * 1024


def ingest_container(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    dep = find(render(overrides), "Deployment", "inturn-ingest")
    [container] = dep["spec"]["template"]["spec"]["containers"]
    return container


def mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


@pytest.mark.parametrize(("max_mib", "count"), [(16, 4), (16, 2), (4, 10), (64, 1), (1, 1)])
def test_memory_request_and_limit_follow_the_formula(max_mib: int, count: int) -> None:
    container = ingest_container(
        {"ingest": {"maxMessageMiB": max_mib, "concurrentMessages": count}}
    )
    resources = container["resources"]
    limit = mebibytes(resources["limits"]["memory"]) * MIB
    request = mebibytes(resources["requests"]["memory"]) * MIB
    assert limit == limit_for(max_mib * MIB, count)
    assert limit - BASE_BYTES - COPIES * count * max_mib * MIB == -(-count // 4) * MIB
    assert request == limit_for(max_mib * MIB, 1)
    # the budget ingest derives from that limit holds `count` messages of the largest size,
    # each with its connection's own bytes
    assert budget_for(limit) >= count * (max_mib * MIB + CONNECTION_BYTES)
    assert budget_for(request) >= max_mib * MIB + CONNECTION_BYTES
    assert f"--max-frame-bytes={max_mib}Mi" in container["args"]
    assert resources["requests"]["cpu"] == "50m"


def test_defaults_give_four_16_mib_messages_in_353_mib() -> None:
    resources = ingest_container()["resources"]
    assert resources["limits"]["memory"] == "353Mi"
    assert resources["requests"]["memory"] == "161Mi"


def test_ingest_is_told_its_limit() -> None:
    env = {e["name"]: e for e in ingest_container()["env"]}
    assert env["INTURN_MEMORY_LIMIT"]["valueFrom"] == {
        "resourceFieldRef": {"containerName": "ingest", "resource": "limits.memory"}
    }


def test_memory_set_by_hand_wins() -> None:
    resources = ingest_container(
        {"ingest": {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}}}
    )["resources"]
    assert resources["requests"]["memory"] == "1Gi" and resources["limits"]["memory"] == "2Gi"


def test_the_chart_lints_with_other_sizes() -> None:
    assert lint({"ingest": {"maxMessageMiB": 32, "concurrentMessages": 3}}) == []
