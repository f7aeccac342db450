"""The console's Deployment and Service in the chart (rendered by the real Helm): off by
default; on, it serves `inturn console` with the auth file and CSRF secret from Secrets."""

from __future__ import annotations

from tests.support.helm_chart import find, of_kind, render


def test_the_console_is_off_by_default() -> None:
    objs = render()
    names = {o["metadata"]["name"] for o in of_kind(objs, "Deployment", "Service")}
    assert not any("console" in n for n in names)


def test_the_console_deployment_and_service() -> None:
    objs = render(files=["console"])
    dep = find(objs, "Deployment", "inturn-console")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["args"] == [
        "console",
        "--listen=0.0.0.0:8080",
        "--auth-file=/etc/inturn/console-auth/auth.yaml",
        "--stuck-after=10m",
        "--csrf-secret-file=/etc/inturn/console-csrf/csrf-secret",
        "--log-json",
    ]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert volumes["auth"]["secretName"] == "inturn-console-auth"
    assert volumes["auth"]["items"] == [{"key": "auth.yaml", "path": "auth.yaml"}]
    assert volumes["csrf"]["secretName"] == "inturn-console-csrf"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["auth"]["readOnly"] and mounts["csrf"]["readOnly"]
    svc = find(objs, "Service", "inturn-console")
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "console"
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("http", 8080)]


def test_the_console_serves_its_own_names_and_the_configured_ones() -> None:
    objs = render({"console": {"enabled": True, "serverNames": ["console.hospital.example"]}})
    (c,) = find(objs, "Deployment", "inturn-console")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["INTURN_CONSOLE_SERVER_NAMES"].split() == [
        "localhost",
        "127.0.0.1",
        "::1",
        "inturn-console",
        "inturn-console.inturn",
        "inturn-console.inturn.svc",
        "console.hospital.example",
    ]


def test_one_replica_needs_no_csrf_secret() -> None:
    objs = render({"console": {"enabled": True}})
    (c,) = find(objs, "Deployment", "inturn-console")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in c["args"] if a.startswith("--csrf-secret-file")]
    assert "csrf" not in {m["name"] for m in c["volumeMounts"]}


def test_the_console_connects_as_its_own_role_and_is_reachable_only_from_its_proxy() -> None:
    own = {"database": {"components": {"console": {"existingSecret": "inturn-db-admin"}}}}
    objs = render(own, files=["console"])
    (c,) = find(objs, "Deployment", "inturn-console")["spec"]["template"]["spec"]["containers"]
    [dsn] = [e for e in c["env"] if e["name"] == "INTURN_DSN"]
    assert dsn["valueFrom"]["secretKeyRef"] == {"name": "inturn-db-admin", "key": "dsn"}
    policy = find(objs, "NetworkPolicy", "inturn-console")
    [users, probes] = policy["spec"]["ingress"]
    assert users["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "oauth2-proxy"}}}
    ]
    assert users["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert probes["ports"] == users["ports"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
