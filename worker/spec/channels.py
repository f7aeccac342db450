"""Ingest channel declarations: the MLLP listeners ingest opens, who may connect to each, and what
it does with a message no destination takes.

The declaration is the Helm chart's ``ingest.channels`` list (or a file of the same shape,
``channels: [...]``, which ``inturn validate`` reads)::

    channels:
      - name: adt
        port: 2575
        allowedNetworks: [10.20.0.0/16]
        unrouted: hold
      - name: lab
        port: 2576
        unrouted: accept

``unrouted`` says what ingest answers for a message of the channel that no destination takes
(the channel has none, or no destination's filter takes it):

* ``reject`` (the default): AR (CR in enhanced mode) with ERR 207 or 200; nothing is stored;
* ``hold``: AA, and the message is stored for ``_unrouted/<channel>``, where it waits for a person
  (``inturn ingest --hold-unrouted CHANNEL``);
* ``accept``: AA, nothing is stored, and the message is counted
  (``inturn_ingest_unrouted_total{outcome="dropped"}``; ``inturn ingest --accept-unrouted
  CHANNEL``): what Mirth Connect calls a FILTERED message.

Pure: parsing and checking only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

#: What ingest does with a message no destination takes (see the module docstring).
Unrouted = Literal["reject", "hold", "accept"]
UNROUTED: tuple[Unrouted, ...] = ("reject", "hold", "accept")

#: The pattern of a channel name (as ``spec.channel`` of a Destination).
CHANNEL_PATTERN = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"

#: The JSON schema of one declared channel: the chart's ``ingest.channels`` items (a test holds
#: ``charts/inturn/values.schema.json`` to it).
CHANNEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": CHANNEL_PATTERN},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "allowedNetworks": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[0-9a-fA-F:.]+/[0-9]{1,3}$"},
        },
        "allowedSubjects": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "unrouted": {"type": "string", "enum": list(UNROUTED)},
    },
    "additionalProperties": False,
    "required": ["name", "port"],
}

#: The schema of a declaration file (``channels: [...]``).
FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["channels"],
    "properties": {"channels": {"type": "array", "minItems": 1, "items": CHANNEL_SCHEMA}},
}


@dataclass(frozen=True)
class Channel:
    """One declared channel.

    Attributes:
        name: the channel.
        port: its MLLP port.
        allowed_networks, allowed_subjects: who may connect (empty: anyone).
        unrouted: ``reject``, ``hold`` or ``accept`` (see the module docstring).
    """

    name: str
    port: int
    allowed_networks: tuple[str, ...] = ()
    allowed_subjects: tuple[str, ...] = ()
    unrouted: Unrouted = "reject"


def _path(parts: Any, prefix: str) -> str:
    out = prefix
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def problems(channels: Any, *, prefix: str = "channels") -> Iterator[str]:
    """Every problem of a list of channel declarations, as ``path: problem`` lines: schema
    errors, then names and ports declared twice.

    Args:
        channels: the parsed list (``ingest.channels`` of a values file).
        prefix: the path of the list in its document, for the messages.
    """
    schema = {"type": "array", "items": CHANNEL_SCHEMA}
    errors = sorted(
        (_path(e.absolute_path, prefix), e.message)
        for e in jsonschema.Draft7Validator(schema).iter_errors(channels)
    )
    for where, message in errors:
        yield f"{where}: {message}"
    if not isinstance(channels, list):
        return
    names: dict[str, int] = {}
    ports: dict[int, int] = {}
    for i, node in enumerate(channels):
        if not isinstance(node, dict):
            continue
        name, port = node.get("name"), node.get("port")
        if isinstance(name, str):
            first = names.setdefault(name, i)
            if first != i:
                yield f"{prefix}[{i}].name: {name} is declared twice (also {prefix}[{first}])"
        if isinstance(port, int):
            first = ports.setdefault(port, i)
            if first != i:
                yield f"{prefix}[{i}].port: {port} is used twice (also {prefix}[{first}])"


def parse_channels(channels: Any, *, prefix: str = "channels") -> list[Channel]:
    """Check a list of channel declarations and return them, in order.

    Raises:
        ValueError: not valid; the message lists every problem (``path: problem``, ``; ``).
    """
    found = list(problems(channels, prefix=prefix))
    if found:
        raise ValueError("; ".join(found))
    return [
        Channel(
            name=node["name"],
            port=int(node["port"]),
            allowed_networks=tuple(node.get("allowedNetworks", ())),
            allowed_subjects=tuple(node.get("allowedSubjects", ())),
            unrouted=node.get("unrouted", "reject"),
        )
        for node in channels
    ]
