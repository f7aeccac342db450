"""What a Destination takes, as the API declares it: the conditions on HL7 fields of its
``filter.fields`` and their rules. Pure data, part of :mod:`inturn.worker.spec.schema`.
"""

from __future__ import annotations

import re

from inturn.worker.hl7 import filter as field_filter
from inturn.worker.spec.openapi import Rule, Schema
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import string as _str

#: Most conditions in one ``spec.filter.fields`` and values in one condition.
MAX_FIELD_CONDITIONS = 16

MAX_FIELD_VALUES = 64

_VALUELESS_CEL = "self.operator == 'Exists' || self.operator == 'DoesNotExist'"

RULE_FIELD_NO_VALUES = Rule(
    cel=f"!({_VALUELESS_CEL}) || !has(self.values)",
    message="Exists and DoesNotExist take no values",
    check=lambda node: node["operator"] not in field_filter.VALUELESS or "values" not in node,
    field_path=".values",
)

RULE_FIELD_VALUES = Rule(
    cel=f"({_VALUELESS_CEL}) || (has(self.values) && self.values.size() > 0)",
    message="In, NotIn, Matches and NotMatches need at least one value",
    check=lambda node: node["operator"] in field_filter.VALUELESS or bool(node.get("values")),
    field_path=".values",
)

_DELIMITER_FIELD = r"^MSH-[12]([.]|$)"

RULE_FIELD_NOT_DELIMITER = Rule(
    cel=f"!self.field.matches('{_DELIMITER_FIELD}')",
    message="MSH-1 and MSH-2 are the delimiters; filters read MSH-3 and later",
    check=lambda node: re.match(_DELIMITER_FIELD, str(node["field"])) is None,
    field_path=".field",
)


def filter_fields_schema() -> Schema:
    return {
        "type": "array",
        "description": (
            "Conditions on HL7 fields, all of which must hold, e.g. {field: MSH-4, operator: In,"
            " values: [NORTH]}. A field is SEG-F, SEG-F.C or SEG-F.C.S (first component and"
            " subcomponent when not given); every segment of that ID and every repetition is"
            " read."
        ),
        "maxItems": MAX_FIELD_CONDITIONS,
        "items": _obj(
            {
                "field": _str(
                    "The field, e.g. MSH-4, PV1-3, PID-3.4.",
                    max_length=15,
                    pattern=field_filter.FIELD_REF_PATTERN,
                ),
                "operator": _str(
                    "In, NotIn (equal to one of values), Matches, NotMatches (values are"
                    " patterns with * and ?), Exists, DoesNotExist (no values).",
                    max_length=16,
                    enum=field_filter.OPERATORS,
                ),
                "values": {
                    "type": "array",
                    "description": "Values, or patterns for Matches and NotMatches.",
                    "maxItems": MAX_FIELD_VALUES,
                    "items": _str("A value or pattern.", max_length=199, min_length=1),
                },
            },
            required=("field", "operator"),
            description="One condition on a field.",
            rules=(RULE_FIELD_NO_VALUES, RULE_FIELD_VALUES, RULE_FIELD_NOT_DELIMITER),
        ),
    }
