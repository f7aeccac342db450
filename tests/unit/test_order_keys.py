"""spec.replies: keys of orders and replies (pure), HL7 field extraction."""

from __future__ import annotations

import pytest

from inturn.worker.hl7.fields import first_components, parse_field
from inturn.worker.orders.keys import expectations, reply_digests
from inturn.worker.spec.replies import ReplyRule, key_digest, owner_scope, parse, to_spec

ORDER = (
    b"MSH|^~\\&|EHR|HOSP|LIS|LAB|20261201||ORM^O01|O1|P|2.5\r"
    b"PID|1||P1^^^H^MR\r"
    b"ORC|NW|PL-1^EHR|||\r"
    b"OBR|1|PL-1^EHR||CBC\r"
    b"ORC|NW|PL-2~PL-X^EHR\r"
)
RESULT = (
    b"MSH|^~\\&|LIS|LAB|EHR|HOSP|20261201||ORU^R01|R1|P|2.5\r"
    b"PID|1||P1^^^H^MR\r"
    b"OBR|1| PL-1 ^EHR|F-9|CBC\r"
)
RULE = ReplyRule(("ORM^O01", "OML^O21"), ("ORU^R01", "ORR^O02"), "results", 3600)


@pytest.mark.parametrize(
    ("ref", "values"),
    [
        ("ORC-2", ["PL-1", "PL-2"]),  # first repetition, first component, every ORC
        ("OBR-2", ["PL-1"]),
        ("MSH-10", ["O1"]),  # MSH counts MSH-1 as the separator itself
        ("PID-3", ["P1"]),
        ("ORC-9", []),
        ("ZZZ-1", []),
    ],
)
def test_first_components(ref: str, values: list[str]) -> None:
    assert first_components(ORDER, ref) == values


def test_field_references_are_checked() -> None:
    assert parse_field("OBR-2") == ("OBR", 2)
    for bad in ("ORC2", "orc-2", "ORC-0", "ORCX-2"):
        with pytest.raises(ValueError):
            parse_field(bad)


def test_an_order_opens_one_expectation_per_key_and_a_result_answers_it() -> None:
    opened = expectations("lab/lis", [RULE], "ORM^O01", ORDER)
    assert [(e.key, e.channel, e.within_seconds) for e in opened] == [
        ("PL-1", "results", 3600),
        ("PL-2", "results", 3600),
    ]
    owner = owner_scope("lab/lis", "LIS^LAB")  # the order is addressed to LIS at LAB
    assert opened[0].digest == key_digest(owner, "PL-1") and len(opened[0].digest) == 32
    assert expectations("lab/lis", [RULE], "ADT^A01", ORDER) == []  # not an order type
    answered = reply_digests([("lab/lis", RULE)], "results", "ORU^R01", RESULT)
    assert answered == [key_digest(owner, "PL-1")]  # stripped, first component
    assert reply_digests([("lab/lis", RULE)], "adt", "ORU^R01", RESULT) == []  # other channel
    assert reply_digests([("lab/lis", RULE)], "results", "ADT^A08", RESULT) == []  # other type
    # the key names one destination's orders only
    assert key_digest("lab/other", "PL-1") != key_digest("lab/lis", "PL-1")


def test_spec_round_trip_and_defaults() -> None:
    node = {
        "orderTypes": ["ORM^O01"],
        "replyTypes": ["ORU^R01"],
        "channel": "results",
        "withinSeconds": 600,
    }
    rule = parse(node)
    assert (rule.order_field, rule.reply_fields) == ("ORC-2", ("ORC-2", "OBR-2"))
    assert parse(to_spec(rule)) == rule


def test_from_round_trips_and_decides_who_answers() -> None:
    node = {
        "orderTypes": ["ORM^O01"],
        "replyTypes": ["ORU^R01"],
        "channel": "results",
        "withinSeconds": 600,
        "from": [{"application": "LIS"}, {"application": "LIS2", "facility": "B"}],
    }
    rule = parse(node)
    assert rule.senders == (("LIS", None), ("LIS2", "B"))
    assert parse(to_spec(rule)) == rule
    assert rule.order_peer("ANYONE", "ANYWHERE") == rule.reply_peer("LIS", "X")
    assert rule.order_peer("ANYONE", "ANYWHERE") == rule.reply_peer("LIS2", "B")
    assert rule.order_peer("LIS2", "C") != rule.reply_peer("LIS2", "C")
    assert rule.order_peer("ANYONE", "ANYWHERE") != rule.reply_peer("ANYONE", "ANYWHERE")
    plain = parse({k: v for k, v in node.items() if k != "from"})
    assert plain.order_peer("LIS", "LAB") == plain.reply_peer(" LIS", "LAB ")
    assert plain.order_peer("LIS", "LAB") != plain.reply_peer("LIS", "LAB2")
