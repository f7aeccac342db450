"""Builders of structural OpenAPI v3 schema nodes (Kubernetes CRD flavour) and CEL rules.

Pure data, shared by the Destination schema (:mod:`inturn.worker.spec.schema`) and the sender kinds
(:mod:`inturn.worker.senders`), each of which declares its own ``spec.sender.<kind>`` node with
these builders. Every :class:`Rule` created is registered in :data:`RULES`, so that a schema
node's ``x-kubernetes-validations`` item can always be mapped back to its Python twin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]

#: A DNS subdomain (RFC 1123), e.g. a Secret name.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A Secret data key.
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"

#: Every rule, keyed by its CEL text (filled as rules are created).
RULES: dict[str, Rule] = {}


# --- small builders -------------------------------------------------------------------------


def obj(
    properties: Mapping[str, Schema],
    *,
    required: tuple[str, ...] = (),
    description: str = "",
    default: Any = None,
    rules: tuple[Rule, ...] = (),
) -> Schema:
    """An ``object`` node with ``properties`` (optionally required keys, default, rules)."""
    node: Schema = {"type": "object"}
    if description:
        node["description"] = description
    node["properties"] = dict(properties)
    if required:
        node["required"] = list(required)
    if default is not None:
        node["default"] = default
    if rules:
        node["x-kubernetes-validations"] = [r.as_cel() for r in rules]
    return node


def string(
    description: str,
    *,
    max_length: int,
    min_length: int | None = None,
    pattern: str | None = None,
    enum: tuple[str, ...] = (),
    default: str | None = None,
    fmt: str | None = None,
) -> Schema:
    """A ``string`` node: an enum, or bounded by length and an optional pattern."""
    node: Schema = {"type": "string", "description": description}
    if enum:
        node["enum"] = list(enum)
    else:
        node["maxLength"] = max_length
        if min_length is not None:
            node["minLength"] = min_length
        if pattern is not None:
            node["pattern"] = pattern
    if fmt is not None:
        node["format"] = fmt
    if default is not None:
        node["default"] = default
    return node


def integer(
    description: str,
    *,
    minimum: int,
    maximum: int,
    default: int | None = None,
    fmt: str = "int32",
) -> Schema:
    """An ``integer`` node bounded by ``minimum`` and ``maximum``."""
    node: Schema = {
        "type": "integer",
        "format": fmt,
        "description": description,
        "minimum": minimum,
        "maximum": maximum,
    }
    if default is not None:
        node["default"] = default
    return node


def boolean(description: str, *, default: bool | None = None) -> Schema:
    """A ``boolean`` node."""
    node: Schema = {"type": "boolean", "description": description}
    if default is not None:
        node["default"] = default
    return node


def str_map(
    description: str, *, max_properties: int, max_value: int, value_pattern: str | None = None
) -> Schema:
    """An object of string values (``additionalProperties``), bounded in size, each value
    matching ``value_pattern`` when given."""
    values: Schema = {"type": "string", "maxLength": max_value}
    if value_pattern is not None:
        values["pattern"] = value_pattern
    return {
        "type": "object",
        "description": description,
        "maxProperties": max_properties,
        "additionalProperties": values,
    }


# --- CEL rules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One CEL validation rule with its Python twin.

    Attributes:
        cel: the CEL expression evaluated by the API server with ``self`` bound to the node
            that carries the rule.
        message: what is wrong, as the API server reports it after the field path.
        check: the same predicate in Python, given the (defaulted) node; True means valid.
        field_path: optional CEL ``fieldPath`` (relative to the node) the error is reported at.
    """

    cel: str
    message: str
    check: Callable[[Mapping[str, Any]], bool]
    field_path: str | None = None

    def __post_init__(self) -> None:
        RULES[self.cel] = self

    def as_cel(self) -> dict[str, str]:
        """Return the ``x-kubernetes-validations`` item (``rule``, ``message``, ``fieldPath``)."""
        out = {"rule": self.cel, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        return out
