"""parse_header(): MSH fields, delimiters, tolerance and table 0357 errors; samples; oracle."""

from __future__ import annotations

from pathlib import Path

import hl7
import pytest

from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.terminators import normalise_terminators

ADT = (
    b"MSH|^~\\&|SENDAPP|SENDFAC|RECVAPP|RECVFAC|20240102030405||ADT^A01^ADT_A01|CTRL-1|P|2.5.1"
    b"|||AL|NE\rEVN|A01|20240102030405\rPID|1||12345^^^HOSP^MR||DOE^JANE\r"
)

#: Samples that are deliberately malformed, with the table 0357 code they must raise.
MALFORMED_SAMPLES = {
    "Test__Message__msh_present_but_missing_all_fields.hl7": 101,
    "Test__Message__msh_present_but_missing_msh-10.hl7": 101,
    "Test__Message__msh_present_but_missing_msh-2.hl7": 101,
    "Test__Results__005_AL_ORU_R01_NBS_Simplified_0_initial_message.hl7": 100,
}


def test_parses_the_fields_used() -> None:
    h = parse_header(ADT)
    assert h.field_separator == "|"
    assert h.encoding_characters == "^~\\&"
    assert h.sending_application == "SENDAPP"
    assert h.sending_facility == "SENDFAC"
    assert h.receiving_application == "RECVAPP"
    assert h.receiving_facility == "RECVFAC"
    assert h.date_time == "20240102030405"
    assert h.message_type.raw == "ADT^A01^ADT_A01"
    assert h.message_type.code == "ADT"
    assert h.message_type.trigger == "A01"
    assert h.message_type.structure == "ADT_A01"
    assert h.message_type.type_key == "ADT^A01"
    assert h.control_id == "CTRL-1"
    assert h.processing_id == "P"
    assert h.version == "2.5.1"
    assert h.version_id == "2.5.1"
    assert h.accept_ack_type == "AL"
    assert h.application_ack_type == "NE"


def test_non_default_delimiters() -> None:
    h = parse_header(b"MSH#$*@%#APP#FAC#R#RF#2024##ORU$R01#ID9#T#2.3\r")
    assert h.field_separator == "#"
    assert h.encoding_characters == "$*@%"
    assert h.delimiters.component == "$"
    assert h.delimiters.repetition == "*"
    assert h.delimiters.escape == "@"
    assert h.delimiters.subcomponent == "%"
    assert h.message_type.code == "ORU"
    assert h.message_type.type_key == "ORU^R01"
    assert h.control_id == "ID9"
    assert h.sending_application == "APP"


def test_five_encoding_characters_v27() -> None:
    h = parse_header(b"MSH|^~\\&#|A|B|C|D|2024||ADT^A04^ADT_A01|77|P|2.7\r")
    assert h.encoding_characters == "^~\\&#"
    assert h.delimiters.truncation == "#"
    assert h.message_type.type_key == "ADT^A04"
    assert h.control_id == "77"


@pytest.mark.parametrize("separator", [b"\r", b"\n", b"\r\n"])
def test_segment_separators(separator: bytes) -> None:
    payload = ADT.replace(b"\r", separator)
    h = parse_header(payload)
    assert h.control_id == "CTRL-1"
    assert h.application_ack_type == "NE"


def test_single_segment_without_terminator() -> None:
    assert parse_header(b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|X").control_id == "X"


def test_bom_and_leading_whitespace_are_skipped() -> None:
    assert parse_header(b"\xef\xbb\xbf" + ADT).control_id == "CTRL-1"
    assert parse_header(b"\r\n  \x00" + ADT).control_id == "CTRL-1"


def test_trigger_may_be_absent() -> None:
    h = parse_header(b"MSH|^~\\&|A|B|C|D|2024||ACK|99|P|2.5\rMSA|AA|1\r")
    assert h.message_type.code == "ACK"
    assert h.message_type.trigger == ""
    assert h.message_type.type_key == "ACK"


def test_only_the_first_repetition_of_msh9_counts() -> None:
    h = parse_header(b"MSH|^~\\&|A|B|C|D|2024||ADT^A08~ADT^A01|1|P|2.5\r")
    assert h.message_type.type_key == "ADT^A08"


def test_missing_optional_fields_are_empty() -> None:
    h = parse_header(b"MSH|^~\\&|||||||ORM^O01|5\r")
    assert h.sending_application == ""
    assert h.processing_id == ""
    assert h.version == ""
    assert h.accept_ack_type == ""


def test_utf8_field_round_trips_through_latin1() -> None:
    h = parse_header("MSH|^~\\&|APP|Hôpital|R|F|2024||ADT^A01|1|P|2.5\r".encode())
    assert h.sending_facility.encode("latin-1") == "Hôpital".encode()


def test_component_with_version_id() -> None:
    h = parse_header(b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5^CAN\r")
    assert h.version_id == "2.5"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"", 100),
        (b"\r\n\r\n", 100),
        (b"PID|1||42\rMSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\r", 100),
        (b"FHS|^~\\&\rBHS|^~\\&\rMSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\r", 100),
        (b"MSH", 101),
        (b"MSH\rPID|1\r", 101),
        (b"MSH||A|B\r", 101),
        (b"MSH|^~\\|A|B|C|D|2024||ADT^A01|1\r", 102),
        (b"MSH|^~\\&#!|A|B|C|D|2024||ADT^A01|1\r", 102),
        (b"MSH|^^\\&|A|B|C|D|2024||ADT^A01|1\r", 102),
        (b"MSHA^~\\&A|B\r", 102),
        (b"MSH ^~\\& x\r", 102),
        (b"MSH|^~ &|A|B|C|D|2024||ADT^A01|1\r", 102),
        (b"MSH|^~\\&|A|B|C|D|2024||  |1|P|2.5\r", 101),
        (b"MSH|^~\\&|A|B|C|D|2024||^A01|1|P|2.5\r", 101),
        (b"MSH|^~\\&|A|B|C|D|2024||ADT^A01||P|2.5\r", 101),
        (b"MSH|^~\\&|A|B|C|D|2024||ADT^A01\r", 101),
    ],
)
def test_errors_carry_table_0357_codes(payload: bytes, code: int) -> None:
    with pytest.raises(HeaderError) as info:
        parse_header(payload)
    assert info.value.code == code
    assert info.value.text


def test_every_sample_parses(samples: list[Path]) -> None:
    parsed = 0
    for path in samples:
        payload = path.read_bytes()
        if path.name in MALFORMED_SAMPLES:
            with pytest.raises(HeaderError) as info:
                parse_header(payload)
            assert info.value.code == MALFORMED_SAMPLES[path.name], path.name
            continue
        h = parse_header(payload)
        assert h.control_id.strip(), path.name
        assert h.message_type.code, path.name
        assert h.message_type.type_key.startswith(h.message_type.code), path.name
        parsed += 1
    assert parsed == len(samples) - len(MALFORMED_SAMPLES)


def test_python_hl7_agrees_on_samples(samples: list[Path]) -> None:
    """python-hl7 (an independent parser) reads the same MSH-9, MSH-10 and MSH-1/2."""
    compared = 0
    for path in samples:
        if path.name in MALFORMED_SAMPLES:
            continue
        payload = path.read_bytes()
        ours = parse_header(payload)
        # python-hl7 splits on CR only and cannot take empty segments (one sample has some).
        lines = normalise_terminators(payload).decode("utf-8").split("\r")
        theirs = hl7.parse("\r".join(line for line in lines if line))
        msh = theirs.segment("MSH")
        assert str(msh[10]) == ours.control_id, path.name
        assert str(msh[9]) == ours.message_type.raw, path.name
        assert str(theirs["MSH.F9.R1.C1"]) == ours.message_type.code, path.name
        try:
            trigger = str(theirs["MSH.F9.R1.C2"])
        except IndexError:  # python-hl7: MSH-9 has a single component ("ACK")
            trigger = ""
        assert trigger == ours.message_type.trigger, path.name
        assert str(msh[1]) == ours.field_separator
        assert str(msh[2]) == ours.encoding_characters
        compared += 1
    assert compared > 100


def test_delimiters_are_checked_once_per_pair_and_a_refusal_every_time() -> None:
    """MSH-1/MSH-2 pairs are remembered once checked (the same object comes back), and an
    unusable pair is refused on every message, not remembered as usable (issue 33)."""
    good = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|X1|P|2.5\r"
    assert parse_header(good).delimiters is parse_header(good).delimiters
    for _ in range(2):
        with pytest.raises(HeaderError) as caught:
            parse_header(b"MSH|^^\\&|A|B|C|D|20260101||ADT^A01|X1|P|2.5\r")
        assert caught.value.code == 102
