"""The operator run by kopf's KopfRunner against the kmock Kubernetes emulator and a real Postgres.

kmock stores objects as plain JSON and merges patches; it has no garbage collector, no
generation bump and no status split, so the tests set ``metadata.generation`` themselves and
play the Deployment controller by patching a worker Deployment's status.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kmock
import psycopg
import pytest

from inturn.operator import manifests
from tests.support.kopf_env import (
    CM,
    DEPLOY,
    DEST,
    EVENTS,
    IMAGE,
    NS,
    ApiServerLikeEmulator,
    destination,
    env,
    eventually,
    obj,
    operator,
    prepare,
)

pytestmark = pytest.mark.kmock(cls=ApiServerLikeEmulator)
__all__ = ["CM", "IMAGE", "env", "prepare"]  # the emulator fixture and names used here by name


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == type_)


def registry_row(dsn: str, key: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT channel, message_types, generation, suspended, deleted_at IS NOT NULL"
            " FROM inturn_destination WHERE destination = %s",
            (key,),
        ).fetchone()


def writes(emulator: kmock.KubernetesEmulator, resource: str | None = None) -> list[Any]:
    out = []
    for request in list(emulator):
        if str(request.method).upper().rsplit(".", 1)[-1] not in {"POST", "PATCH", "PUT", "DELETE"}:
            continue
        if resource is None or (request.resource is not None and request.resource == resource):
            out.append(request)
    return out


def retried(emulator: kmock.KubernetesEmulator) -> list[Any]:
    """:func:`writes` but the restore witness's once-a-tick status patches (docs/howto/backups.md),
    which are not a retry."""

    def witness_only(request: Any) -> bool:
        data = request.data if isinstance(request.data, dict) else {}
        body = data.get("status", data)
        return isinstance(body, dict) and bool(body) and set(body) <= {"witness", "restore"}

    return [r for r in writes(emulator) if not witness_only(r)]


async def available(emulator: kmock.KubernetesEmulator, name: str) -> None:
    """Play the Deployment controller: the worker pod became ready."""
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/{name}/status"
    generation = emulator.objects[DEPLOY, NS, name].raw["metadata"].get("generation", 1)
    await emulator.patch(
        path,
        json={
            "status": {
                "observedGeneration": generation,
                "availableReplicas": 1,
                "readyReplicas": 1,
            }
        },
    )


async def test_create_update_rollout_and_ready(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    async with operator() as runner:
        dep = await eventually(lambda: obj(env, DEPLOY, "lis-worker"))
        cm = obj(env, CM, "lis-worker")
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
        assert dep["metadata"]["ownerReferences"][0]["uid"] == "uid-lis"
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
        first_hash = dep["spec"]["template"]["metadata"]["annotations"][
            manifests.CONFIG_HASH_ANNOTATION
        ]
        assert '"destination": "ward/lis"' in cm["data"]["worker.json"]
        await eventually(lambda: registry_row(fresh_db, "ward/lis") == ("adt", [], 1, False, False))

        # not available yet → Ready False; the "controller" makes it available → Ready True
        await eventually(
            lambda: (
                condition(obj(env, DEST, "lis"), "Ready")["reason"] == "WorkerMissing"
                or condition(obj(env, DEST, "lis"), "Ready")["reason"] == "WorkerUnavailable"
            )
        )
        await available(env, "lis-worker")
        await eventually(lambda: condition(obj(env, DEST, "lis"), "Ready")["status"] == "True")
        body = obj(env, DEST, "lis")
        assert body["status"]["observedGeneration"] == 1
        assert body["status"]["sender"] == "mllp://127.0.0.1:2576"
        assert body["status"]["worker"] == {"deployment": "lis-worker", "available": True}
        assert "kopf.zalando.org" not in str(body["metadata"])

        # update: a spec change rolls the worker through the pod template's hash
        await env.patch(
            f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations/lis",
            json={"spec": {"retry": {"maxAttempts": 9}, "filter": {"messageTypes": ["ADT^A0*"]}}},
        )

        def rolled() -> bool:
            d = obj(env, DEPLOY, "lis-worker")
            h = d["spec"]["template"]["metadata"]["annotations"][manifests.CONFIG_HASH_ANNOTATION]
            return h != first_hash

        await eventually(rolled)
        assert '"maxAttempts": 9' in obj(env, CM, "lis-worker")["data"]["worker.json"]
        await eventually(
            lambda: registry_row(fresh_db, "ward/lis") == ("adt", ["ADT^A0*"], 2, False, False)
        )
        await eventually(lambda: obj(env, DEST, "lis")["status"]["observedGeneration"] == 2)
    assert runner.exception is None


async def test_scale_and_strategy_drift_is_reverted(env: kmock.KubernetesEmulator) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    async with operator():
        await eventually(lambda: obj(env, DEPLOY, "lis-worker"))
        await env.patch(
            f"/apis/apps/v1/namespaces/{NS}/deployments/lis-worker",
            json={"spec": {"replicas": 3}},
        )
        await eventually(lambda: obj(env, DEPLOY, "lis-worker")["spec"]["replicas"] == 1, 5)
        await env.patch(
            f"/apis/apps/v1/namespaces/{NS}/deployments/lis-worker",
            json={
                "spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}
            },
        )
        await eventually(
            lambda: obj(env, DEPLOY, "lis-worker")["spec"]["strategy"] == {"type": "Recreate"}, 5
        )

        def warnings() -> list[dict[str, Any]]:
            return [
                dict(o.raw)
                for (res, ns, _), o in env.objects.items()
                if res == EVENTS
                and ns == NS
                and not o.deleted
                and o.raw.get("reason") == "WorkerDriftReverted"
            ]

        found = await eventually(lambda: len(warnings()) >= 4 and warnings())
        kinds = {e["involvedObject"]["kind"] for e in found}
        assert kinds == {"Deployment", "Destination"}
        assert all(e["type"] == "Warning" for e in found)
        assert any("replicas 3" in e["message"] for e in found)


async def test_delete_keeps_messages_and_marks_registry(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for i in range(3):
            conn.execute(
                "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
                " payload, size) VALUES ('ward/lis', 'adt', %s, 'ADT^A01', 'x', 1)",
                (f"c{i}",),
            )
    async with operator():
        await eventually(lambda: registry_row(fresh_db, "ward/lis") is not None)
        assert not env.objects[DEST, NS, "lis"].raw["metadata"].get("finalizers")
        await env.delete(f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations/lis")
        await eventually(lambda: registry_row(fresh_db, "ward/lis")[4] is True)
    with psycopg.connect(fresh_db) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM inturn_delivery WHERE destination = 'ward/lis'"
            " AND state = 'pending'"
        ).fetchone() or (0,)
    assert count == 3


async def test_field_filters_reach_the_registry_and_follow_the_spec(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    env.objects[DEST, NS, "bed-board"] = destination("bed-board", "engine/bed-board-4w.yaml")

    def fields() -> Any:
        with psycopg.connect(fresh_db) as conn:
            row = conn.execute(
                "SELECT filter_fields FROM inturn_destination WHERE destination = %s",
                (f"{NS}/bed-board",),
            ).fetchone()
        return row[0] if row else "absent"

    async with operator():
        await eventually(lambda: fields() != "absent")
        assert fields() == [
            {"field": "PV1-3", "operator": "Matches", "values": ["4W*"]},
            {"field": "MSH-3", "operator": "In", "values": ["PAS"]},
            {"field": "PID-3.4", "operator": "NotIn", "values": ["TEST"]},
        ]
        await env.patch(
            f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations/bed-board",
            json={
                "spec": {
                    "filter": {"fields": [{"field": "PV1-3", "operator": "In", "values": ["5E"]}]}
                }
            },
        )
        await eventually(
            lambda: fields() == [{"field": "PV1-3", "operator": "In", "values": ["5E"]}]
        )


async def test_a_receiver_profile_reaches_the_registry_and_follows_the_spec(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    """Issue 42: spec.profile is registered as written (with its defaults), for inturn queue
    show, payload --as-sent and the console; a change follows, a removal clears it."""
    env.objects[DEST, NS, "bed-board"] = destination("bed-board", "engine/bed-board-4w.yaml")

    def profile() -> Any:
        with psycopg.connect(fresh_db) as conn:
            row = conn.execute(
                "SELECT profile FROM inturn_destination WHERE destination = %s",
                (f"{NS}/bed-board",),
            ).fetchone()
        return row[0] if row else "absent"

    path = f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations/bed-board"
    async with operator():
        await eventually(lambda: profile() != "absent")
        assert profile() is None
        shaped = {"set": {"MSH-5": "BEDS"}, "charset": {"to": "ASCII"}}
        await env.patch(path, json={"spec": {"profile": shaped}})
        await eventually(lambda: (profile() or {}).get("set") == {"MSH-5": "BEDS"})
        assert profile()["charset"]["to"] == "ASCII"
        await env.patch(path, json={"spec": {"profile": None}})
        await eventually(lambda: profile() is None)


async def test_deletion_missed_while_down_is_caught_by_the_periodic_pass(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES ('ward/gone', 'ward', 'gone', 'adt')"
        )
    env.objects[DEST, NS, "lis"] = destination("lis")
    async with operator():
        await eventually(lambda: registry_row(fresh_db, "ward/gone")[4] is True)
        assert registry_row(fresh_db, "ward/lis") is not None


async def test_status_from_the_real_queue(env: kmock.KubernetesEmulator, fresh_db: str) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
            " size, attempts, last_error, enqueued_at) VALUES"
            " ('ward/lis', 'adt', 'c1', 'ADT^A01', 'MSH|secret', 10, 4,"
            "  'connection: refused by 10.1.2.3', '2026-01-01T10:00:00Z'),"
            " ('ward/lis', 'adt', 'c2', 'ADT^A01', 'MSH|secret', 10, 0, NULL, now())"
        )
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type, payload,"
            " size, state, attempts, finished_at) VALUES"
            " ('ward/lis', 'adt', 'c0', 'ADT^A01', 'x', 1, 'failed', 3, now())"
        )
    async with operator():
        await eventually(lambda: obj(env, DEST, "lis")["status"].get("pending") == 2)
        st = obj(env, DEST, "lis")["status"]
        assert st["failed"] == 1 and st["mostAttempts"] == 4
        assert st["oldestPendingTime"] == "2026-01-01T10:00:00Z"
        delivering = condition(obj(env, DEST, "lis"), "Delivering")
        assert (delivering["status"], delivering["reason"]) == ("False", "Blocked")
        assert "connection" in delivering["message"]
        assert "refused" not in delivering["message"] and "MSH" not in str(st)

        # unchanged status → no more status writes over several periodic passes
        await asyncio.sleep(1.5)
        before = len(writes(env, DEST))
        await asyncio.sleep(3.5)
        for r in writes(env, DEST)[before - 3 :]:
            print("WRITE", r.method, r.url.path, r.data)
        assert len(writes(env, DEST)) == before

        # the queue drains → Idle, figures updated, oldestPendingTime removed
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                "UPDATE inturn_delivery SET state = 'delivered', finished_at = now()"
                " WHERE state = 'pending'"
            )
        await eventually(lambda: condition(obj(env, DEST, "lis"), "Delivering")["reason"] == "Idle")
        st = obj(env, DEST, "lis")["status"]
        assert st["pending"] == 0 and "oldestPendingTime" not in st


@pytest.mark.parametrize(
    ("sender", "field"),
    [
        ({"headers": {"X-Tenant": "a\r\nX-Injected: 1"}}, "spec.sender.http.headers.X-Tenant"),
        ({"headers": {"Bad Name": "x"}}, "spec.sender.http.headers"),
        ({"url": "http://a..b/hl7"}, "spec.sender.http.url"),
    ],
    ids=["crlf-value", "bad-name", "bad-host"],
)
async def test_a_sender_the_worker_would_refuse_is_an_invalid_spec(
    env: kmock.KubernetesEmulator, sender: dict[str, Any], field: str
) -> None:
    bad = destination("refused", "local-http.yaml")
    bad["spec"]["sender"]["http"].update(sender)
    env.objects[DEST, NS, "refused"] = bad  # stored as an older API server would have
    async with operator():
        await eventually(
            lambda: condition(obj(env, DEST, "refused"), "Ready")["reason"] == "InvalidSpec"
        )
        assert field in condition(obj(env, DEST, "refused"), "Ready")["message"]
    assert not any(k[0] == DEPLOY for k in env.objects if not env.objects[k].deleted)


async def test_a_destination_nested_too_deep_is_an_invalid_spec(
    env: kmock.KubernetesEmulator,
) -> None:
    """The operator's reading path has the bounds of every file inturn reads (issue 41, part 4):
    a Destination stored nested 200 levels deep (JSON as the API server keeps it; the snapshot's
    copy of it was recursive) is an InvalidSpec in one line. (Far deeper, kopf's own deep copy
    of the body gives up before any handler of ours runs; a real API server prunes the unknown
    field anyway.)"""
    bad = destination("deep")
    nested: dict[str, Any] = {}
    cur = nested
    for _ in range(200):
        cur["x"] = {}
        cur = cur["x"]
    bad["spec"]["sender"]["mllp"]["extra"] = nested
    env.objects[DEST, NS, "deep"] = bad
    async with operator():
        await eventually(
            lambda: condition(obj(env, DEST, "deep"), "Ready")["reason"] == "InvalidSpec"
        )
        message = condition(obj(env, DEST, "deep"), "Ready")["message"]
        assert "nested deeper than 64 levels" in message and "\n" not in message
    assert not any(k[0] == DEPLOY for k in env.objects if not env.objects[k].deleted)


async def test_invalid_spec_is_reported_without_a_retry_storm(
    env: kmock.KubernetesEmulator,
) -> None:
    bad = destination("bad")
    del bad["spec"]["retry"]["maxAttempts"]
    env.objects[DEST, NS, "bad"] = bad
    async with operator():
        await eventually(
            lambda: condition(obj(env, DEST, "bad"), "Ready")["reason"] == "InvalidSpec"
        )
        ready = condition(obj(env, DEST, "bad"), "Ready")
        assert "spec.retry.maxAttempts: required" in ready["message"]
        await asyncio.sleep(1)
        before = len(retried(env))
        await asyncio.sleep(3)
        assert len(retried(env)) == before  # no retries, no repeated events or patches
    assert not any(k[0] == DEPLOY for k in env.objects if not env.objects[k].deleted)


@pytest.mark.slow  # a restart of the operator: left out by make test-fast
async def test_operator_restart_changes_nothing(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    env.objects[DEST, NS, "web"] = destination("web", "local-http.yaml")
    async with operator():
        await eventually(lambda: obj(env, DEPLOY, "web-worker") and obj(env, DEPLOY, "lis-worker"))
        await available(env, "lis-worker")
        await available(env, "web-worker")
        await eventually(
            lambda: all(
                condition(obj(env, DEST, n), "Ready")["status"] == "True" for n in ("lis", "web")
            )
        )
        await asyncio.sleep(2)  # let the periodic pass settle
    snapshot = {
        k: copy.deepcopy(dict(env.objects[k].raw))
        for k in env.objects
        if not env.objects[k].deleted
    }
    rows_before = registry_row(fresh_db, "ward/lis"), registry_row(fresh_db, "ward/web")
    seen = len(list(env))
    async with operator():
        await asyncio.sleep(5)  # startup, resume handlers, several periodic passes
    new_writes = [
        r
        for r in list(env)[seen:]
        if str(r.method).upper().endswith(("POST", "PATCH", "PUT", "DELETE"))
    ]
    for r in new_writes:
        print("WRITE", r.method, r.url.path, r.data)
    assert new_writes == []
    after = {k: dict(env.objects[k].raw) for k in env.objects if not env.objects[k].deleted}
    assert after == snapshot
    assert (registry_row(fresh_db, "ward/lis"), registry_row(fresh_db, "ward/web")) == rows_before


async def test_a_second_destination_for_a_carrier_is_refused(
    env: kmock.KubernetesEmulator, fresh_db: str
) -> None:
    first = destination("partner-a")
    first["spec"]["carriers"] = ["LH", "OS"]
    env.objects[DEST, NS, "partner-a"] = first
    async with operator() as runner:
        await eventually(lambda: registry_row(fresh_db, "ward/partner-a") is not None)
        second = destination("partner-b")
        second["spec"]["carriers"] = ["UA", "LH"]
        await env.post(f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations", json=second)
        await eventually(
            lambda: condition(obj(env, DEST, "partner-b"), "Ready")["reason"] == "InvalidSpec"
        )
        message = condition(obj(env, DEST, "partner-b"), "Ready")["message"]
        assert "spec.carriers: LH is already served by ward/partner-a" in message
        assert registry_row(fresh_db, "ward/partner-b") is None
        assert (DEPLOY, NS, "partner-b-worker") not in env.objects

        # the first one goes: the periodic pass lets the second one serve LH
        await env.delete(f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations/partner-a")
        await eventually(lambda: registry_row(fresh_db, "ward/partner-b") is not None)
        with psycopg.connect(fresh_db) as conn:
            held = conn.execute(
                "SELECT carrier, destination FROM inturn_destination_carrier ORDER BY 1"
            ).fetchall()
        assert held == [("LH", "ward/partner-b"), ("UA", "ward/partner-b")]
    assert runner.exception is None
