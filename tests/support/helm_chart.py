"""The chart rendered and linted by the real Helm (its Go SDK, bundled by ``helm-python-sdk``).

Tests import this module (``from tests.support.helm_chart import render``)::

    objs = render({"sweeper": {"enabled": True}}, files=["monitoring"])
    cron = find(objs, "CronJob", "inturn-sweeper")

Values are layered as ``helm template -f A -f B --set ...`` layers them: the test image
(:data:`TEST_VALUES`, since the chart refuses to render without a real image), then each values
file in order, then ``values``; maps merge key by key, anything else (lists too) is replaced.
A values file is a path or the short name of one in ``charts/inturn/ci/`` (``"namespaced"`` is
``ci/namespaced-values.yaml``). Rendering runs offline: no cluster is contacted, and
``.Capabilities`` are Helm's defaults.

The rendered text is parsed with libyaml (``yaml.CSafeLoader``: the same safe constructors, about
ten times quicker than the pure-Python loader, which took 0.25 s of each render's 0.28), and each
distinct set of values is rendered once per test session (:func:`render_templates` keeps the
text; every caller gets its own copy of the objects).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import yaml
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

from inturn.worker.spec.documents import read_document

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inturn"
CI_VALUES = CHART / "ci"
RELEASE = "inturn"
NAMESPACE = "inturn"

#: What every render gets first: an image (the chart has no usable default).
TEST_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example.test/inturn", "tag": "0.1.0-test"}
}

ValuesFile = str | Path


def values_files() -> list[str]:
    """Short names of the values files in ``charts/inturn/ci/`` (``x`` for ``x-values.yaml``)."""
    return sorted(p.name.removesuffix("-values.yaml") for p in CI_VALUES.glob("*-values.yaml"))


def _file(name: ValuesFile) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return path
    return CI_VALUES / f"{name}-values.yaml"


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``override`` merged in as Helm merges values (maps recursively)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def values(
    overrides: dict[str, Any] | None = None,
    *,
    files: Sequence[ValuesFile] = (),
    image: bool = True,
) -> dict[str, Any]:
    """The user-supplied values: test image (unless ``image=False``), ``files``, ``overrides``."""
    out: dict[str, Any] = copy.deepcopy(TEST_VALUES) if image else {}
    for name in files:
        # the bounded reader of every configuration file (a key given twice is refused)
        out = merge(out, read_document(_file(name)) or {})
    return merge(out, overrides or {})


#: The text of every render this session, by its values and namespace (a render that raises is
#: not kept, so it raises again): the chart does not change during a run.
_RENDERED: dict[tuple[str, str], dict[str, str]] = {}


def render_templates(
    overrides: dict[str, Any] | None = None,
    *,
    files: Sequence[ValuesFile] = (),
    image: bool = True,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """``helm template``: template path (``inturn/templates/x.yaml``) -> rendered text.

    Raises ``helm_python.HelmValuesError`` when the values break ``values.schema.json`` and
    ``helm_python.HelmRenderError`` when a template fails (e.g. a ``required`` value is unset).
    """
    given = values(overrides, files=files, image=image)
    key = (json.dumps(given, sort_keys=True, default=str), namespace)
    if key not in _RENDERED:
        with helm.Chart.load(CHART) as chart:
            _RENDERED[key] = chart.render(given, name=RELEASE, namespace=namespace, is_install=True)
    return dict(_RENDERED[key])


def render(
    overrides: dict[str, Any] | None = None,
    *,
    files: Sequence[ValuesFile] = (),
    image: bool = True,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders, in template order (empty documents dropped)."""
    objs: list[dict[str, Any]] = []
    rendered = render_templates(overrides, files=files, image=image, namespace=namespace)
    for name, text in sorted(rendered.items()):
        if not name.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        objs.extend(doc for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc)
    return objs


def lint(
    overrides: dict[str, Any] | None = None,
    *,
    files: Sequence[ValuesFile] = (),
    namespace: str = NAMESPACE,
) -> list[str]:
    """``helm lint --strict``: every finding above "info" as ``"path: message"`` (empty: clean)."""
    report = helm.lint(CHART, values(overrides, files=files), strict=True, namespace=namespace)
    found = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return found + [str(e) for e in report["errors"]]


def find(
    objs: Iterable[dict[str, Any]], kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    """The one object of ``kind`` named ``name`` (in ``namespace`` if given); KeyError if none."""
    for obj in objs:
        meta = obj["metadata"]
        in_namespace = namespace is None or meta.get("namespace") == namespace
        if obj["kind"] == kind and meta["name"] == name and in_namespace:
            return obj
    raise KeyError(f"no {kind} {name!r}" + (f" in {namespace}" if namespace else ""))


def of_kind(objs: Iterable[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    """The objects whose kind is one of ``kinds``."""
    return [o for o in objs if o["kind"] in kinds]


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs an object runs (Deployment, StatefulSet, DaemonSet, Job, CronJob)."""
    spec = obj.get("spec", {})
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [spec["template"]["spec"]]
    if obj["kind"] == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def validate(obj: dict[str, Any], desired_version: str) -> None:
    """``kubernetes_validate.validate(obj, desired_version, strict=True)``, with each validator
    built once per Kubernetes version and kind: the library reads and parses the version's
    ``_definitions.json`` again for every object (14 ms an object, 14 of the chart tests' 18 s).
    The same schema files, draft and registry; jsonschema's ValidationError if not valid."""
    _validator(_schema_version(desired_version), obj["kind"], obj["apiVersion"]).validate(obj)


@functools.cache
def _schema_version(desired_version: str) -> str:
    """The newest schema version not newer than the one asked for (as the library picks it)."""
    if kv_utils.major_minor(desired_version) > kv_utils.latest_version():
        raise ValueError(f"kubernetes-validate does not know Kubernetes {desired_version}")
    desired = kv_utils.major_minor(desired_version)
    return [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= desired][-1]


@functools.cache
def _validator(version: str, kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kv_utils.schema_contents(f"{folder}/{kind.lower()}-{api}.json", version)
    definitions = kv_utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)
