"""The Helm chart, rendered without helm and validated against the Kubernetes schemas.

No ``helm`` binary can be installed here (it is not on PyPI for Python 3.11 nor in Debian), so
this test carries a small interpreter of the Go-template subset the chart is written in (text,
``if/else/end``, ``range``, ``with``, ``define``/``include``, ``$var :=``, pipelines and the
functions used: default, quote, toYaml, nindent, indent, trunc, trimSuffix, printf, and, or,
not). The chart deliberately sticks to that subset; ``helm lint --strict`` and ``helm template``
belong in CI wherever helm exists. Every rendered document is validated with
``kubernetes-validate`` (strict) for each cluster version we claim.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inturn.worker import schema

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inturn"
CLUSTER_VERSIONS = ("1.29.0", "1.31.0", "1.33.0")

# --- a Go-template subset ---------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\(|\)|\||:=|[^\s()|]+')


def _lex(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(text):
        chunk = text[pos : m.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        out.append(("text", chunk))
        out.append(("action", m.group(2)))
        trim_next = bool(m.group(3))
        pos = m.end()
    tail = text[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _parse(
    tokens: list[tuple[str, str]], i: int = 0, stop: tuple[str, ...] = ()
) -> tuple[list[Any], int, str]:
    nodes: list[Any] = []
    while i < len(tokens):
        kind, body = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", body))
            continue
        word = body.split(None, 1)[0] if body else ""
        rest = body[len(word) :].strip()
        if word in stop:
            return nodes, i, body
        if word in ("if", "range", "with"):
            then, i, ended = _parse(tokens, i, ("else", "end"))
            other: list[Any] = []
            if ended.startswith("else"):
                other, i, _ = _parse(tokens, i, ("end",))
            nodes.append((word, rest, then, other))
        elif word == "define":
            inner, i, _ = _parse(tokens, i, ("end",))
            nodes.append(("define", json.loads(rest), inner))
        elif len(body.split()) > 2 and body.split()[1] == ":=":
            nodes.append(("assign", body.split()[0], body.split(None, 2)[2]))
        else:
            nodes.append(("expr", body))
    return nodes, i, ""


class Template:
    """Renders the chart's templates with given values."""

    def __init__(self, chart: Path, values: dict[str, Any], namespace: str = "inturn") -> None:
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        self.root = {
            "Values": values,
            "Release": {"Name": "inturn", "Namespace": namespace, "Service": "Helm"},
            "Chart": {
                "Name": meta["name"],
                "Version": meta["version"],
                "AppVersion": meta["appVersion"],
            },
        }
        self.defines: dict[str, list[Any]] = {}
        self.files = sorted((chart / "templates").rglob("*"))
        for path in self.files:
            if path.name.endswith(".tpl"):
                self._render(_parse(_lex(path.read_text()))[0], self.root, {})

    def render_all(self) -> dict[str, str]:
        return {
            str(p.relative_to(CHART)): self._render(_parse(_lex(p.read_text()))[0], self.root, {})
            for p in self.files
            if p.suffix == ".yaml"
        }

    # evaluation

    def _render(self, nodes: list[Any], dot: Any, env: dict[str, Any]) -> str:
        out: list[str] = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "expr":
                out.append(self._fmt(self._pipe(node[1], dot, env)))
            elif kind == "assign":
                env[node[1]] = self._pipe(node[2], dot, env)
            elif kind == "define":
                self.defines[node[1]] = node[2]
            elif kind == "if":
                branch = node[2] if _truthy(self._pipe(node[1], dot, env)) else node[3]
                out.append(self._render(branch, dot, env))
            elif kind == "with":
                value = self._pipe(node[1], dot, env)
                out.append(
                    self._render(node[2], value, env)
                    if _truthy(value)
                    else self._render(node[3], dot, env)
                )
            elif kind == "range":
                items = self._pipe(node[1], dot, env) or []
                for item in items.values() if isinstance(items, dict) else items:
                    out.append(self._render(node[2], item, env))
        return "".join(out)

    def _pipe(self, text: str, dot: Any, env: dict[str, Any]) -> Any:
        tokens = _TOKEN.findall(text)
        value, _ = self._pipeline(tokens, 0, dot, env)
        return value

    def _pipeline(
        self, tokens: list[str], i: int, dot: Any, env: dict[str, Any]
    ) -> tuple[Any, int]:
        value: Any = _MISSING
        while i < len(tokens) and tokens[i] != ")":
            cmd: list[Any] = []
            while i < len(tokens) and tokens[i] not in ("|", ")"):
                if tokens[i] == "(":
                    sub, i = self._pipeline(tokens, i + 1, dot, env)
                    cmd.append(("value", sub))
                    i += 1  # the ")"
                else:
                    cmd.append(("token", tokens[i]))
                    i += 1
            value = self._command(cmd, value, dot, env)
            if i < len(tokens) and tokens[i] == "|":
                i += 1
        return value, i

    def _command(self, cmd: list[Any], piped: Any, dot: Any, env: dict[str, Any]) -> Any:
        head_kind, head = cmd[0]
        if (
            head_kind == "token"
            and re.match(r"^[a-zA-Z]\w*$", head)
            and head not in ("true", "false")
        ):
            args = [self._term(t, dot, env) for t in cmd[1:]]
            if piped is not _MISSING:
                args.append(piped)
            return self._call(head, args)
        return self._term(cmd[0], dot, env)

    def _term(self, term: tuple[str, Any], dot: Any, env: dict[str, Any]) -> Any:
        kind, tok = term
        if kind == "value":
            return tok
        if tok.startswith('"'):
            return json.loads(tok)
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        if tok in ("true", "false"):
            return tok == "true"
        if tok == ".":
            return dot
        if tok.startswith("$"):
            name, _, path = tok.partition(".")
            base = self.root if name == "$" else env[name]
            return _lookup(base, path)
        if tok.startswith("."):
            return _lookup(dot, tok[1:])
        raise ValueError(f"unsupported term {tok!r}")

    def _call(self, name: str, args: list[Any]) -> Any:
        if name == "include":
            return self._render(self.defines[args[0]], args[1], {})
        if name == "default":
            return args[1] if len(args) > 1 and _truthy(args[1]) else args[0]
        if name == "quote":
            return json.dumps(self._fmt(args[0]))
        if name == "toYaml":
            return yaml.safe_dump(args[0], default_flow_style=False, sort_keys=True).rstrip("\n")
        if name in ("nindent", "indent"):
            pad = " " * args[0]
            body = "\n".join(pad + line if line else line for line in str(args[1]).split("\n"))
            return "\n" + body if name == "nindent" else body
        if name == "trunc":
            return str(args[1])[: args[0]]
        if name == "trimSuffix":
            s = str(args[1])
            return s[: -len(args[0])] if args[0] and s.endswith(args[0]) else s
        if name == "printf":
            return args[0] % tuple(args[1:])
        if name == "and":
            return all(_truthy(a) for a in args) and args[-1]
        if name == "or":
            return next((a for a in args if _truthy(a)), args[-1])
        if name == "not":
            return not _truthy(args[0])
        raise ValueError(f"unsupported function {name!r}")

    @staticmethod
    def _fmt(value: Any) -> str:
        if value is None or value is _MISSING:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


_MISSING = object()


def _truthy(value: Any) -> bool:
    return value not in (None, _MISSING, False, 0, "") and not (
        isinstance(value, list | dict) and not value
    )


def _lookup(base: Any, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        base = base.get(part) if isinstance(base, dict) else None
    return base


# --- the tests -------------------------------------------------------------------------------


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = []
    for name, text in Template(CHART, values).render_all().items():
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                doc["__file"] = name
                docs.append(doc)
    return docs


def namespaced_values() -> dict[str, Any]:
    values = default_values()
    values["operator"]["watchNamespaces"] = ["ward-a", "ward-b"]
    values["imagePullSecrets"] = [{"name": "regcred"}]
    values["operator"]["nodeSelector"] = {"kubernetes.io/os": "linux"}
    values["ingest"]["channels"] = [{"name": "adt", "port": 2575}, {"name": "lab", "port": 2576}]
    return values


VALUE_SETS = {"default": default_values, "namespaced": namespaced_values}


def kinds(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"] + "@" + d["metadata"].get("namespace", "")): d
        for d in docs
    }


def pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "Job"):
        yield spec["template"]["spec"]
    if doc["kind"] == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]


def test_values_match_their_schema() -> None:
    values_schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(values_schema)
    validator.validate(default_values())
    validator.validate(namespaced_values())
    typo = default_values()
    typo["operator"]["statusInterval"] = 5
    assert not validator.is_valid(typo)


@pytest.mark.parametrize("version", CLUSTER_VERSIONS)
@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rendered_objects_are_valid(values: str, version: str) -> None:
    docs = render(VALUE_SETS[values]())
    assert docs
    for doc in docs:
        body = {k: v for k, v in doc.items() if k != "__file"}
        kubernetes_validate.validate(body, version, strict=True)


def test_crd_template_is_the_generated_crd_and_is_kept() -> None:
    docs = [d for d in render(default_values()) if d["kind"] == "CustomResourceDefinition"]
    dest = next(d for d in docs if d["metadata"]["name"] == schema.CRD_NAME)
    assert dest["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    del dest["metadata"]["annotations"], dest["__file"]
    assert dest == schema.crd()
    values = default_values()
    values["crds"]["enabled"] = False
    assert not [d for d in render(values) if d["kind"] == "CustomResourceDefinition"]


def test_operator_is_a_single_peered_replica() -> None:
    docs = kinds(render(default_values()))
    op = docs[("Deployment", "inturn-operator@inturn")]
    assert op["spec"]["replicas"] == 1 and op["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = op["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["inturn"] and c["args"][0] == "operator"
    assert "--peering=inturn" in c["args"]
    assert "--image=ghcr.io/example/inturn:0.1.0" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= {
        name.split("@")[0] for kind, name in docs if kind == "CustomResourceDefinition"
    }


def test_rbac_is_least_privilege() -> None:
    for values in VALUE_SETS.values():
        for doc in render(values()):
            if doc["kind"] not in ("ClusterRole", "Role"):
                continue
            for rule in doc["rules"]:
                assert "secrets" not in rule["resources"]
                assert "*" not in rule["verbs"] and "delete" not in rule["verbs"]
    namespaced = kinds(render(namespaced_values()))
    assert ("Role", "inturn-operator@ward-a") in namespaced
    assert ("RoleBinding", "inturn-operator@ward-b") in namespaced
    cluster = namespaced[("ClusterRole", "inturn-operator-cluster@")]
    assert not any("destinations" in r["resources"] for r in cluster["rules"])
    op = namespaced[("Deployment", "inturn-operator@inturn")]
    args = op["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ward-a" in args and "--namespace=ward-b" in args


def test_every_pod_is_restricted() -> None:
    for doc in render(namespaced_values()):
        for pod in pod_specs(doc):
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"] == {"drop": ["ALL"]}
                assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
                assert c["resources"]["limits"]["memory"]
            if doc["metadata"]["name"] != "inturn-operator":
                assert pod["automountServiceAccountToken"] is False


def test_cronjobs_and_migrate_hook() -> None:
    values = copy.deepcopy(default_values())
    values["sweeper"]["enabled"] = True  # off by default until `inturn sweep` exists
    docs = kinds(render(values))
    assert ("CronJob", "inturn-sweeper@inturn") not in kinds(render(default_values()))
    for name in ("inturn-purge@inturn", "inturn-sweeper@inturn"):
        cron = docs[("CronJob", name)]["spec"]
        assert cron["concurrencyPolicy"] == "Forbid"
        assert cron["startingDeadlineSeconds"] >= 10
        assert cron["successfulJobsHistoryLimit"] == 3 and cron["failedJobsHistoryLimit"] == 3
        assert cron["timeZone"] == "Etc/UTC"
        job = cron["jobTemplate"]["spec"]
        assert job["activeDeadlineSeconds"] and job["ttlSecondsAfterFinished"]
    purge = docs[("CronJob", "inturn-purge@inturn")]
    container = purge["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["inturn", "purge", "--older-than=7d"]
    migrate = docs[("Job", "inturn-migrate@inturn")]
    assert migrate["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"


def test_ingest_listens_on_every_channel() -> None:
    docs = kinds(render(namespaced_values()))
    dep = docs[("Deployment", "inturn-ingest@inturn")]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["ingest", "--listen=adt=0.0.0.0:2575", "--listen=lab=0.0.0.0:2576"]
    svc = docs[("Service", "inturn-ingest@inturn")]
    assert [p["port"] for p in svc["spec"]["ports"]] == [8080, 2575, 2576]


def test_components_can_be_turned_off() -> None:
    values = copy.deepcopy(default_values())
    for part in ("operator", "ingest", "migrate", "purge", "sweeper"):
        values[part]["enabled"] = False
    values["crds"]["enabled"] = False
    assert render(values) == []
