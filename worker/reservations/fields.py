"""The reservations pack's field of ``Destination.spec``: ``carriers``, the airlines a
Destination serves (:class:`~inturn.worker.spec.schema_packs.SpecField`; pure data, declared
whether or not the ``reservations`` extra is installed).
"""

from __future__ import annotations

from inturn.worker.spec.openapi import Rule, Schema
from inturn.worker.spec.openapi import string as _str
from inturn.worker.spec.schema_packs import SpecField

#: An IATA airline designator: two letters or digits, optionally a third letter.
CARRIER_PATTERN = r"^[A-Z0-9]{2}[A-Z]?$"

RULE_CARRIERS_DISTINCT = Rule(
    cel="!has(self.carriers) || self.carriers.all(c, self.carriers.filter(d, d == c).size() == 1)",
    message="each carrier may be listed once",
    check=lambda node: len(set(node.get("carriers", ()))) == len(node.get("carriers", ())),
    field_path=".carriers",
)


def carriers_schema() -> Schema:
    """The schema of ``spec.carriers`` (a fresh dict)."""
    return {
        "type": "array",
        "description": (
            "IATA airline designators (e.g. LH) whose reservation messages, such as"
            " cancellation notices, go to this destination. At most one live Destination may"
            " serve a carrier: the operator and inturn local refuse a second one."
        ),
        "maxItems": 64,
        "items": _str("An IATA airline designator.", max_length=3, pattern=CARRIER_PATTERN),
    }


#: ``spec.carriers`` as the reservations pack declares it.
CARRIERS = SpecField(name="carriers", schema=carriers_schema, rules=(RULE_CARRIERS_DISTINCT,))
