"""Field conditions of a Destination's filter (spec.filter.fields): references, values, operators,
their schema and CEL twins, and routing by them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inturn.worker.hl7.filter import (
    MAX_VALUES_PER_REFERENCE,
    FieldCondition,
    FieldRef,
    MessageFields,
    conditions_of,
    holds,
    parse,
)
from inturn.worker.ingest.routing import Route, RouteTable, _row_route
from inturn.worker.spec.config import from_dict, to_dict
from inturn.worker.spec.destination import ManifestError, load_manifest, load_worker_config
from tests.support.manifests import destination, mllp

ORU = (
    b"MSH|^~\\&|LAB|NORTH^1.2.3^ISO|LIS|NORTH|20260101120000||ORU^R01^ORU_R01|C1|P|2.5.1\r"
    b"PID|1||123^^^NORTH&1.2.3&ISO^MR~T99^^^TEMP^PI||DOE^JANE\r"
    b"PV1|1|I|4W^401^B^NORTH||||\r"
    b"OBR|1|PL1||GLU\r"
    b"OBX|1|NM|GLU||5.4|mmol/L\r"
    b"OBX|2|NM|K||4.1|mmol/L\r"
)


def fields(payload: bytes = ORU) -> MessageFields:
    return MessageFields(payload)


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("MSH-4", FieldRef("MSH", 4, 1, 1)),
        ("PV1-3", FieldRef("PV1", 3, 1, 1)),
        ("PID-3.4", FieldRef("PID", 3, 4, 1)),
        ("PID-3.4.2", FieldRef("PID", 3, 4, 2)),
        ("ZX1-999.999.999", FieldRef("ZX1", 999, 999, 999)),
    ],
)
def test_references_parse(text: str, ref: FieldRef) -> None:
    assert FieldRef.parse(text) == ref


@pytest.mark.parametrize(
    "text", ["MSH-1", "MSH-2.1", "PID3", "pid-3", "PID-0", "PID-3.0", "PID-3.4.1.1", "PID-1000", ""]
)
def test_bad_references_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        FieldRef.parse(text)


@pytest.mark.parametrize(
    ("ref", "values"),
    [
        ("MSH-3", ("LAB",)),
        ("MSH-4", ("NORTH",)),  # the first component when none is named
        ("MSH-4.2", ("1.2.3",)),
        ("MSH-9.2", ("R01",)),
        ("MSH-10", ("C1",)),
        ("PID-3", ("123", "T99")),  # every repetition
        ("PID-3.4", ("NORTH", "TEMP")),  # the authority's namespace ID (subcomponent 1)
        ("PID-3.4.2", ("1.2.3",)),
        ("PID-3.5", ("MR", "PI")),
        ("PV1-3", ("4W",)),
        ("PV1-3.4", ("NORTH",)),
        ("OBX-3", ("GLU", "K")),  # every segment of the ID
        ("PV1-9", ()),  # empty: no value
        ("PV1-99", ()),  # past the last field
        ("ZZZ-1", ()),  # no such segment
        ("PID-3.9", ()),
    ],
)
def test_values_of_a_reference(ref: str, values: tuple[str, ...]) -> None:
    assert fields().values(FieldRef.parse(ref)) == values


def test_values_are_unescaped_stripped_and_utf8() -> None:
    message = "MSH|^~\\&|A\\T\\B|  Nörd  |X|Y|2026||ADT^A01|1|P|2.5\rPV1|1|I|4\\S\\W\r"
    found = MessageFields(message.encode("utf-8"))
    assert found.values(FieldRef.parse("MSH-3")) == ("A&B",)
    assert found.values(FieldRef.parse("MSH-4")) == ("Nörd",)
    assert found.values(FieldRef.parse("PV1-3")) == ("4^W",)  # an escaped ^ is no component


def test_a_message_with_other_delimiters_is_read_with_its_own() -> None:
    message = b"MSH#*~\\&#LAB#SOUTH*9#X#Y#2026##ADT*A01#1#P#2.5\nPV1#1#I#5E*1\n"
    found = MessageFields(message)
    assert found.values(FieldRef.parse("MSH-4")) == ("SOUTH",)
    assert found.values(FieldRef.parse("MSH-4.2")) == ("9",)
    assert found.values(FieldRef.parse("PV1-3")) == ("5E",)


def test_values_of_one_reference_are_bounded() -> None:
    many = b"".join(b"OBX|%d|NM|C%d\r" % (i, i) for i in range(MAX_VALUES_PER_REFERENCE + 50))
    found = MessageFields(b"MSH|^~\\&|A|B|C|D|2026||ORU^R01|1|P|2.5\r" + many)
    values = found.values(FieldRef.parse("OBX-3"))
    assert len(values) == MAX_VALUES_PER_REFERENCE
    assert values[:2] == ("C0", "C1")


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00\xff",
        b"MSH",
        b"MSH|",
        b"PID|1",
        "MSH|^~\\&|é".encode("latin-1"),
        b"MSH|^~\\&|\\X",
    ],
)
def test_garbage_never_raises(garbage: bytes) -> None:
    found = MessageFields(garbage)
    for ref in ("MSH-3", "PID-3.4", "OBX-5"):
        assert isinstance(found.values(FieldRef.parse(ref)), tuple)


def cond(field: str, operator: str, *values: str) -> FieldCondition:
    node: dict[str, Any] = {"field": field, "operator": operator}
    if values:
        node["values"] = list(values)
    return parse(node)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (cond("MSH-4", "In", "NORTH"), True),
        (cond("MSH-4", "In", "SOUTH", "NORTH"), True),
        (cond("MSH-4", "In", "north"), False),  # case-sensitive
        (cond("MSH-4", "In", "NORT"), False),  # whole values
        (cond("MSH-4", "NotIn", "SOUTH"), True),
        (cond("MSH-4", "NotIn", "NORTH"), False),
        (cond("PID-3.4", "In", "TEMP"), True),  # any repetition
        (cond("PID-3.4", "NotIn", "TEMP"), False),  # ... and none may
        (cond("PV1-3", "Matches", "4W*"), True),
        (cond("PV1-3", "Matches", "4?"), True),
        (cond("PV1-3", "Matches", "4"), False),
        (cond("PV1-3", "Matches", "5*", "4*"), True),
        (cond("PV1-3", "NotMatches", "5*"), True),
        (cond("PV1-3", "NotMatches", "4*"), False),
        (cond("PV1-3", "Matches", "4[W]"), False),  # brackets are literal
        (cond("OBX-3", "In", "K"), True),  # any segment
        (cond("PV1-3", "Exists"), True),
        (cond("PV1-9", "Exists"), False),
        (cond("PV1-9", "DoesNotExist"), True),
        (cond("ZZZ-1", "NotIn", "X"), True),  # absent: nothing equals
        (cond("ZZZ-1", "In", "X"), False),
    ],
)
def test_operators(condition: FieldCondition, expected: bool) -> None:
    assert condition.holds(fields()) is expected


def test_every_condition_must_hold() -> None:
    both = conditions_of(
        [
            {"field": "MSH-4", "operator": "In", "values": ["NORTH"]},
            {"field": "PV1-3", "operator": "Matches", "values": ["4W*"]},
        ]
    )
    assert holds(both, fields())
    assert not holds((*both, cond("PID-3.4", "NotIn", "TEMP")), fields())
    assert holds((), fields())


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"field": "MSH-2", "operator": "Exists"}, "field: MSH-1 and MSH-2 are the delimiters"),
        ({"field": "PID3", "operator": "Exists"}, "field: 'PID3'"),
        ({"field": 3, "operator": "Exists"}, "field: 3"),
        ({"field": "PID-3", "operator": "Like", "values": ["x"]}, "operator: must be one of In"),
        ({"field": "PID-3", "operator": "In"}, "values: In needs at least one value"),
        ({"field": "PID-3", "operator": "Exists", "values": ["x"]}, "values: Exists takes no"),
    ],
)
def test_parse_names_what_is_wrong(node: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        parse(node)


def test_spec_form_round_trips() -> None:
    nodes = [
        {"field": "MSH-4", "operator": "In", "values": ["NORTH"]},
        {"field": "PV1-3", "operator": "DoesNotExist"},
    ]
    assert [c.to_spec() for c in conditions_of(nodes)] == nodes


# --- routing ---------------------------------------------------------------------------------


def test_routing_by_fields_picks_the_lis_of_the_sending_facility() -> None:
    north = conditions_of([{"field": "MSH-4", "operator": "In", "values": ["NORTH"]}])
    south = conditions_of([{"field": "MSH-4", "operator": "In", "values": ["SOUTH"]}])
    table = RouteTable(
        [
            Route("lab/lis-north", "lab", ("ORU^R01",), field_conditions=north),
            Route("lab/lis-south", "lab", ("ORU^R01",), field_conditions=south),
            Route("lab/archive", "lab"),
        ]
    )
    decision = table.route("lab", "ORU", "R01", ORU)
    assert decision.destinations == ("lab/archive", "lab/lis-north")
    south_oru = ORU.replace(b"|NORTH^1.2.3^ISO|", b"|SOUTH|")
    assert table.route("lab", "ORU", "R01", south_oru).destinations == (
        "lab/archive",
        "lab/lis-south",
    )


def test_a_message_no_condition_takes_is_filtered() -> None:
    ward = conditions_of([{"field": "PV1-3", "operator": "In", "values": ["5E"]}])
    table = RouteTable([Route("ward/bed-board-5e", "adt", ("ADT^*",), field_conditions=ward)])
    adt = b"MSH|^~\\&|PAS|NORTH|BB|NORTH|2026||ADT^A02|9|P|2.5\rPV1|1|I|4W^1\r"
    decision = table.route("adt", "ADT", "A02", adt)
    assert decision.destinations == () and decision.reason == "filtered"
    moved = adt.replace(b"4W^1", b"5E^2")
    assert table.route("adt", "ADT", "A02", moved).destinations == ("ward/bed-board-5e",)
    # the type filter is read first: a message of another type is not split into fields
    assert table.route("adt", "ORU", "R01", moved).reason == "filtered"


def test_a_registry_row_whose_field_filter_cannot_be_read_takes_nothing() -> None:
    row = {
        "destination": "lab/broken",
        "channel": "lab",
        "message_types": [],
        "suspended": False,
        "filter_fields": [{"field": "nonsense", "operator": "In", "values": ["X"]}],
    }
    route = _row_route(row)
    assert not RouteTable([route]).route("lab", "ORU", "R01", ORU).destinations
    row["filter_fields"] = None
    assert RouteTable([_row_route(row)]).route("lab", "ORU", "R01", ORU).destinations


# --- the manifest: schema, CEL twins, worker configuration ------------------------------------

MANIFEST = destination(
    "lis-north",
    "lab",
    channel="lab",
    sender=mllp("lis-north"),
    max_attempts=0,
    filter={
        "messageTypes": ["ORU^R01"],
        "fields": [{"field": "MSH-4", "operator": "In", "values": ["NORTH"]}],
    },
)


def with_fields(items: list[Any]) -> dict[str, Any]:
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["filter"]["fields"] = items
    return doc


def test_a_manifest_with_field_conditions_loads_and_round_trips() -> None:
    cfg = load_manifest(MANIFEST)
    assert cfg.field_conditions == (cond("MSH-4", "In", "NORTH"),)
    rendered = to_dict(cfg)
    assert rendered["filterFields"] == [{"field": "MSH-4", "operator": "In", "values": ["NORTH"]}]
    assert from_dict(rendered) == cfg
    assert load_worker_config(rendered) == cfg
    assert "filterFields" not in to_dict(load_manifest(with_fields([])))


@pytest.mark.parametrize(
    ("items", "errors"),
    [
        (
            [{"field": "PID3", "operator": "In", "values": ["X"]}],
            ["spec.filter.fields[0].field: 'PID3' does not match"],
        ),
        (
            [{"field": "PID-3", "operator": "Equals", "values": ["X"]}],
            ["spec.filter.fields[0].operator: must be one of In, NotIn, Matches, NotMatches"],
        ),
        (
            [{"field": "PID-3", "operator": "In", "value": "X"}],
            [  # the typo, and (in the same pass) what the well-typed rest then lacks
                "spec.filter.fields[0].value: unknown field",
                "spec.filter.fields[0].values: In, NotIn, Matches and NotMatches need at least"
                " one value",
            ],
        ),
        (
            [{"field": "PID-3", "operator": "In", "values": [""]}],
            ["spec.filter.fields[0].values[0]: must not be empty"],
        ),
        (
            [
                {"field": "MSH-2", "operator": "Exists"},
                {"field": "PV1-3", "operator": "In"},
                {"field": "PV1-3", "operator": "In", "values": []},
                {"field": "PV1-3", "operator": "DoesNotExist", "values": ["4W"]},
            ],
            [
                "spec.filter.fields[0].field: MSH-1 and MSH-2 are the delimiters;"
                " filters read MSH-3 and later",
                "spec.filter.fields[1].values: In, NotIn, Matches and NotMatches need at least"
                " one value",
                "spec.filter.fields[2].values: In, NotIn, Matches and NotMatches need at least"
                " one value",
                "spec.filter.fields[3].values: Exists and DoesNotExist take no values",
            ],
        ),
        (
            [{"field": "MSH-4", "operator": "Exists"}] * 17,
            ["spec.filter.fields: must have at most 16 items"],
        ),
    ],
)
def test_bad_field_conditions_are_reported_by_field_path(
    items: list[Any], errors: list[str]
) -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest(with_fields(items))
    assert len(caught.value.errors) == len(errors)
    for line, expected in zip(caught.value.errors, errors, strict=True):
        assert line.startswith(expected), line
