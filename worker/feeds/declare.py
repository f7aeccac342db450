"""Feed declarations: which channels should be busy, how long they may stay silent, and when.

A *feed* is a channel (MLLP or HTTP) that is expected to receive messages. Its declaration says
how long it may go without one (``silentAfterSeconds``), optionally per sending application
(``perSender``: each MSH-3/MSH-4 pair seen on the channel is a feed of its own too) and
optionally only within a weekly schedule (``schedule``, as a Destination's ``spec.schedule``:
:mod:`inturn.worker.spec.schedule`). The file (``inturn ingest --feeds FILE``, ``inturn local
--feeds FILE``, the chart's ``ingest.feeds``) is YAML::

    feeds:
      - channel: adt
        silentAfterSeconds: 1800
        perSender: true
        schedule:
          timeZone: Europe/Berlin
          windows:
            - {days: [Mon, Tue, Wed, Thu, Fri], start: "06:00", end: "20:00"}

Pure: parsing and checking only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from inturn.worker.errors import Invalid
from inturn.worker.spec.documents import DocumentError, read_document
from inturn.worker.spec.schedule import Schedule, ScheduleError, parse
from inturn.worker.spec.schema_delivery import schedule_schema

#: Most feeds in one declaration file.
MAX_FEEDS = 10_000
#: Longest sender key recorded (``MSH-3.1^MSH-4.1``), in characters; longer ones are cut.
MAX_SENDER_CHARS = 180

#: The JSON schema of a declaration file.
FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["feeds"],
    "properties": {
        "feeds": {
            "type": "array",
            "maxItems": MAX_FEEDS,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["channel", "silentAfterSeconds"],
                "properties": {
                    "channel": {
                        "type": "string",
                        "maxLength": 63,
                        "pattern": r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
                    },
                    "silentAfterSeconds": {
                        "type": "integer",
                        "minimum": 60,
                        "maximum": 31_536_000,
                    },
                    "perSender": {"type": "boolean"},
                    "schedule": schedule_schema("When the feed is expected to be busy."),
                },
            },
        }
    },
}


class FeedsError(Invalid):
    """A declaration that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Feed:
    """One declared feed.

    Attributes:
        channel: the channel.
        silent_after_seconds: how long it may go without a message (seconds).
        per_sender: each MSH-3/MSH-4 pair seen on it is a feed of its own too.
        schedule: when it is expected to be busy; None: at all times.
    """

    channel: str
    silent_after_seconds: int
    per_sender: bool = False
    schedule: Schedule | None = None


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _closed(v) for k, v in node.items()}
        if "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


_VALIDATOR = jsonschema.Draft7Validator(_closed(FILE_SCHEMA))


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def feed_problems(doc: Any) -> list[str]:
    """Every problem of a declaration document (parsed YAML), as ``path: problem`` lines
    (``feeds[1].channel: adt is declared twice``), sorted; empty when it is valid."""
    problems = sorted(f"{_path(e.absolute_path)}: {e.message}" for e in _VALIDATOR.iter_errors(doc))
    if problems:
        return problems
    seen: set[str] = set()
    for i, node in enumerate(doc["feeds"]):
        channel = node["channel"]
        if channel in seen:
            problems.append(f"feeds[{i}].channel: {channel} is declared twice")
        seen.add(channel)
        if "schedule" in node:
            try:
                parse(node["schedule"])
            except ScheduleError as exc:
                problems.append(f"feeds[{i}].schedule.{exc}")
    return problems


def parse_feeds(doc: Any, *, source: str = "feeds") -> list[Feed]:
    """Check a declaration document (parsed YAML) and return its feeds, in order.

    Raises:
        FeedsError: not valid (every problem, by field path), a channel declared twice, or a
            time zone this process does not know.
    """
    problems = feed_problems(doc)
    if problems:
        raise FeedsError(f"{source}: " + "; ".join(problems))
    return [
        Feed(
            channel=node["channel"],
            silent_after_seconds=int(node["silentAfterSeconds"]),
            per_sender=bool(node.get("perSender", False)),
            schedule=parse(node["schedule"]) if "schedule" in node else None,
        )
        for node in doc["feeds"]
    ]


def load_feeds(path: str | Path) -> list[Feed]:
    """Read and check a declaration file.

    Raises:
        FeedsError: not UTF-8 YAML, or not valid.
        OSError: the file cannot be read.
    """
    try:
        doc = read_document(path)
    except DocumentError as exc:
        raise FeedsError(f"{path}: {exc}") from None
    return parse_feeds(doc, source=str(path))


def sender_key(sending_application: str, sending_facility: str, component: str = "^") -> str:
    """The sender as recorded: the first components of MSH-3 and MSH-4 joined by ``^``, at
    most :data:`MAX_SENDER_CHARS` characters (raw field text, never message content)."""
    app = sending_application.split(component, 1)[0]
    facility = sending_facility.split(component, 1)[0]
    return f"{app}^{facility}"[:MAX_SENDER_CHARS]
