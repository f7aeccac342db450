"""What a Destination may declare about the shape of what its receiver gets: ``spec.profile``
(:mod:`inturn.worker.hl7.profile`). Pure data, part of :mod:`inturn.worker.spec.schema`.

The schema bounds every part (64 references a rule, 32 maps of at most 5,000 entries, values of
199 characters without control characters). CEL rules say what can be said on bounded strings:
``clear`` and ``maps`` may not name MSH-1, MSH-2, MSH-10 or PID-3. The keys of ``set``, ``copy``
and ``truncate`` are names in a map, whose length no schema bounds: a CEL rule over them would
carry an unbounded cost estimate (the API server refuses a CRD whose rules may cost too much),
so they are checked by :func:`inturn.worker.hl7.profile.problems`, which ``inturn validate``,
``inturn local``, ``inturn worker`` and the operator (``InvalidSpec``) all run, with the other
rules no schema can say (a glob that would remove MSH or PID, a field written twice).
"""

from __future__ import annotations

import re

from inturn.worker.hl7 import profile as shaping
from inturn.worker.spec.openapi import Rule, Schema
from inturn.worker.spec.openapi import boolean as _bool
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import string as _str

#: Most references one rule names (``set``, ``copy``, ``clear``, ``truncate``, ``removeSegments``).
MAX_REFERENCES = 64
#: Most ``maps``, and entries in one map's table.
MAX_MAPS = 32
MAX_TABLE_ENTRIES = 5000
#: Longest literal or mapped value, characters.
MAX_VALUE_CHARS = 199
#: Longest ``truncate`` limit, bytes.
MAX_TRUNCATE_BYTES = 1_000_000
#: A value written into a message: no control character (a CR would end the segment).
VALUE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
#: A reference as the schema's CEL rules write it (``[.]`` rather than an escaped dot).
_PATH_CEL = shaping.PATH_PATTERN.replace(r"\.", "[.]")
_CORRELATION_CEL = shaping.CORRELATION_PATTERN

RULE_CLEAR_NOT_CORRELATION = Rule(
    cel=f"!has(self.clear) || self.clear.all(c, !c.matches('{_CORRELATION_CEL}'))",
    message=(
        "MSH-1 and MSH-2 (the delimiters), MSH-10 (the receiver's ACK names it) and PID-3 (the"
        " patient) may not be changed by a profile"
    ),
    check=lambda node: all(
        re.match(shaping.CORRELATION_PATTERN, str(c)) is None for c in node.get("clear", ())
    ),
    field_path=".clear",
)

RULE_MAP_NOT_CORRELATION = Rule(
    cel=f"!self.field.matches('{_CORRELATION_CEL}')",
    message=RULE_CLEAR_NOT_CORRELATION.message,
    check=lambda node: re.match(shaping.CORRELATION_PATTERN, str(node["field"])) is None,
    field_path=".field",
)


def _reference(description: str) -> Schema:
    return _str(description, max_length=15, min_length=5, pattern=_PATH_CEL)


def _references_map(description: str, values: Schema) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": MAX_REFERENCES,
        "additionalProperties": values,
    }


def _value(description: str) -> Schema:
    return _str(description, max_length=MAX_VALUE_CHARS, pattern=VALUE_PATTERN)


def profile_schema() -> Schema:
    """The node of ``spec.profile`` (a fresh dict)."""
    targets = tuple(shaping.CHARSET_TARGETS)
    return _obj(
        {
            "set": _references_map(
                "Fields given a literal value, by reference (MSH-5: LIS_NORTH); a delimiter in"
                " the value is escaped (one value: set components by SEG-F.C).",
                _value("The literal."),
            ),
            "copy": _references_map(
                "Fields given another field's value as the message was stored (MSH-6: MSH-4).",
                _reference("The field read."),
            ),
            "removeSegments": {
                "type": "array",
                "description": (
                    "Segments left out, by ID or glob (Z*, NTE; * any run, ? one character);"
                    " never MSH or PID."
                ),
                "maxItems": MAX_REFERENCES,
                "items": _str(
                    "A segment ID or glob.",
                    max_length=8,
                    min_length=1,
                    pattern=shaping.SEGMENT_GLOB_PATTERN,
                ),
            },
            "clear": {
                "type": "array",
                "description": "Fields emptied, the separators around them kept (PID-19).",
                "maxItems": MAX_REFERENCES,
                "items": _reference("A field, component or subcomponent."),
            },
            "truncate": _references_map(
                "Fields cut to at most this many bytes in the character set sent, never inside"
                " a character or an escape sequence (OBX-5: 200).",
                _int("Bytes.", minimum=1, maximum=MAX_TRUNCATE_BYTES),
            ),
            "charset": _obj(
                {
                    "to": _str(
                        "The character set sent; MSH-18 is set to its HL7 table 0211 name.",
                        max_length=11,
                        enum=targets,
                    ),
                    "unmappable": _str(
                        "A character the target lacks: refuse (the message is refused,"
                        " naming the field), replace (?), or transliterate (é to e, ß to ss;"
                        " else ?). A byte that does not decode as the message's charset is"
                        " refused in every mode.",
                        max_length=13,
                        enum=("refuse", "replace", "transliterate"),
                        default="refuse",
                    ),
                    "whenUndeclared": _str(
                        "The character set of a message whose MSH-18 is empty (HL7's default"
                        " is ASCII).",
                        max_length=11,
                        enum=targets,
                        default="ASCII",
                    ),
                },
                required=("to",),
                description=(
                    "Re-encode: decoded by the message's own MSH-18, encoded in the target,"
                    " MSH-18 set to match."
                ),
            ),
            "sequenceNumbers": _bool(
                "Number the messages sent in MSH-13 (HL7 sequence number protocol): persisted"
                " with the queue, never repeated or skipped across restarts and lanes.",
                default=False,
            ),
            "maps": {
                "type": "array",
                "description": "Value maps: each value of a field looked up in a table.",
                "maxItems": MAX_MAPS,
                "items": _obj(
                    {
                        "field": _reference("The field, e.g. OBX-3.1."),
                        "table": {
                            "type": "object",
                            "description": (
                                'Value as received -> value sent; the key "" maps an empty'
                                " or absent value (otherwise empty values are left alone)."
                            ),
                            "maxProperties": MAX_TABLE_ENTRIES,
                            "additionalProperties": _value("The value sent."),
                        },
                        "otherwise": _str(
                            "A value not in the table: keep it, clear it, or hold the message"
                            " (a refusal naming the field and the value; ackPolicy.profile"
                            " decides, unset: held at the head under maxAttempts 0, given up"
                            " at once above 0).",
                            max_length=5,
                            enum=("keep", "clear", "hold"),
                            default="keep",
                        ),
                    },
                    required=("field", "table"),
                    description="One value map.",
                    rules=(RULE_MAP_NOT_CORRELATION,),
                ),
            },
        },
        description=(
            "What the receiver gets, when it is not the message as stored: applied right"
            " before each send; the stored message never changes. MSH-10 and PID-3 are never"
            " changed. Unset: the bytes as received."
        ),
        rules=(RULE_CLEAR_NOT_CORRELATION,),
    )
