"""The worst message shapes for ingest's per-message work (many repetitions, many segments, deep
components, long fields, escapes): the identifier scan reads each of them once, caps what it
indexes, and gives the same values as before it was made linear."""

from __future__ import annotations

import hashlib

import pytest

from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.pid import (
    CAPPED_KEY,
    MAX_ID_CHARS,
    PatientId,
    has_patient_id,
    index_keys,
    lookup_key,
    patient_identifiers,
)
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.ingest.prepare import prepare
from inturn.worker.testing import SHAPE_MSH, worst_shapes

#: The size of the message that froze every channel for 16-25 s (12,000 PID-3 repetitions).
FROZE = 176 * 1024


def repetitions(count: int, template: str = "ID{i}^^^AUTH{a}") -> bytes:
    reps = "~".join(template.format(i=i, a=i % 7) for i in range(count))
    return SHAPE_MSH + b"PID|1||" + reps.encode() + b"\r"


def test_twelve_thousand_distinct_repetitions_all_found_in_order() -> None:
    payload = repetitions(12_000)
    found = patient_identifiers(payload)
    assert len(found) == 12_000
    assert found[0] == PatientId("PID-3", "ID0", ("AUTH0",))
    assert found[-1] == PatientId("PID-3", "ID11999", ("AUTH1",))
    assert [p.id for p in found[:3]] == ["ID0", "ID1", "ID2"]


def test_identifiers_indexed_per_message_are_capped() -> None:
    payload = repetitions(12_000)
    assert patient_identifiers(payload, limit=100) == patient_identifiers(payload)[:100]
    keys = index_keys(payload, limit=100)
    # each identifier: its ID alone and its ID with its one authority, and the capped mark
    # (lanes make such a message a barrier)
    assert len(keys) == 201
    assert CAPPED_KEY in keys
    assert CAPPED_KEY not in index_keys(repetitions(100), limit=100)
    assert lookup_key("ID99") in keys and lookup_key("ID99", "AUTH1") in keys
    assert lookup_key("ID100") not in keys
    # the uncapped search still sees every identifier (erase --patient-id reads payloads)
    assert has_patient_id(payload, "ID11999", "AUTH1")
    with pytest.raises(ValueError):
        index_keys(payload, limit=0)


def test_one_identifier_repeated_twelve_thousand_times_is_one() -> None:
    payload = repetitions(12_000, "12345^^^HOSP^MR")
    assert patient_identifiers(payload) == [PatientId("PID-3", "12345", ("HOSP",))]
    assert sorted(index_keys(payload)) == sorted([lookup_key("12345"), lookup_key("12345", "HOSP")])


def test_same_id_in_differently_written_repetitions_is_reported_once() -> None:
    payload = repetitions(500, "77^{i}^^HOSP")  # component 2 differs, the identifier does not
    assert patient_identifiers(payload) == [PatientId("PID-3", "77", ("HOSP",))]


def test_an_identifier_longer_than_the_bound_is_not_one() -> None:
    at_bound = "7" * MAX_ID_CHARS
    over = "8" * (MAX_ID_CHARS + 1)
    payload = SHAPE_MSH + f"PID|1||{at_bound}^^^H~{over}^^^H^^{'A' * 9000}\r".encode()
    assert patient_identifiers(payload) == [PatientId("PID-3", at_bound, ("H",))]
    long_authority = "Z" * (MAX_ID_CHARS + 1)
    payload = SHAPE_MSH + f"PID|1||5^^^{long_authority}&OK\r".encode()
    assert patient_identifiers(payload) == [PatientId("PID-3", "5", ("OK",))]


def test_escapes_are_read_in_one_pass() -> None:
    ident = "\\F\\" * 100 + "\\X41\\" * 50 + "tail"
    payload = SHAPE_MSH + f"PID|1||{ident}^^^H\\T\\X\r".encode()
    [found] = patient_identifiers(payload)
    assert found.id == "|" * 100 + "A" * 50 + "tail"
    assert found.authorities == ("H&X",)
    lone = SHAPE_MSH + b"PID|1||\\" + b"a" * 500 + b"\r"
    assert [p.id for p in patient_identifiers(lone)] == ["\\" + "a" * 500]


@pytest.mark.parametrize("name", sorted(worst_shapes(1024)))
def test_every_worst_shape_prepares_as_stored(name: str) -> None:
    payload = worst_shapes(FROZE)[name]
    assert FROZE - 1024 < len(payload) <= FROZE
    header = parse_header(payload)
    assert header.control_id == "SHAPE"
    message = prepare(header, payload, 100)
    assert message.payload == normalise_terminators(payload)
    assert message.digest == hashlib.sha256(message.payload).digest()
    keys = message.patient_keys.split(",") if message.patient_keys else []
    assert keys == index_keys(message.payload, 100)
    assert len(keys) <= 301  # 100 identifiers with two authorities each, and the capped mark


def test_worst_shapes_name_what_they_hold() -> None:
    shapes = worst_shapes(FROZE)
    assert len(patient_identifiers(shapes["distinct_repetitions"])) > 11_000
    assert len(patient_identifiers(shapes["segments"])) > 5_000
    assert len(patient_identifiers(shapes["same_repetitions"])) == 1
    assert patient_identifiers(shapes["long_field"]) == []  # one ID far over MAX_ID_CHARS
    assert b"\n" in shapes["lf_terminators"] and b"\r" not in shapes["lf_terminators"]
