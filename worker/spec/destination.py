"""Destination manifests and rendered worker configurations in, :class:`WorkerConfig` out.

Two documents describe a worker:

* a **Destination manifest** (``apiVersion: inturn.dev/v1alpha1``, ``kind: Destination``), as a
  user writes it for ``kubectl apply``, ``inturn local`` or ``inturn worker -f``;
* a **rendered worker configuration** (``kind: WorkerConfig``), the JSON the operator writes into
  the worker's ConfigMap and ``inturn worker --config`` reads.

Both are checked here exactly as the API server would check the manifest: the schema defaults
are applied, the document is validated against the schema of :mod:`inturn.worker.spec.schema`
(unknown fields are rejected, as ``kubectl apply --validate=strict`` does) and the CEL rules are
evaluated by their Python twins (:mod:`.validation`, generic over the schema). Every problem
is reported in one :class:`ManifestError` whose message names the field path, e.g.
``spec.retry.maxAttempts: required``. This module changes when what a manifest or a worker
configuration holds changes; how a document is judged changes in :mod:`.validation`.

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
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema

from inturn.worker.errors import Invalid
from inturn.worker.hl7 import profile as shaping
from inturn.worker.senders import registry as senders
from inturn.worker.spec import schema
from inturn.worker.spec.config import (
    WorkerConfig,
    from_dict,
    to_dict,
)
from inturn.worker.spec.documents import DocumentError, check_shape, read_documents
from inturn.worker.spec.schedule import ScheduleError
from inturn.worker.spec.schedule import parse as parse_schedule
from inturn.worker.spec.schema_packs import pack_fields
from inturn.worker.spec.validation import (
    apply_defaults,
    closed,
    rule_errors,
    short,
    validate,
    validate_paths,
)

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


@functools.cache
def _schemas() -> dict[str, Any]:
    """The schemas used on every call, built once (never mutate them)."""
    root = schema.openapi_schema()
    worker = schema.worker_config_schema()
    return {
        "root": root,
        "spec": root["properties"]["spec"],
        "worker": worker,
        "spec_validator": jsonschema.Draft7Validator(closed(root["properties"]["spec"])),
        "worker_validator": jsonschema.Draft7Validator(closed(worker)),
    }


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
        ManifestError: nested deeper or larger than a file may be
            (:func:`inturn.worker.spec.documents.check_shape`), wrong apiVersion/kind, a bad
            ``metadata.name``/``namespace``, a spec
            that the CRD would reject, or a sender its kind would refuse to build
            (:func:`inturn.worker.senders.registry.problems`: a header with CR/LF, a host IDNA
            cannot encode, ...); the message lists every problem with its field path.
    """
    if not isinstance(doc, Mapping):
        raise ManifestError(["<root>: must be a mapping"], source)
    try:  # an object the API server stored may nest deeper than any walk below can follow
        check_shape(doc, what="the Destination")
    except DocumentError as exc:
        raise ManifestError([str(exc)], source) from None
    problems: list[str] = []
    if doc.get("apiVersion") != schema.API_VERSION:
        problems.append(
            f"apiVersion: must be {schema.API_VERSION}, not {short(doc.get('apiVersion'))}"
        )
    if doc.get("kind") != schema.KIND:
        problems.append(f"kind: must be {schema.KIND}, not {short(doc.get('kind'))}")
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
        found, broken = validate_paths(
            compiled["spec"], spec, prefix="spec", validator=compiled["spec_validator"]
        )
        problems.extend(found)
        # what the schema cannot say, checked on the parts that are well typed
        if isinstance(spec, Mapping):
            if not any(p[:1] == ("schedule",) for p in broken):
                problems.extend(_schedule_problems(spec, "spec.schedule"))
            problems.extend(_profile_problems(spec, "spec.profile"))  # on what is well typed
            if not any(p[:1] == ("sender",) for p in broken) and not any(
                line.startswith("spec.sender") for line in found
            ):
                problems.extend(senders.problems(spec.get("sender") or {}, "spec.sender"))
    # the object's own rules too, even when something else is wrong (one pass says all)
    problems.extend(
        rule_errors({"x-kubernetes-validations": root["x-kubernetes-validations"]}, dict(doc), "")
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


def _profile_problems(node: Mapping[str, Any], where: str) -> list[str]:
    """What the schema cannot say about a profile (:func:`inturn.worker.hl7.profile.problems`:
    the keys of set, copy and truncate, a field written twice, a glob that would remove MSH)."""
    profile = node.get("profile")
    if not isinstance(profile, Mapping):
        return []
    return [f"{where}.{line}" for line in shaping.problems(profile, schema_rules=True)]


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
        **{key: spec[key] for key in ("schedule", "throttle") if spec.get(key)},
        **({"lanes": dict(spec["lanes"])} if spec.get("lanes") else {}),
        **({"profile": spec["profile"]} if spec.get("profile") else {}),
        # the packs' fields the worker reads (replies, carriers, ...), as the manifest has them
        **{f.name: spec[f.name] for f in pack_fields() if f.worker and spec.get(f.name)},
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
        problems += _profile_problems(value, "profile")
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
        [f"kind: must be {schema.KIND} or {schema.WORKER_CONFIG_KIND}, not {short(kind)}"], source
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
        docs = read_documents(path)
    except DocumentError as exc:
        raise ManifestError([str(exc)], str(path)) from None
    out: list[WorkerConfig] = []
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        out.extend(load_document(doc, secrets_dir=resolved, source=f"{path}#{i}"))
    return out
