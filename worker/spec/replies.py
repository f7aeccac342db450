"""Replies a Destination expects for what it is sent (``spec.replies``), and their keys.

An expectation rule says: for messages of ``orderTypes`` delivered to this destination, a reply
of ``replyTypes`` should arrive on ingest channel ``channel`` within ``withinSeconds``, matched
by a key: the first component of ``orderField`` of the order (default ``ORC-2``, the placer
order number) equal to the first component of one of ``replyFields`` of the reply (default
``ORC-2`` and ``OBR-2``). Types are MSH-9 patterns as in ``spec.filter.messageTypes``.

Keys are never stored or compared in clear: :func:`key_digest` is the first 32 hex digits of
SHA-256 over the destination, a NUL and the key (the same form as the patient identifier index,
:mod:`inturn.worker.store.identifiers`), so one key names one destination's orders only.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Default order field (the placer order number of the common order segment).
DEFAULT_ORDER_FIELD = "ORC-2"
#: Default reply fields (the placer order number in ORC or OBR of a result).
DEFAULT_REPLY_FIELDS = ("ORC-2", "OBR-2")
#: Most keys taken from one message (a bound on what a peer's message can make us store).
MAX_KEYS_PER_MESSAGE = 50


@dataclass(frozen=True)
class ReplyRule:
    """One ``spec.replies`` item.

    Attributes:
        order_types: MSH-9 patterns of the messages that expect a reply.
        reply_types: MSH-9 patterns of the replies.
        channel: the ingest channel the replies arrive on.
        within_seconds: how long a reply may take after the order was delivered.
        order_field: where the key is in the order (``ORC-2``).
        reply_fields: where the key may be in a reply (``ORC-2``, ``OBR-2``).
    """

    order_types: tuple[str, ...]
    reply_types: tuple[str, ...]
    channel: str
    within_seconds: int
    order_field: str = DEFAULT_ORDER_FIELD
    reply_fields: tuple[str, ...] = DEFAULT_REPLY_FIELDS


def parse(node: Mapping[str, Any]) -> ReplyRule:
    """A rule from its spec form (camelCase, schema-checked)."""
    return ReplyRule(
        order_types=tuple(node["orderTypes"]),
        reply_types=tuple(node["replyTypes"]),
        channel=node["channel"],
        within_seconds=int(node["withinSeconds"]),
        order_field=node.get("orderField", DEFAULT_ORDER_FIELD),
        reply_fields=tuple(node.get("replyFields", DEFAULT_REPLY_FIELDS)),
    )


def to_spec(rule: ReplyRule) -> dict[str, Any]:
    """The spec form of ``rule`` (the inverse of :func:`parse`)."""
    return {
        "orderTypes": list(rule.order_types),
        "replyTypes": list(rule.reply_types),
        "channel": rule.channel,
        "withinSeconds": rule.within_seconds,
        "orderField": rule.order_field,
        "replyFields": list(rule.reply_fields),
    }


def key_digest(destination: str, key: str) -> str:
    """The stored form of an order key: 32 hex digits (128 bits) of SHA-256 of
    ``destination``, NUL, ``key``."""
    text = f"{destination}\x00{key.strip()}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def rules_of(nodes: Sequence[Mapping[str, Any]] | None) -> tuple[ReplyRule, ...]:
    """Rules from a list in spec form (None: none)."""
    return tuple(parse(n) for n in nodes or ())
