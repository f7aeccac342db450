"""Workers get a NetworkPolicy by default (issue 39, part 4): an operator that watches the whole
cluster (the chart then knows no namespace to put one in) makes one per Destination, owned by
it: its health and metrics port from the monitoring peers only, out to Postgres, DNS and the
receivers. kmock stands in for the API server."""

from __future__ import annotations

import json

import kmock
import pytest

from inturn.operator import manifests
from inturn.operator.config import OperatorConfig
from inturn.worker.errors import Invalid
from tests.support.kopf_env import (
    DEST,
    NS,
    ApiServerLikeEmulator,
    destination,
    env,
    eventually,
    obj,
    operator,
)

pytestmark = [pytest.mark.kmock(cls=ApiServerLikeEmulator)]
__all__ = ["env"]  # the emulator fixture of test_operator, used here by name

POLICIES = "networking.k8s.io/v1/networkpolicies"
PEERS = {
    "monitoring": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
    "postgresPort": 6432,
    "postgresTo": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
    "dnsTo": [],
    "receivers": [],
}


async def test_the_operator_makes_each_workers_network_policy(
    env: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTURN_WORKER_NETWORK_POLICY", json.dumps(PEERS))
    env.objects[DEST, NS, "lis"] = destination("lis")
    async with operator():
        policy = await eventually(lambda: obj(env, POLICIES, "lis-worker"))
    spec = policy["spec"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-lis"
    assert spec["podSelector"] == {"matchLabels": manifests.selector_labels("lis")}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [
        {"from": PEERS["monitoring"], "ports": [{"protocol": "TCP", "port": 8080}]}
    ]
    assert spec["egress"] == [
        {"ports": [{"protocol": "TCP", "port": 6432}], "to": PEERS["postgresTo"]},
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {},  # receivers are anywhere
    ]


def test_without_monitoring_peers_nothing_may_come_in_and_bad_peers_are_refused() -> None:
    settings = manifests.WorkerPodSettings(image="img:1", network_policy={"receivers": []})
    policy = manifests.network_policy(destination("lis"), settings)
    assert policy is not None and policy["spec"]["ingress"] == []
    narrowed = {"receivers": [{"to": [{"ipBlock": {"cidr": "10.30.0.0/16"}}]}]}
    settings = manifests.WorkerPodSettings(image="img:1", network_policy=narrowed)
    policy = manifests.network_policy(destination("lis"), settings)
    assert policy is not None and policy["spec"]["egress"][2:] == narrowed["receivers"]
    assert (
        manifests.network_policy(destination("lis"), manifests.WorkerPodSettings(image="img:1"))
        is None
    )
    for bad, why in (
        ("[]", "a JSON object"),
        ('{"monitor": []}', "unknown key(s) monitor"),
        ('{"receivers": {}}', "receivers is a list"),
        ('{"postgresPort": 0}', "postgresPort is a port number"),
        ("{", "--worker-network-policy"),
    ):
        with pytest.raises(Invalid, match=why.replace("(", r"\(").replace(")", r"\)")):
            OperatorConfig.from_options(image="img:1", worker_network_policy=bad)
