"""Destination manifests and rendered worker configurations in, :class:`WorkerConfig` out.

Two documents describe a worker:

* a **Destination manifest** (``apiVersion: inturn.dev/v1alpha1``, ``kind: Destination``), as a
  user writes it for ``kubectl apply``, ``inturn local`` or ``inturn worker -f``;
* a **rendered worker configuration** (``kind: WorkerConfig``), the JSON the operator writes into
  the worker's ConfigMap and ``inturn worker --config`` reads.

Both are checked here exactly as the API server would check the manifest: the schema defaults
are applied, the document is validated against the schema of :mod:`inturn.worker.spec.schema`
(unknown fields are rejected, as ``kubectl apply --validate=strict`` does) and the CEL rules are
evaluated by their Python twins. Every problem is reported in one :class:`ManifestError` whose
message names the field path, e.g. ``spec.retry.maxAttempts: required``.

Secrets. A manifest refers to Secrets by name (``tls.secretRef``, ``http.secretRef``,
``sftp.secretRef``); the worker needs files; each sender kind renders its own references
(:meth:`~inturn.worker.senders.kind.SenderKind.render`).
Key ``k`` of Secret ``s`` is found at ``<secrets_dir>/<s>/<k>``: in a cluster the
operator mounts each Secret at ``/etc/inturn/secrets/<s>`` (:data:`DEFAULT_SECRETS_DIR`); with
``inturn local`` the same manifest works if the files are laid out the same way under a local
directory passed as ``secrets_dir`` (e.g. ``./secrets/partner-tls/ca.crt``).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import yaml

from inturn.worker.errors import Invalid
from inturn.worker.senders import registry as senders
from inturn.worker.senders import shape
from inturn.worker.spec import schema
from inturn.worker.spec.config import (
    WorkerConfig,
    from_dict,
    to_dict,
)
from inturn.worker.spec.schedule import ScheduleError
from inturn.worker.spec.schedule import parse as parse_schedule

#: Where the operator mounts referenced Secrets inside the worker container.
DEFAULT_SECRETS_DIR = "/etc/inturn/secrets"

#: Namespace of a manifest without ``metadata.namespace``.
DEFAULT_NAMESPACE = "default"


class ManifestError(Invalid):
    """A manifest or worker configuration is not valid.

    Attributes:
        errors: one line per problem, each ``<field path>: <what is wrong>``, sorted by path.
        source: where the document came from (``file.yaml#2``, ``ns/name``), or None.
    """

    def __init__(self, errors: list[str] | tuple[str, ...], source: str | None = None) -> None:
        self.errors = tuple(errors)
        self.source = source
        text = "; ".join(self.errors)
        super().__init__(f"{source}: {text}" if source else text)


# --- defaults and validation (generic over a structural schema) ------------------------------


def apply_defaults(node_schema: Mapping[str, Any], value: Any) -> Any:
    """Return a copy of ``value`` with the schema's ``default:`` values filled in.

    As the API server does: a property's default is used when the property is absent, nested
    objects are defaulted recursively, and values of the wrong type are left alone (validation
    reports them). ``value`` is not modified.
    """
    value = copy.deepcopy(value)
    _default_in_place(node_schema, value)
    return value


def _default_in_place(node_schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        props = node_schema.get("properties")
        if isinstance(props, Mapping):
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    _default_in_place(sub, value[key])
        extra = node_schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for sub_value in value.values():
                _default_in_place(extra, sub_value)
    elif isinstance(value, list):
        items = node_schema.get("items")
        if isinstance(items, Mapping):
            for item in value:
                _default_in_place(items, item)


def _closed(node_schema: Any) -> Any:
    """Return a copy of a schema where every object with ``properties`` rejects unknown keys."""
    if isinstance(node_schema, dict):
        out = {k: _closed(v) for k, v in node_schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node_schema, list):
        return [_closed(v) for v in node_schema]
    return node_schema


def _path(prefix: str, parts: Any) -> str:
    out = prefix
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out or "<root>"


#: Plain words for a pattern whose regular expression says little to a reader.
PATTERN_WORDS: dict[str, str] = {
    shape.HEADER_VALUE_PATTERN: "must not contain control characters (CR, LF, NUL, ...)",
    shape.HOST_PATTERN: "must not contain whitespace, control characters or '/'",
}


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _describe(error: jsonschema.ValidationError, prefix: str) -> list[str]:
    """Turn one jsonschema error into ``path: problem`` lines."""
    where = _path(prefix, error.absolute_path)
    v = error.validator
    value = error.validator_value
    if v == "required":
        instance = error.instance if isinstance(error.instance, Mapping) else {}
        at = list(error.absolute_path)
        return [f"{_path(prefix, [*at, k])}: required" for k in value if k not in instance]
    if v == "additionalProperties":
        instance = error.instance if isinstance(error.instance, Mapping) else {}
        known = set(error.schema.get("properties", {}))
        at = list(error.absolute_path)
        return [f"{_path(prefix, [*at, k])}: unknown field" for k in instance if k not in known]
    messages: dict[str, Callable[[], str]] = {
        "type": lambda: f"must be {'an' if str(value)[0] in 'aeiou' else 'a'} {value}",
        "minimum": lambda: f"must be >= {value}",
        "maximum": lambda: f"must be <= {value}",
        "minLength": lambda: (
            "must not be empty" if value == 1 else f"must be at least {value} characters"
        ),
        "maxLength": lambda: f"must be at most {value} characters",
        "pattern": lambda: PATTERN_WORDS.get(
            str(value), f"{_short(error.instance)} does not match {value}"
        ),
        "enum": lambda: "must be one of " + ", ".join(str(x) for x in value),
        "maxItems": lambda: f"must have at most {value} items",
        "maxProperties": lambda: f"must have at most {value} entries",
        "anyOf": lambda: "must be an integer or a string",
    }
    make = messages.get(str(v))
    return [f"{where}: {make() if make else error.message}"]


def _rule_errors(
    node_schema: Mapping[str, Any],
    value: Any,
    where: str,
    broken: frozenset[tuple[str | int, ...]] = frozenset(),
    at: tuple[str | int, ...] = (),
) -> Iterator[str]:
    """Evaluate the schema's CEL rules on ``value`` with their Python twins.

    ``broken``: the paths (from ``value``) of structural errors already reported. A node's
    rules run only when nothing at or under it is broken (rules assume a well-typed node, as
    CEL does); its well-typed siblings and children are still checked, so that one pass
    reports every problem the schema allows.
    """
    if isinstance(value, dict):
        clean = not any(path[: len(at)] == at for path in broken)
        for item in node_schema.get("x-kubernetes-validations", ()) if clean else ():
            rule = schema.RULES.get(item["rule"])
            if rule is None:  # pragma: no cover - every rule in the schema has a twin (tested)
                raise RuntimeError(f"no Python twin for CEL rule {item['rule']!r}")
            try:
                ok = rule.check(value)
            except (KeyError, TypeError):
                ok = True  # the structural validation reports the missing or mistyped field
            if not ok:
                path = where + (rule.field_path or "") if where else (rule.field_path or "")
                yield f"{path.lstrip('.') or '<root>'}: {rule.message}"
        for key, sub in node_schema.get("properties", {}).items():
            if key in value:
                yield from _rule_errors(
                    sub, value[key], f"{where}.{key}" if where else key, broken, (*at, key)
                )
    elif isinstance(value, list) and isinstance(node_schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from _rule_errors(node_schema["items"], item, f"{where}[{i}]", broken, (*at, i))


@functools.cache
def _schemas() -> dict[str, Any]:
    """The schemas used on every call, built once (never mutate them)."""
    root = schema.openapi_schema()
    worker = schema.worker_config_schema()
    return {
        "root": root,
        "spec": root["properties"]["spec"],
        "worker": worker,
        "spec_validator": jsonschema.Draft7Validator(_closed(root["properties"]["spec"])),
        "worker_validator": jsonschema.Draft7Validator(_closed(worker)),
    }


def validate(
    node_schema: Mapping[str, Any],
    value: Any,
    *,
    prefix: str = "",
    validator: jsonschema.Draft7Validator | None = None,
) -> list[str]:
    """Validate an already-defaulted ``value`` against ``node_schema`` and its CEL rules.

    Args:
        validator: a compiled validator of ``node_schema`` (closed), to skip compiling it.

    Returns:
        ``path: problem`` lines sorted by path; empty when valid. ``prefix`` is prepended to
        every path (e.g. ``spec``).
    """
    return _validate(node_schema, value, prefix=prefix, validator=validator)[0]


def _validate(
    node_schema: Mapping[str, Any],
    value: Any,
    *,
    prefix: str = "",
    validator: jsonschema.Draft7Validator | None = None,
) -> tuple[list[str], frozenset[tuple[str | int, ...]]]:
    """:func:`validate`, and the paths (from ``value``) of the structural errors found.

    The CEL rules of every node that is well typed are evaluated even when another part of
    ``value`` is not (a rule assumes its own node structurally valid and defaulted, as CEL
    does): one pass reports a type error in ``retry`` and ``sender: exactly one of ...``
    together. An unknown field breaks nothing else (it is only reported).
    """
    if validator is None:
        validator = jsonschema.Draft7Validator(_closed(dict(node_schema)))
    problems: list[str] = []
    broken: set[tuple[str | int, ...]] = set()
    for error in validator.iter_errors(value):
        problems.extend(_describe(error, prefix))
        if error.validator != "additionalProperties":
            broken.add(tuple(error.absolute_path))
    problems.extend(_rule_errors(node_schema, value, prefix, frozenset(broken)))
    return sorted(set(problems)), frozenset(broken)


# --- manifests -------------------------------------------------------------------------------


def destination_key(doc: Mapping[str, Any]) -> str:
    """Return ``namespace/name`` of a Destination manifest (namespace defaults to ``default``)."""
    meta = doc.get("metadata") or {}
    return f"{meta.get('namespace') or DEFAULT_NAMESPACE}/{meta.get('name')}"


def validate_manifest(doc: Mapping[str, Any], *, source: str | None = None) -> dict[str, Any]:
    """Check a Destination manifest and return a copy with the schema defaults applied.

    The operator uses this on the objects it watches (the API server already checked them, but
    an object stored before a schema change may not pass); the worker uses it through
    :func:`load_manifest`.

    Raises:
        ManifestError: wrong apiVersion/kind, a bad ``metadata.name``/``namespace``, a spec
            that the CRD would reject, or a sender its kind would refuse to build
            (:func:`inturn.worker.senders.registry.problems`: a header with CR/LF, a host IDNA
            cannot encode, ...); the message lists every problem with its field path.
    """
    if not isinstance(doc, Mapping):
        raise ManifestError(["<root>: must be a mapping"], source)
    problems: list[str] = []
    if doc.get("apiVersion") != schema.API_VERSION:
        problems.append(
            f"apiVersion: must be {schema.API_VERSION}, not {_short(doc.get('apiVersion'))}"
        )
    if doc.get("kind") != schema.KIND:
        problems.append(f"kind: must be {schema.KIND}, not {_short(doc.get('kind'))}")
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        problems.append("metadata.name: required")
        meta = {}
    name = meta.get("name")
    namespace = meta.get("namespace", DEFAULT_NAMESPACE)
    label = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    if not name:
        problems.append("metadata.name: required")
    else:
        problems.extend(
            validate(
                {"type": "string", "maxLength": 253, "pattern": label}, name, prefix="metadata.name"
            )
        )
    if namespace is not None:
        problems.extend(
            validate(
                {"type": "string", "maxLength": 63, "pattern": label},
                namespace,
                prefix="metadata.namespace",
            )
        )
    compiled = _schemas()
    root = compiled["root"]
    if "spec" not in doc:
        problems.append("spec: required")
        spec: Any = None
    else:
        spec = apply_defaults(compiled["spec"], doc["spec"])
        found, broken = _validate(
            compiled["spec"], spec, prefix="spec", validator=compiled["spec_validator"]
        )
        problems.extend(found)
        # what the schema cannot say, checked on the parts that are well typed
        if isinstance(spec, Mapping):
            if not any(p[:1] == ("schedule",) for p in broken):
                problems.extend(_schedule_problems(spec, "spec.schedule"))
            if not any(p[:1] == ("sender",) for p in broken) and not any(
                line.startswith("spec.sender") for line in found
            ):
                problems.extend(senders.problems(spec.get("sender") or {}, "spec.sender"))
    if not problems:
        problems.extend(
            _rule_errors(
                {"x-kubernetes-validations": root["x-kubernetes-validations"]}, dict(doc), ""
            )
        )
    if problems:
        raise ManifestError(
            sorted(set(problems)), source or (destination_key(doc) if name else None)
        )
    out = dict(copy.deepcopy(doc))
    out["spec"] = spec
    return out


def _schedule_problems(node: Mapping[str, Any], where: str) -> list[str]:
    """What the schema cannot say about a schedule: whether its time zone exists (the IANA
    database of this process; the API server accepts any name of the right shape, so the
    operator reports an unknown zone as InvalidSpec)."""
    if node.get("schedule") is None:
        return []
    try:
        parse_schedule(node["schedule"])
    except ScheduleError as exc:
        return [f"{where}.{exc}"]
    return []


def _secret_file(secrets_dir: str | Path, secret: str, key: str) -> str:
    base = secrets_dir if isinstance(secrets_dir, Path) else PurePosixPath(secrets_dir)
    return str(base / secret / key)


def render_from_manifest(
    doc: Mapping[str, Any], *, secrets_dir: str | Path = DEFAULT_SECRETS_DIR
) -> dict[str, Any]:
    """Return the rendered worker configuration (JSON object) of a *validated* manifest.

    ``doc`` must come from :func:`validate_manifest` (defaults applied). Secret references become
    paths under ``secrets_dir``. The operator writes the result into the worker's ConfigMap.
    """
    spec = doc["spec"]
    found = senders.of_spec(spec["sender"])
    assert found is not None  # validated: exactly one kind is set
    kind, node = found

    def secret_file(secret: str, key: str) -> str:
        return _secret_file(secrets_dir, secret, key)

    rendered = {
        "destination": destination_key(doc),
        "channel": spec["channel"],
        "messageTypes": list((spec.get("filter") or {}).get("messageTypes", [])),
        **(
            {"filterFields": list(spec["filter"]["fields"])}
            if (spec.get("filter") or {}).get("fields")
            else {}
        ),
        "carriers": list(spec.get("carriers", [])),
        "sender": {kind.name: kind.render(node, secret_file)},
        "retry": dict(spec["retry"]),
        "ackPolicy": dict(spec["ackPolicy"]),
        "idleSeconds": spec["idleSeconds"],
        "suspend": spec["suspend"],
        "alerting": dict(spec["alerting"]),
        **(
            {"expireAfterSeconds": spec["expireAfterSeconds"]}
            if spec.get("expireAfterSeconds") is not None
            else {}
        ),
        **{key: spec[key] for key in ("schedule", "throttle", "replies") if spec.get(key)},
        **({"lanes": dict(spec["lanes"])} if spec.get("lanes") else {}),
    }
    return render_worker_config(from_dict(rendered))


def load_manifest(
    doc: Mapping[str, Any],
    *,
    secrets_dir: str | Path = DEFAULT_SECRETS_DIR,
    source: str | None = None,
) -> WorkerConfig:
    """Validate a Destination manifest and return the worker configuration it describes.

    Args:
        doc: the parsed manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``).
        secrets_dir: the directory holding ``<secret name>/<key>`` files; in a worker pod the
            operator's mount point, with ``inturn local`` a local directory.
        source: a label for error messages (file and document number).

    Raises:
        ManifestError: the manifest is not a valid Destination (every problem, by field path).
    """
    valid = validate_manifest(doc, source=source)
    return from_dict(render_from_manifest(valid, secrets_dir=secrets_dir))


# --- rendered worker configurations -----------------------------------------------------------


def render_worker_config(cfg: WorkerConfig) -> dict[str, Any]:
    """Return the rendered JSON object of ``cfg`` (``kind: WorkerConfig``).

    The inverse of :func:`load_worker_config`; the operator writes it as ``worker.json``.
    """
    return {"apiVersion": schema.API_VERSION, "kind": schema.WORKER_CONFIG_KIND, **to_dict(cfg)}


def load_worker_config(doc: Mapping[str, Any], *, source: str | None = None) -> WorkerConfig:
    """Validate a rendered worker configuration (parsed JSON or YAML) and return the model.

    ``apiVersion``/``kind`` may be omitted; when present they must be ``inturn.dev/v1alpha1`` and
    ``WorkerConfig``. Defaults of the schema apply to omitted optional fields.

    Raises:
        ManifestError: a field is missing, unknown, mistyped or out of bounds, or the sender's
            kind would refuse it (by field path).
    """
    if not isinstance(doc, Mapping):
        raise ManifestError(["<root>: must be a mapping"], source)
    compiled = _schemas()
    value = apply_defaults(compiled["worker"], dict(doc))
    problems = validate(compiled["worker"], value, validator=compiled["worker_validator"])
    if not problems:
        problems = _schedule_problems(value, "schedule")
        problems += senders.problems(value.get("sender") or {}, "sender")
    if problems:
        raise ManifestError(
            problems, source or (str(doc.get("destination")) if doc.get("destination") else None)
        )
    return from_dict(value)


def load_document(
    doc: Mapping[str, Any],
    *,
    secrets_dir: str | Path = DEFAULT_SECRETS_DIR,
    source: str | None = None,
) -> list[WorkerConfig]:
    """Load one parsed document: a Destination, a WorkerConfig, or a ``List`` of them.

    Raises:
        ManifestError: the document is invalid or of another kind.
    """
    if not isinstance(doc, Mapping):
        raise ManifestError(["<root>: must be a mapping"], source)
    kind = doc.get("kind")
    if kind == schema.KIND:
        return [load_manifest(doc, secrets_dir=secrets_dir, source=source)]
    if kind == schema.WORKER_CONFIG_KIND:
        return [load_worker_config(doc, source=source)]
    if kind in ("List", f"{schema.KIND}List") and isinstance(doc.get("items"), list):
        out: list[WorkerConfig] = []
        for i, item in enumerate(doc["items"]):
            out.extend(
                load_document(item, secrets_dir=secrets_dir, source=f"{source or ''}items[{i}]")
            )
        return out
    raise ManifestError(
        [f"kind: must be {schema.KIND} or {schema.WORKER_CONFIG_KIND}, not {_short(kind)}"], source
    )


def load_file(path: str | Path, *, secrets_dir: str | Path | None = None) -> list[WorkerConfig]:
    """Load every Destination or WorkerConfig in a YAML (multi-document) or JSON file.

    Args:
        path: the file.
        secrets_dir: where ``<secret>/<key>`` files are; a relative path is taken relative to the
            file's directory; None means :data:`DEFAULT_SECRETS_DIR` (the pod mount).

    Returns:
        One configuration per document, in file order (empty documents are skipped).

    Raises:
        ManifestError: the file is not YAML, or a document is invalid (message names the file,
            the document number and the field path).
        OSError: the file cannot be read.
    """
    path = Path(path)
    if secrets_dir is None:
        resolved: str | Path = DEFAULT_SECRETS_DIR
    else:
        resolved = Path(secrets_dir)
        if not resolved.is_absolute():
            resolved = (path.parent / resolved).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError([f"byte {exc.start}: not UTF-8 text"], str(path)) from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "?"
        raise ManifestError(
            [f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})"], str(path)
        ) from None
    out: list[WorkerConfig] = []
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        out.extend(load_document(doc, secrets_dir=resolved, source=f"{path}#{i}"))
    return out
