"""Read one field of one segment type from every such segment of a message.

Source: HL7 v2.x chapter 2, "Message construction rules" (segments, fields, components,
repetitions, the delimiters of MSH-1/MSH-2). Field numbers follow the standard: ``ORC-2`` is
the second field after the segment ID. Values are raw (escape sequences left as written) and
latin-1 decoded, so that no byte of the message is ever lost or invented.

Pure: no I/O.
"""

from __future__ import annotations

import re

from inturn.worker.hl7.delimiters import delimiters_of, split_segments, strip_preamble

#: A field reference: a segment ID (three upper-case letters or digits, starting with a letter)
#: and a field number from 1 to 999, e.g. ``ORC-2``.
FIELD_PATTERN = r"^[A-Z][A-Z0-9]{2}-[1-9][0-9]{0,2}$"
_FIELD = re.compile(FIELD_PATTERN)


def parse_field(ref: str) -> tuple[str, int]:
    """``"ORC-2"`` -> ``("ORC", 2)``.

    Raises:
        ValueError: not a field reference (see :data:`FIELD_PATTERN`).
    """
    if not _FIELD.match(ref):
        raise ValueError(f"{ref!r} is not a field reference such as ORC-2")
    segment, number = ref.split("-")
    return segment, int(number)


def first_components(payload: bytes, ref: str, *, limit: int = 100) -> list[str]:
    """The first component of the first repetition of field ``ref`` (``ORC-2``) in every
    segment of that type, stripped, in message order, without empty values or repeats; at most
    ``limit`` values (a bound on what a peer's message can make us compute and store).

    For MSH the numbering of MSH-1 (the separator itself) is honoured: ``MSH-10`` is MSH-10.

    Raises:
        ValueError: ``ref`` is not a field reference.
    """
    segment_id, number = parse_field(ref)
    d = delimiters_of(payload)
    text = strip_preamble(payload).decode("latin-1")
    out: list[str] = []
    for segment in split_segments(text):
        if not segment.startswith(segment_id) or segment[3:4] not in (d.field, ""):
            continue
        fields = segment.split(d.field)
        index = number - 1 if segment_id == "MSH" else number
        if index >= len(fields):
            continue
        value = fields[index].split(d.repetition, 1)[0].split(d.component, 1)[0].strip()
        if value and value not in out:
            out.append(value)
            if len(out) >= limit:
                break
    return out
