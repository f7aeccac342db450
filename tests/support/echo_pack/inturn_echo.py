"""A rule pack of another distribution, for the tests: ``echo``.

Not part of inturn and never imported by it: :mod:`tests.acceptance.test_pack_distribution`
copies this file beside a ``.dist-info`` of its own (``inturn-echo``, entry point ``echo`` of
the group ``inturn.packs``) and puts that folder on the ``PYTHONPATH`` of ``inturn local``, as
``pip install inturn-echo`` would. Nothing of inturn is edited for it; it declares

* a ``spec`` field, ``echo`` (``replyChannel``, ``withinSeconds``), which the Destination
  schema takes (an ``echo`` of the wrong shape is refused like any field);
* a mark hook: every message delivered to a Destination with ``spec.echo`` waits for an echo,
  keyed by its MSH-10, on ``replyChannel``;
* an ingest hook: a message on a ``replyChannel`` answers the expectations whose key is its
  MSA-2, of the destinations that wait for echoes there (``spec.echo`` as the registry has it;
  the owner of a key is the destination the message was delivered to).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inturn.worker.hl7.fields import first_components
from inturn.worker.hl7.header import parse_header
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.worklist.hooks import Answerer, Answers, KeyDigest, Marker, Registered
from inturn.worker.worklist.pack import Pack, SpecField


def echo_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Wait for an echo of every message delivered here (the echo test pack).",
        "properties": {
            "replyChannel": {"type": "string", "maxLength": 63, "minLength": 1},
            "withinSeconds": {"type": "integer", "minimum": 60, "default": 3600},
        },
        "required": ["replyChannel"],
    }


@dataclass(frozen=True)
class Echo:
    """One expected echo (what the store's mark statement records of an expected reply)."""

    key: str
    digest: str
    channel: str
    reply_types: tuple[str, ...]
    within_seconds: int


def mark(config: WorkerConfig, digest: KeyDigest) -> Marker | None:
    echo: Mapping[str, Any] | None = config.pack_spec.get("echo")
    if not echo:
        return None
    channel, within = str(echo["replyChannel"]), int(echo.get("withinSeconds", 3600))

    def opened(message_type: str, payload: bytes) -> Sequence[Echo]:
        key = parse_header(payload).control_id
        return [Echo(key, digest(config.destination, key), channel, ("ACK",), within)]

    return opened


def ingest(destinations: Sequence[Registered]) -> dict[str, Answerer]:
    owners: dict[str, list[str]] = {}
    for d in destinations:
        echo = d.spec.get("echo")
        if echo:
            owners.setdefault(str(echo["replyChannel"]), []).append(d.destination)
    return {channel: functools.partial(answer, tuple(o)) for channel, o in owners.items()}


def answer(
    destinations: tuple[str, ...], message_type: str, payload: bytes, digests: Sequence[KeyDigest]
) -> Answers | None:
    keys = first_components(payload, "MSA-2", limit=1)
    found = {d(owner, key) for d in digests for owner in destinations for key in keys}
    return Answers(tuple(sorted(found)), reply=True)


PLUGIN = Pack(
    name="echo",
    spec_fields=(SpecField(name="echo", schema=echo_schema),),
    ingest=ingest,
    mark=mark,
)
