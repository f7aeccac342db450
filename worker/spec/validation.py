"""Judging a document by a structural schema as the API server would: defaults, then the
schema, then the CEL rules by their Python twins; every problem one ``path: problem`` line.

Generic over the schema: :mod:`.destination` judges Destination manifests and rendered worker
configurations with it, a pack's own documents (:mod:`inturn.worker.reservations.records`) with
theirs. This module changes when the wording of a problem or the way a rule is evaluated
changes; what a Destination is stays in :mod:`.schema`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema

from inturn.worker.senders import shape
from inturn.worker.spec.openapi import RULES
from inturn.worker.spec.schema_profile import VALUE_PATTERN


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


def closed(node_schema: Any) -> Any:
    """Return a copy of a schema where every object with ``properties`` rejects unknown keys."""
    if isinstance(node_schema, dict):
        out = {k: closed(v) for k, v in node_schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node_schema, list):
        return [closed(v) for v in node_schema]
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
    VALUE_PATTERN: "must not contain control characters (CR, LF, TAB, NUL, ...)",
}


def short(value: Any) -> str:
    """``value`` as a problem line quotes it: JSON (a string repr'd), cut to 64 characters."""
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
            str(value), f"{short(error.instance)} does not match {value}"
        ),
        "enum": lambda: "must be one of " + ", ".join(str(x) for x in value),
        "maxItems": lambda: f"must have at most {value} items",
        "maxProperties": lambda: f"must have at most {value} entries",
        "anyOf": lambda: "must be an integer or a string",
    }
    make = messages.get(str(v))
    return [f"{where}: {make() if make else error.message}"]


def rule_errors(
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
        # A node's rules run unless the node itself is mistyped: a rule that reads a mistyped
        # field of it raises (KeyError, TypeError) and is left to the structural error, so
        # that a wrong type in one field does not hide a rule about two others.
        clean = at not in broken
        for item in node_schema.get("x-kubernetes-validations", ()) if clean else ():
            rule = RULES.get(item["rule"])
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
                yield from rule_errors(
                    sub, value[key], f"{where}.{key}" if where else key, broken, (*at, key)
                )
    elif isinstance(value, list) and isinstance(node_schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from rule_errors(node_schema["items"], item, f"{where}[{i}]", broken, (*at, i))


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
    return validate_paths(node_schema, value, prefix=prefix, validator=validator)[0]


def validate_paths(
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
        validator = jsonschema.Draft7Validator(closed(dict(node_schema)))
    problems: list[str] = []
    broken: set[tuple[str | int, ...]] = set()
    for error in validator.iter_errors(value):
        problems.extend(_describe(error, prefix))
        if error.validator != "additionalProperties":
            broken.add(tuple(error.absolute_path))
    problems.extend(rule_errors(node_schema, value, prefix, frozenset(broken)))
    return sorted(set(problems)), frozenset(broken)
