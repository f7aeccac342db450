"""Replies a Destination expects for what it is sent (``spec.replies``), and their keys.

An expectation rule says: for messages of ``orderTypes`` delivered to this destination, a reply
of ``replyTypes`` should arrive on ingest channel ``channel`` within ``withinSeconds``, matched
by a key: the first component of ``orderField`` of the order (default ``ORC-2``, the placer
order number) equal to the first component of one of ``replyFields`` of the reply (default
``ORC-2`` and ``OBR-2``). Types are MSH-9 patterns as in ``spec.filter.messageTypes``.

**A reply answers only what it belongs to.** What ties a reply to an order is its owner, three
things at once: the destination the order was delivered to, the key, and the peer the order
was addressed to. Without ``from``, the peer is the order's receiving application and facility
(MSH-5, MSH-6, first components) and a reply answers it only if it was sent by that same
application and facility (its MSH-3, MSH-4); with ``from``, only a reply whose MSH-3 (and MSH-4,
when the entry names one) is one of the declared senders answers. Two labs with overlapping
placer numbers, two destinations expecting replies on one channel, a stranger who guesses a
placer number: none of them answers another's order. A reply that answers nothing is counted
(``inturn_ingest_replies_total{result="unmatched"}``).

Keys are never stored or compared in clear: :func:`key_digest` is the first 32 hex digits of
SHA-256 over the owner (:func:`owner_scope`: the destination, a NUL, the peer), a NUL and the
key (the same form as the patient identifier index, :mod:`inturn.worker.store.identifiers`);
the statement that answers (``ingest.sql``, ``answered``) matches digests only, so it can only
answer the owner's own orders.

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
#: The peer of an order whose rule declares ``from``: any declared sender answers it.
DECLARED = "\x01from"


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
        senders: ``from``: ``(application, facility or None)`` of the senders whose replies
            answer; empty: the application and facility each order was addressed to.
    """

    order_types: tuple[str, ...]
    reply_types: tuple[str, ...]
    channel: str
    within_seconds: int
    order_field: str = DEFAULT_ORDER_FIELD
    reply_fields: tuple[str, ...] = DEFAULT_REPLY_FIELDS
    senders: tuple[tuple[str, str | None], ...] = ()

    def order_peer(self, receiving_application: str, receiving_facility: str) -> str:
        """The peer an order addressed to ``receiving_application``/``receiving_facility``
        (MSH-5/MSH-6 first components) belongs to: :data:`DECLARED` with ``from``, else the
        pair."""
        if self.senders:
            return DECLARED
        return f"{receiving_application.strip()}^{receiving_facility.strip()}"

    def reply_peer(self, sending_application: str, sending_facility: str) -> str:
        """The peer a reply sent by ``sending_application``/``sending_facility`` (MSH-3/MSH-4
        first components) speaks for: with ``from``, :data:`DECLARED` when it is a declared
        sender (else its own pair, which no order has); without, the pair."""
        app, facility = sending_application.strip(), sending_facility.strip()
        if self.senders and any(app == a and (f is None or facility == f) for a, f in self.senders):
            return DECLARED
        return f"{app}^{facility}"


def parse(node: Mapping[str, Any]) -> ReplyRule:
    """A rule from its spec form (camelCase, schema-checked)."""
    return ReplyRule(
        order_types=tuple(node["orderTypes"]),
        reply_types=tuple(node["replyTypes"]),
        channel=node["channel"],
        within_seconds=int(node["withinSeconds"]),
        order_field=node.get("orderField", DEFAULT_ORDER_FIELD),
        reply_fields=tuple(node.get("replyFields", DEFAULT_REPLY_FIELDS)),
        senders=tuple((f["application"], f.get("facility")) for f in node.get("from", ())),
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
        **(
            {
                "from": [
                    {"application": a, **({"facility": f} if f is not None else {})}
                    for a, f in rule.senders
                ]
            }
            if rule.senders
            else {}
        ),
    }


def owner_scope(destination: str, peer: str) -> str:
    """The owner of an order key, as the first argument of :func:`key_digest`: the
    destination, a NUL and the peer (:meth:`ReplyRule.order_peer`, :meth:`ReplyRule.reply_peer`)."""
    return f"{destination}\x00{peer}"


def key_digest(destination: str, key: str) -> str:
    """The stored form of an order key: 32 hex digits (128 bits) of SHA-256 of
    ``destination`` (its owner: :func:`owner_scope`), NUL, ``key``."""
    text = f"{destination}\x00{key.strip()}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def rules_of(nodes: Sequence[Mapping[str, Any]] | None) -> tuple[ReplyRule, ...]:
    """Rules from a list in spec form (None: none)."""
    return tuple(parse(n) for n in nodes or ())
