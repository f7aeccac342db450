"""Routing without a database: filter patterns, the route table, CLI address parsing."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from inturn.worker.cli.ingest import ingest_command
from inturn.worker.ingest.config import IngestConfig, parse_listen
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.routing import (
    Route,
    RouteTable,
    check_channel,
    hold_destination,
    type_matches,
)
from inturn.worker.text.addresses import parse_address


@pytest.mark.parametrize(
    ("patterns", "code", "trigger", "expected"),
    [
        ((), "ADT", "A01", True),  # no filter: everything
        (("ADT^A01",), "ADT", "A01", True),
        (("ADT^A01",), "ADT", "A011", False),  # the whole key must match
        (("ADT^A0*",), "ADT", "A08", True),
        (("ADT^A0*",), "ADT", "A0", True),  # '*' may match nothing
        (("ADT^A0*",), "ADT", "A18", False),
        (("ADT^A0?",), "ADT", "A04", True),
        (("ADT^A0?",), "ADT", "A0", False),  # '?' is exactly one character
        (("adt^a01",), "ADT", "A01", False),  # case-sensitive
        (("*",), "ORU", "R01", True),
        (("ORU^*", "ADT^*"), "ADT", "A40", True),
        (("ORU^R01",), "ORU", "", False),
        (("ACK",), "ACK", "", True),  # no trigger: the key is the code alone...
        (("ACK^*",), "ACK", "", True),  # ...or CODE^ for patterns that expect a trigger
        (("ACK^*",), "ACK", "A01", True),
        (("ACK",), "ACK", "A01", False),
        (("A[DT]T^A01",), "ADT", "A01", False),  # brackets are literal, not a class
        (("A[DT]T^A01",), "A[DT]T", "A01", True),
        (("ADT.A01",), "ADTXA01", "", False),  # regex characters are literal
        (("ADT^A01*",), "ADT", "A01\n", True),
    ],
)
def test_type_matches(patterns: tuple[str, ...], code: str, trigger: str, expected: bool) -> None:
    assert type_matches(patterns, code, trigger) is expected


def test_route_table_decisions() -> None:
    table = RouteTable(
        [
            Route("b/lab", "lab", ("ORU^*",)),
            Route("a/adt", "adt", ("ADT^A0*",)),
            Route("a/all", "adt"),
            Route("a/paused", "adt", ("ADT^A01",), suspended=True),
        ]
    )
    assert len(table) == 4
    assert table.channels() == ["adt", "lab"]
    decision = table.route("adt", "ADT", "A01")
    assert (decision.destinations, decision.reason) == (("a/adt", "a/all", "a/paused"), "routed")
    assert table.route("adt", "ORU", "R01").destinations == ("a/all",)
    assert table.route("lab", "ADT", "A01").reason == "filtered"
    assert table.route("lab", "ORU", "R01").destinations == ("b/lab",)
    assert table.route("rad", "ORU", "R01").reason == "no_destinations"
    assert [r.destination for r in table.routes("adt")] == ["a/adt", "a/all", "a/paused"]


def test_hold_destination_cannot_be_a_real_namespace() -> None:
    assert hold_destination("adt") == "_unrouted/adt"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("adt=2575", ("adt", "0.0.0.0", 2575)),
        ("lab=127.0.0.1:2576", ("lab", "127.0.0.1", 2576)),
        ("lab=[::1]:2576", ("lab", "::1", 2576)),
        ("a.b-c_d=:0", ("a.b-c_d", "0.0.0.0", 0)),
    ],
)
def test_parse_listen(value: str, expected: tuple[str, str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["2575", "=2575", "adt=", "adt=host:x", "adt=70000", "a/b=1"])
def test_parse_listen_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(value)


def test_parse_address() -> None:
    assert parse_address("8080") == ("0.0.0.0", 8080)
    assert parse_address("localhost:8080") == ("localhost", 8080)


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="one MLLP listener"):
        IngestConfig(listeners=[ListenerConfig("adt", port=1), ListenerConfig("adt", port=2)])
    with pytest.raises(ValueError):
        IngestConfig(max_frame_bytes=0)
    with pytest.raises(ValueError):
        check_channel("has space")


def test_a_channel_cannot_both_hold_and_drop_unrouted_messages() -> None:
    args = ["--listen", "adt=127.0.0.1:0", "--hold-unrouted", "adt", "--accept-unrouted", "adt"]
    done = CliRunner().invoke(ingest_command, args, env={"INTURN_DSN": "postgresql://nowhere/x"})
    assert done.exit_code == 2
    assert "--hold-unrouted and --accept-unrouted both name adt" in done.output
    bad = ["--listen", "adt=127.0.0.1:0", "--accept-unrouted", "a/b"]
    done = CliRunner().invoke(ingest_command, bad, env={"INTURN_DSN": "postgresql://nowhere/x"})
    assert done.exit_code == 2 and "invalid channel name 'a/b'" in done.output


def test_a_type_is_decided_once_per_table_and_a_field_filter_every_time() -> None:
    """A channel of 200 destinations filtered by type only is decided once per message type
    (the table is a snapshot): the same decision again; a channel whose destinations read
    fields is decided per message."""
    from inturn.worker.hl7.filter import conditions_of

    many = [Route(f"ward/d{n:03d}", "adt", ("ADT^A0*",) if n % 5 else ()) for n in range(200)]
    fields = conditions_of([{"field": "PID-3.1", "operator": "In", "values": ["X"]}])
    table = RouteTable([*many, Route("lab/x", "lab", field_conditions=fields)])
    first = table.route("adt", "ADT", "A01")
    assert table.route("adt", "ADT", "A01") is first and len(first.destinations) == 200
    other = table.route("adt", "ORU", "R01")
    assert other is not first and len(other.destinations) == 40
    x = b"MSH|^~\\&|A|B|C|D|2024||ORU^R01|1|P|2.5\rPID|1||X\r"
    y = b"MSH|^~\\&|A|B|C|D|2024||ORU^R01|2|P|2.5\rPID|1||Y\r"
    assert table.route("lab", "ORU", "R01", x).destinations == ("lab/x",)
    assert table.route("lab", "ORU", "R01", y).destinations == ()
