"""The orders pack's field of ``Destination.spec``: ``replies``, what a delivered order expects
back (:class:`~inturn.worker.spec.schema_packs.SpecField`; pure data).
"""

from __future__ import annotations

from inturn.worker.hl7.fields import FIELD_PATTERN
from inturn.worker.spec.openapi import Schema
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import string as _str
from inturn.worker.spec.replies import DEFAULT_ORDER_FIELD, DEFAULT_REPLY_FIELDS
from inturn.worker.spec.schema_packs import SpecField

_TYPE_PATTERN = r"^[A-Za-z0-9*?]+(\^[A-Za-z0-9_*?]+)?$"

#: An HD first component as it appears in MSH-3/MSH-4: no separator, no control character.
_HD_PATTERN = r"^[^|^~\\&\x00-\x1f\x7f]+$"


def _types(description: str) -> Schema:
    return {
        "type": "array",
        "description": description,
        "minItems": 1,
        "maxItems": 16,
        "items": _str("An MSH-9 pattern.", max_length=32, min_length=1, pattern=_TYPE_PATTERN),
    }


def replies_schema() -> Schema:
    """The schema of ``spec.replies`` (a fresh dict)."""
    field = _str("A field, e.g. ORC-2.", max_length=7, pattern=FIELD_PATTERN)
    return {
        "type": "array",
        "description": (
            "Replies this destination's orders expect: an order delivered without its reply"
            " arriving in time is placed on the orders worklist (unanswered-order) by the"
            " sweeper."
        ),
        "maxItems": 8,
        "items": _obj(
            {
                "orderTypes": _types(
                    "MSH-9 patterns of the messages sent here that expect a reply, e.g. ORM^O01."
                ),
                "replyTypes": _types("MSH-9 patterns of the replies, e.g. ORU^R01, ORR^O02."),
                "channel": _str(
                    "The ingest channel the replies arrive on.",
                    max_length=63,
                    min_length=1,
                    pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
                ),
                "withinSeconds": _int(
                    "How long a reply may take after the order was delivered.",
                    minimum=60,
                    maximum=31_536_000,
                ),
                "orderField": {
                    **field,
                    "description": "Where the matching key is in the order (first component).",
                    "default": DEFAULT_ORDER_FIELD,
                },
                "replyFields": {
                    "type": "array",
                    "description": "Where the key may be in a reply (first component of each).",
                    "minItems": 1,
                    "maxItems": 4,
                    "items": field,
                    "default": list(DEFAULT_REPLY_FIELDS),
                },
                "from": {
                    "type": "array",
                    "description": (
                        "The senders whose replies may answer these orders (MSH-3 and MSH-4,"
                        " first components). Without it, a reply answers an order only when"
                        " it comes from the application and facility the order was addressed"
                        " to (the reply's MSH-3/MSH-4 equal to the order's MSH-5/MSH-6)."
                    ),
                    "minItems": 1,
                    "maxItems": 16,
                    "items": _obj(
                        {
                            "application": _str(
                                "MSH-3 of the replies (first component).",
                                max_length=180,
                                min_length=1,
                                pattern=_HD_PATTERN,
                            ),
                            "facility": _str(
                                "MSH-4 of the replies (first component); any when absent.",
                                max_length=180,
                                min_length=1,
                                pattern=_HD_PATTERN,
                            ),
                        },
                        required=("application",),
                        description="One sender of replies.",
                    ),
                },
            },
            required=("orderTypes", "replyTypes", "channel", "withinSeconds"),
            description="One expected reply.",
        ),
    }


#: ``spec.replies`` as the orders pack declares it.
REPLIES = SpecField(name="replies", schema=replies_schema)
