"""Reference tables generated from the code, so that they cannot drift from it.

Directives, written in MyST as ```` ```{inturn-schema} destination ````:

- ``inturn-schema destination``: every field of a Destination's ``spec`` and ``status``, from
  :func:`inturn.worker.spec.schema.spec_schema` and ``status_schema`` (the CRD's own schema,
  descriptions included).
- ``inturn-schema chart-values``: every key of the Helm chart's values, from
  ``charts/inturn/values.schema.json``, with its default from ``charts/inturn/values.yaml`` and
  the comment written above (or beside) it there.
- ``inturn-metrics``: every Prometheus metric inturn defines, read from prometheus-client's
  default registry after importing the modules that define them.

The rows are built by plain functions (:func:`destination_rows`, :func:`chart_value_rows`,
:func:`metric_rows`) that ``tests/unit/test_docs.py`` calls too.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]

#: The modules that define metrics, and the process that serves each one's metrics.
METRIC_MODULES: dict[str, str] = {
    "inturn.worker.drain.metrics": "worker (--http-port), inturn local (--ops)",
    "inturn.worker.ingest.metrics": "ingest (--ops), inturn local (--ops)",
    "inturn.worker.ingest.history_metrics": "ingest (--ops), inturn local (--ops)",
    "inturn.worker.worklist.metrics": "whichever process places the work; pending: ingest",
    "inturn.operator.metrics": "operator (--metrics)",
}


@dataclass(frozen=True)
class Field:
    """One row of a schema table: a dotted path, its type and constraints, default, meaning."""

    path: str
    kind: str
    default: str
    description: str


@dataclass(frozen=True)
class Metric:
    """One Prometheus metric: its exposed name, type, label names, who serves it, its help."""

    name: str
    kind: str
    labels: tuple[str, ...]
    served_by: str
    help: str


def _kind(node: Mapping[str, Any]) -> str:
    """The type and constraints of a schema node, in a few words (``integer, 1..65535``)."""
    kind = node.get("type", "")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if "enum" in node:
        kind = " | ".join(str(v) for v in node["enum"])
    words = [kind] if kind else []
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None or high is not None:
        words.append(f"{'' if low is None else low}..{'' if high is None else high}")
    if "pattern" in node:
        words.append(f"pattern {node['pattern']}")
    if "maxLength" in node:
        words.append(f"at most {node['maxLength']} characters")
    if node.get("x-kubernetes-int-or-string"):
        words.append("integer or string")
    return ", ".join(words)


def _walk(
    node: Mapping[str, Any], path: str, required: bool, defaults: Mapping[str, Any]
) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    yield path, node, required
    props = node.get("properties") or {}
    needed = set(node.get("required") or ())
    for name, child in props.items():
        yield from _walk(child, f"{path}.{name}" if path else name, name in needed, defaults)
    items = node.get("items")
    if isinstance(items, Mapping) and items.get("properties"):
        for name, child in items["properties"].items():
            needed_items = set(items.get("required") or ())
            yield from _walk(child, f"{path}[].{name}", name in needed_items, defaults)


def _fmt_default(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(", ", ": "))


def schema_rows(
    schema: Mapping[str, Any],
    prefix: str,
    defaults: Mapping[str, Any] | None = None,
    comments: Mapping[str, str] | None = None,
) -> list[Field]:
    """Every field of ``schema`` as a row, depth first, paths prefixed with ``prefix``.

    ``defaults`` maps a dotted path to its default (else the node's own ``default``);
    ``comments`` maps a dotted path to a description used when the node has none.
    """
    rows = []
    for path, node, required in _walk(schema, prefix, False, defaults or {}):
        if not path or path == prefix:
            continue
        default = (defaults or {}).get(path, node.get("default"))
        if isinstance(default, dict) and default:
            default = None  # an object's default is the defaults of its fields, listed below
        kind = _kind(node) + (", required" if required else "")
        text = node.get("description") or (comments or {}).get(path, "")
        rows.append(Field(path, kind.strip(", "), _fmt_default(default), " ".join(text.split())))
    return rows


def destination_rows() -> list[Field]:
    """Every field of a Destination's ``spec`` and ``status``, from the CRD schema."""
    schema = importlib.import_module("inturn.worker.spec.schema")
    return schema_rows(schema.spec_schema(), "spec") + schema_rows(schema.status_schema(), "status")


def _flatten(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield from _flatten(child, f"{path}.{key}" if path else str(key))


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")


def values_comments(text: str) -> dict[str, str]:
    """The comment above (or beside) each key of a values.yaml, by dotted path.

    A block of ``#`` lines right above a key describes it; so does a comment after its value
    on the same line. List items are not descended into.
    """
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            pending = [] if not stripped else pending
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack] + [match["key"]])
        stack.append((indent, match["key"]))
        rest = match["rest"]
        beside = ""
        if "#" in rest and not rest.strip().startswith(("'", '"')):
            beside = rest.split("#", 1)[1].strip()
        text_ = " ".join(pending + ([beside] if beside else []))
        if text_:
            comments[path] = text_
        pending = []
    return comments


def chart_value_rows(root: Path = ROOT) -> list[Field]:
    """Every key of the chart's values schema, with defaults and comments from values.yaml."""
    chart = root / "charts" / "inturn"
    schema = json.loads((chart / "values.schema.json").read_text())
    text = (chart / "values.yaml").read_text()
    defaults = dict(_flatten(yaml.safe_load(text), ""))
    return schema_rows(schema, "", defaults, values_comments(text))


def metric_rows() -> list[Metric]:
    """Every metric of :data:`METRIC_MODULES`, by exposed name.

    Reads the metric objects of each module (prometheus-client keeps the label names only on
    the object); a counter's exposed name gets its ``_total`` suffix.
    """
    from prometheus_client.metrics import MetricWrapperBase

    rows = []
    for module_name, served_by in METRIC_MODULES.items():
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if not isinstance(value, MetricWrapperBase):
                continue
            name = value._name + ("_total" if value._type == "counter" else "")
            labels = tuple(value._labelnames)
            rows.append(Metric(name, value._type, labels, served_by, value._documentation))
    return sorted(rows, key=lambda m: m.name)


def _cell(text: str, literal: bool) -> nodes.entry:
    entry = nodes.entry()
    para = nodes.paragraph()
    if text:
        para += nodes.literal(text, text) if literal else nodes.Text(text)
    entry += para
    return entry


def table(
    header: tuple[str, ...], rows: list[tuple[str, ...]], literal: tuple[bool, ...]
) -> nodes.table:
    """A docutils table of strings; a column whose ``literal`` flag is set is shown as code."""
    tbl = nodes.table(classes=["inturn-reference"])
    group = nodes.tgroup(cols=len(header))
    tbl += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for title in header:
        row += _cell(title, False)
    head += row
    body = nodes.tbody()
    group += body
    for values in rows:
        row = nodes.row()
        for value, code in zip(values, literal, strict=True):
            row += _cell(value, code)
        body += row
    return tbl


class SchemaDirective(SphinxDirective):
    """``inturn-schema destination|chart-values``: a schema as a table of fields."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        which = self.arguments[0]
        if which == "destination":
            rows = destination_rows()
        elif which == "chart-values":
            rows = chart_value_rows()
            self.env.note_dependency(str(ROOT / "charts" / "inturn" / "values.yaml"))
        else:
            raise self.error(f"inturn-schema: unknown schema {which!r}")
        return [
            table(
                ("field", "type", "default", "description"),
                [(r.path, r.kind, r.default, r.description) for r in rows],
                (True, False, True, False),
            )
        ]


class MetricsDirective(SphinxDirective):
    """``inturn-metrics``: every metric inturn defines, as a table."""

    def run(self) -> list[nodes.Node]:
        return [
            table(
                ("metric", "type", "labels", "served by", "meaning"),
                [(m.name, m.kind, ", ".join(m.labels), m.served_by, m.help) for m in metric_rows()],
                (True, False, True, False, False),
            )
        ]


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives (Sphinx extension entry point)."""
    app.add_directive("inturn-schema", SchemaDirective)
    app.add_directive("inturn-metrics", MetricsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
