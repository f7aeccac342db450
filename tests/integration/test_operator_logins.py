"""The operator gives each Destination's worker a login of its own (``--worker-logins
per-destination``, issue 41 part 1): a Secret ``<name>-worker-login`` owned by the Destination,
the database login made from it (a member of the worker role scoped to that destination), the
worker Deployment reading both from the Secret; the login dropped when the Destination goes.
kmock stands in for the API server, the database is real."""

from __future__ import annotations

from typing import Any

import kmock
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from inturn.operator import manifests
from tests.support.kopf_env import (
    DEPLOY,
    DEST,
    NS,
    ApiServerLikeEmulator,
    destination,
    env,
    eventually,
    obj,
    operator,
)

pytestmark = [pytest.mark.kmock(cls=ApiServerLikeEmulator), pytest.mark.store]
__all__ = ["env"]  # the emulator fixture of test_operator, used here by name
SECRETS = "v1/secrets"


def login_row(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT s.role::text, s.destination, r.rolcanlogin FROM inturn_worker_scope s"
            " JOIN pg_roles r ON r.rolname = s.role"
        ).fetchall()


async def test_each_worker_gets_a_login_of_its_own(
    env: kmock.KubernetesEmulator,
    fresh_db: str,
    role_dsns: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INTURN_WORKER_LOGINS", "per-destination")
    env.objects[DEST, NS, "lis"] = destination("lis")
    async with operator():
        secret = await eventually(lambda: obj(env, SECRETS, "lis-worker-login"))
        deployment = await eventually(lambda: obj(env, DEPLOY, "lis-worker"))
        rows = await eventually(lambda: login_row(fresh_db))
        values = secret["stringData"]
        assert rows == [(values["user"], f"{NS}/lis", True)]
        assert len(values["password"]) >= 40
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-lis"
        env_vars = {
            e["name"]: e.get("valueFrom", {}).get("secretKeyRef")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env_vars["INTURN_DB_USER"] == {"name": "lis-worker-login", "key": "user"}
        assert env_vars["INTURN_DB_PASSWORD"] == {"name": "lis-worker-login", "key": "password"}
        # the login reaches its destination only
        with psycopg.connect(make_conninfo(fresh_db, user=values["user"])) as conn:
            assert conn.execute("SELECT inturn_worker_destination()").fetchone() == (f"{NS}/lis",)
        # a login dropped by hand (a database restored from before it) comes back with the
        # Secret's password when the operator restarts
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("SELECT inturn_worker_logout(%s)", (f"{NS}/lis",))
    async with operator():
        await eventually(lambda: login_row(fresh_db))
        assert login_row(fresh_db)[0][0] == values["user"]
        assert obj(env, SECRETS, "lis-worker-login")["stringData"] == values
        await env.delete(f"/apis/inturn.dev/v1alpha1/namespaces/{NS}/destinations/lis")
        await eventually(lambda: login_row(fresh_db) == [])
    with psycopg.connect(fresh_db) as conn:
        gone = conn.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname = %s", (values["user"],)
        ).fetchone()
    assert gone == (0,)


async def test_shared_logins_make_no_secret(
    env: kmock.KubernetesEmulator, fresh_db: str, role_dsns: dict[str, str]
) -> None:
    env.objects[DEST, NS, "lis"] = destination("lis")
    async with operator():
        deployment = await eventually(lambda: obj(env, DEPLOY, "lis-worker"))
    names = [e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert "INTURN_DB_USER" not in names
    assert (SECRETS, NS, "lis-worker-login") not in env.objects
    assert login_row(fresh_db) == []


def test_the_login_secret_is_pure() -> None:
    body = destination("lis")
    secret = manifests.login_secret(body, "inturn_worker_0123456789ab", "pw")
    assert secret["metadata"]["name"] == "lis-worker-login"
    assert secret["stringData"] == {"user": "inturn_worker_0123456789ab", "password": "pw"}
    assert secret["metadata"]["labels"][manifests.DESTINATION_LABEL] == "lis"


def test_the_deployment_reads_its_login_from_the_secret_only_per_destination() -> None:
    from inturn.operator.config import OperatorConfig
    from inturn.worker.errors import Invalid

    def env_of(mode: str) -> dict[str, Any]:
        settings = manifests.WorkerPodSettings(image="img:1", worker_logins=mode)
        children = manifests.render(destination("lis"), settings)
        container = children.deployment["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("valueFrom") for e in container["env"]}

    per = env_of("per-destination")
    assert per["INTURN_DB_USER"] == {"secretKeyRef": {"name": "lis-worker-login", "key": "user"}}
    assert per["INTURN_DB_PASSWORD"] == {
        "secretKeyRef": {"name": "lis-worker-login", "key": "password"}
    }
    assert "INTURN_DB_USER" not in env_of("shared")
    with pytest.raises(Invalid, match="--worker-logins"):
        OperatorConfig.from_options(image="img:1", worker_logins="each")
    with pytest.raises(ValueError, match="INTURN_DB_USER"):
        manifests.parse_worker_env(["INTURN_DB_USER=someone"], [])
