"""Which expectations a delivered order opens, and which keys a received reply answers.

Pure: the worker calls :func:`expectations` with the head it just delivered; ingest calls
:func:`reply_digests` with each message it stores, through the pack's ingest hook
(:func:`answerers`, which ingest reaches through the registry of packs). Types are matched as
destination filters are (:func:`inturn.worker.ingest.routing.type_matches`); keys are first
components of the fields the rule names (:func:`inturn.worker.hl7.fields.first_components`),
stored as digests
(:func:`inturn.worker.spec.replies.key_digest`) under their owner
(:func:`inturn.worker.spec.replies.owner_scope`): the destination and the peer, so that a reply
answers only orders addressed to its sender (or to a sender ``from`` declares).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.fields import first_components
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.types import type_matches
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.spec.replies import (
    MAX_KEYS_PER_MESSAGE,
    ReplyRule,
    key_digest,
    owner_scope,
    rules_of,
)
from inturn.worker.worklist.hooks import Answerer, Answers, KeyDigest, Marker, Registered

log = logging.getLogger("inturn.orders")


@dataclass(frozen=True)
class Expectation:
    """A reply one delivered order waits for.

    Attributes:
        key: the matching key in clear (shown on the worklist item, erased with the patient).
        digest: :func:`key_digest` of the destination and the key (what a reply is matched by).
        channel: where the reply arrives.
        reply_types: MSH-9 patterns of the reply (for the record).
        within_seconds: how long it may take.
    """

    key: str
    digest: str
    channel: str
    reply_types: tuple[str, ...]
    within_seconds: int


def _split(message_type: str) -> tuple[str, str]:
    code, _, trigger = message_type.partition("^")
    return code, trigger


def _parties(payload: bytes) -> tuple[str, str, str, str]:
    """MSH-3, MSH-4, MSH-5, MSH-6 of ``payload``, first components ('' each when unreadable)."""
    try:
        header = parse_header(payload)
    except HeaderError:
        return "", "", "", ""
    comp = header.delimiters.component
    return (
        header.sending_application.split(comp, 1)[0],
        header.sending_facility.split(comp, 1)[0],
        header.receiving_application.split(comp, 1)[0],
        header.receiving_facility.split(comp, 1)[0],
    )


#: The stored form of an order key (:data:`inturn.worker.worklist.hooks.KeyDigest`).
OrderDigest = KeyDigest


def expectations(
    destination: str,
    rules: Iterable[ReplyRule],
    message_type: str,
    payload: bytes,
    digest: OrderDigest = key_digest,
) -> list[Expectation]:
    """The expectations an order of ``message_type`` (``CODE^TRIGGER``) delivered to
    ``destination`` opens: one per rule whose ``orderTypes`` match and per key found in its
    ``orderField`` (an order without a key opens none), at most
    :data:`~inturn.worker.spec.replies.MAX_KEYS_PER_MESSAGE`; each digest is under the order's
    owner (the destination and the peer it is addressed to, MSH-5/MSH-6, or ``from``)."""
    code, trigger = _split(message_type)
    out: list[Expectation] = []
    parties: tuple[str, str, str, str] | None = None
    for rule in rules:
        if not type_matches(rule.order_types, code, trigger):
            continue
        parties = parties or _parties(payload)
        owner = owner_scope(destination, rule.order_peer(parties[2], parties[3]))
        for key in first_components(payload, rule.order_field, limit=MAX_KEYS_PER_MESSAGE):
            if len(out) >= MAX_KEYS_PER_MESSAGE:
                return out
            out.append(
                Expectation(
                    key=key,
                    digest=digest(owner, key),
                    channel=rule.channel,
                    reply_types=rule.reply_types,
                    within_seconds=rule.within_seconds,
                )
            )
    return out


def is_reply(rules: Iterable[tuple[str, ReplyRule]], channel: str, message_type: str) -> bool:
    """Whether a message of ``message_type`` received on ``channel`` is a reply to some
    destination's orders (its ``channel`` and ``replyTypes`` match), whether or not it carries
    a key: one that answers nothing is counted as unmatched all the same."""
    code, trigger = _split(message_type)
    return any(
        rule.channel == channel and type_matches(rule.reply_types, code, trigger)
        for _, rule in rules
    )


def reply_digests(
    rules: Iterable[tuple[str, ReplyRule]],
    channel: str,
    message_type: str,
    payload: bytes,
    digests: Sequence[OrderDigest] = (key_digest,),
) -> list[str]:
    """The key digests a message of ``message_type`` received on ``channel`` answers: for
    every ``(destination, rule)`` whose reply ``channel`` and ``replyTypes`` match, each key
    found in its ``replyFields``, under the owner the reply speaks for (the destination, and
    its sender MSH-3/MSH-4 as :meth:`ReplyRule.reply_peer` sees it): it can match only the
    orders addressed to that sender. Sorted, no repeats, at most
    :data:`~inturn.worker.spec.replies.MAX_KEYS_PER_MESSAGE` per form. Empty: not a reply.

    ``digests``: every stored form an open expectation may have (with payload keys, the blind
    one and the plain one of orders delivered before the keys were given)."""
    code, trigger = _split(message_type)
    found: set[str] = set()
    parties: tuple[str, str, str, str] | None = None
    for destination, rule in rules:
        if rule.channel != channel or not type_matches(rule.reply_types, code, trigger):
            continue
        parties = parties or _parties(payload)
        owner = owner_scope(destination, rule.reply_peer(parties[0], parties[1]))
        for ref in rule.reply_fields:
            for key in first_components(payload, ref, limit=MAX_KEYS_PER_MESSAGE):
                found.update(d(owner, key) for d in digests)
    return sorted(found)[: MAX_KEYS_PER_MESSAGE * len(digests)]


def answerers(destinations: Sequence[Registered]) -> dict[str, Answerer]:
    """The orders pack's ingest hook: for every channel some destination's ``spec.replies``
    expects replies on, what a message of it answers (:func:`is_reply`, :func:`reply_digests`).
    A destination whose registered ``replies`` cannot be read is logged and left out."""
    by_channel: dict[str, list[tuple[str, ReplyRule]]] = {}
    for d in destinations:
        try:
            rules = rules_of(d.spec.get("replies"))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("destination %s: spec.replies unreadable (%s)", d.destination, exc)
            continue
        for rule in rules:
            by_channel.setdefault(rule.channel, []).append((d.destination, rule))
    return {
        channel: functools.partial(_answer, tuple(rules), channel)
        for channel, rules in by_channel.items()
    }


def _answer(
    rules: tuple[tuple[str, ReplyRule], ...],
    channel: str,
    message_type: str,
    payload: bytes,
    digests: Sequence[KeyDigest],
) -> Answers | None:
    """What one message of ``channel`` answers (None: it is no reply and carries no key)."""
    reply = is_reply(rules, channel, message_type)
    keys = reply_digests(rules, channel, message_type, payload, digests)
    return Answers(tuple(keys), reply) if reply or keys else None


def marker(config: WorkerConfig, digest: KeyDigest) -> Marker | None:
    """The orders pack's mark hook: for a destination with ``spec.replies``, the
    :func:`expectations` each delivered order opens (keys stored by ``digest``); None without."""
    if not config.replies:
        return None
    return functools.partial(expectations, config.destination, config.replies, digest=digest)
