"""The Argo CD health check of a Destination (Lua, run here by Lua 5.1 as Argo CD's gopher-lua
is), fed the status the operator's own pure status code writes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from inturn.operator.status import QueueDepth, WorkerDeployment, desired_status

lua51 = pytest.importorskip("lupa.lua51", reason="lupa (a test extra) runs the Lua check")

PATCH = Path(__file__).resolve().parents[2] / "deploy" / "argocd" / "argocd-cm-health.yaml"
KEY = "resource.customizations.health.inturn.dev_Destination"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """Run the check as Argo CD does: a global ``obj``, the script's return value."""
    lua = lua51.LuaRuntime()
    script = yaml.safe_load(PATCH.read_text())["data"][KEY]
    lua.globals().obj = to_lua(lua, obj)
    result = lua.execute(script)
    return str(result["status"]), str(result["message"])


def to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([to_lua(lua, v) for v in value])
    return value


def destination(generation: int = 1, **status_args: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "generation": generation,
        "previous": None,
        "worker": WorkerDeployment("lab-worker", exists=True, available=True),
        "depth": QueueDepth(),
        "suspended": False,
        "sender": "mllp",
        "now": NOW,
    }
    args.update(status_args)
    return {
        "apiVersion": "inturn.dev/v1alpha1",
        "kind": "Destination",
        "metadata": {"name": "lab", "namespace": "hospital", "generation": generation},
        "status": desired_status(**args),
    }


def test_no_status_yet_is_progressing() -> None:
    obj = destination()
    del obj["status"]
    assert health(obj) == ("Progressing", "Waiting for the inturn operator")


def test_an_old_generation_is_progressing() -> None:
    obj = destination(generation=2)
    obj["status"]["observedGeneration"] = 1
    status, message = health(obj)
    assert (status, message) == ("Progressing", "The operator has not reconciled generation 2 yet")


def test_ready_is_healthy_with_how_delivery_goes() -> None:
    assert health(destination()) == ("Healthy", "No message is waiting.")
    blocked = destination(depth=QueueDepth(pending=3, head_attempts=2, head_error="timeout: x"))
    status, message = health(blocked)
    assert status == "Healthy" and message.startswith("The head message failed 2 attempts")


def test_worker_starting_is_progressing() -> None:
    obj = destination(worker=WorkerDeployment("lab-worker", exists=True, available=False))
    assert health(obj) == (
        "Progressing",
        "The worker Deployment lab-worker has no available pod holding the queue.",
    )
    assert health(destination(worker=WorkerDeployment("lab-worker")))[0] == "Progressing"


def test_invalid_spec_is_degraded_and_suspended_is_suspended() -> None:
    status, message = health(destination(invalid="spec.sender: exactly one of mllp, http"))
    assert status == "Degraded" and "spec.sender" in message
    assert health(destination(suspended=True)) == (
        "Suspended",
        "Delivery is suspended (spec.suspend is true).",
    )
