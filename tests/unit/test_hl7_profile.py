"""Receiver profiles (worker/hl7/profile.py): each rule kind on hand-made messages, on the shared
samples and on hostile input; what a profile may not do; and properties: no profile sends the
very bytes, and every byte a profile does not name is left as it was."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import hl7
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.pid import patient_identifiers
from inturn.worker.hl7.profile import (
    FieldPath,
    ProfileError,
    ProfileRefusal,
    compile_profile,
    problems,
    renumbered,
    shaped,
    transform,
    transliterate_char,
)
from inturn.worker.hl7.terminators import normalise_terminators

MSG = (
    b"MSH|^~\\&|LAB|NORTH^1.2.3^ISO|LIS|X|20260101120000||ORU^R01^ORU_R01|C1|P|2.5.1\r"
    b"PID|1||123^^^H^MR||Doe^J\xc3\xa9r\xc3\xb4me||19800101|F|||||555-1234~555-9876||||||SSN1\r"
    b"OBR|1|ORD1||GLU^Glucose^L\r"
    b"OBX|1|CE|GLU^Glucose^L||Some long value here||||||F\r"
    b"OBX|2|CE|HBA^HbA1c^L~GLU^x^L||5.4||||||F\r"
    b"NTE|1||a note\r"
    b"ZXY|1|custom\r"
)


def run(spec: dict[str, Any], payload: bytes = MSG, sequence: int | None = None) -> bytes:
    profile = compile_profile(spec)
    assert profile is not None
    return transform(payload, profile, sequence)


def segments(payload: bytes) -> list[bytes]:
    return [s for s in payload.split(b"\r") if s]


def segment(payload: bytes, sid: bytes, n: int = 0) -> list[bytes]:
    return [s for s in segments(payload) if s.startswith(sid + b"|")][n].split(b"|")


# --- each rule kind ---------------------------------------------------------------------------


def test_set_writes_literals_escaping_delimiters() -> None:
    out = run({"set": {"MSH-5": "LIS_NORTH", "MSH-6": "A|B^C~D\\E&F", "MSH-11": "T"}})
    msh = segment(out, b"MSH")
    assert msh[4] == b"LIS_NORTH"
    assert msh[5] == b"A\\F\\B\\S\\C\\R\\D\\E\\E\\T\\F"
    assert msh[10] == b"T"
    assert hl7.parse(out.decode())["MSH"][0][6][0] == "A\\F\\B\\S\\C\\R\\D\\E\\E\\T\\F"


def test_set_a_component_and_a_field_past_the_end() -> None:
    out = run({"set": {"MSH-4.2": "2.16.840.1", "OBR-20": "X", "ZXY-2.3": "z"}})
    assert segment(out, b"MSH")[3] == b"NORTH^2.16.840.1^ISO"
    obr = segment(out, b"OBR")
    assert len(obr) == 21 and obr[20] == b"X" and obr[5:20] == [b""] * 15
    assert segment(out, b"ZXY")[2] == b"custom^^z"


def test_set_on_a_segment_the_message_lacks_adds_nothing() -> None:
    out = run({"set": {"PV1-2": "I"}})
    assert out == MSG


def test_copy_reads_the_stored_message() -> None:
    out = run({"copy": {"MSH-6": "MSH-4", "MSH-5.1": "MSH-4"}, "set": {"MSH-4": "HUB"}})
    msh = segment(out, b"MSH")
    assert msh[3] == b"HUB"
    assert msh[5] == b"NORTH^1.2.3^ISO"  # whole field into a whole field: structure kept
    assert msh[4] == b"NORTH\\S\\1.2.3\\S\\ISO"  # into a component: separators escaped


def test_copy_from_another_segment_and_from_nothing() -> None:
    out = run({"copy": {"NTE-3": "PID-7", "OBX-13": "PV1-3"}})
    assert segment(out, b"NTE")[3] == b"19800101"
    assert segment(out, b"OBX")[13:] == []  # absent source, absent target: nothing written


def test_copy_within_each_segment() -> None:
    out = run({"copy": {"OBX-4": "OBX-3.2"}})
    assert segment(out, b"OBX", 0)[4] == b"Glucose"
    assert segment(out, b"OBX", 1)[4] == b"HbA1c"  # first repetition of the source


def test_remove_segments_by_name_and_glob() -> None:
    out = run({"removeSegments": ["Z*", "NTE", "O?X"]})
    assert [s[:3] for s in segments(out)] == [b"MSH", b"PID", b"OBR"]


def test_clear_keeps_the_separators() -> None:
    out = run({"clear": ["PID-13", "PID-19", "OBX-3.2"]})
    pid = segment(out, b"PID")
    before = segment(MSG, b"PID")
    assert (before[13], before[19]) == (b"555-1234~555-9876", b"SSN1")
    assert pid[13] == b"" and pid[19] == b"" and len(pid) == len(before)
    assert segment(out, b"OBX", 1)[3] == b"HBA^^L~GLU^^L"


def test_truncate_counts_bytes_and_keeps_characters_whole() -> None:
    out = run({"truncate": {"OBX-5": 9, "PID-5.2": 3}})
    assert segment(out, b"OBX")[5] == b"Some long"
    assert segment(out, b"OBX", 1)[5] == b"5.4"
    # J (1 byte) + e-acute (2 bytes) = 3 bytes; the next 2-byte character is not split
    assert segment(out, b"PID")[5] == b"Doe^J\xc3\xa9"


def test_truncate_never_splits_an_escape_sequence() -> None:
    payload = MSG.replace(b"Some long value here", b"ab\\F\\cd")
    out = run({"truncate": {"OBX-5": 4}}, payload)
    assert segment(out, b"OBX")[5] == b"ab"


def test_a_header_truncation_counts_the_target_charsets_bytes() -> None:
    """With only the header named, a truncation still counts bytes as they are sent: four
    characters of two bytes each in UTF-8 are over a 5-byte limit."""
    payload = "MSH|^~\\&|A|ÉÉÉÉ|R|F|20260101||ADT^A01|C1|P|2.5||||||8859/1\rPID|1||1\r"
    charset = {"to": "UTF-8", "unmappable": "refuse", "whenUndeclared": "UTF-8"}
    out = run({"truncate": {"MSH-4": 5}, "charset": charset}, payload.encode("latin-1"))
    assert segment(out, b"MSH")[3] == "ÉÉ".encode()


def test_truncate_in_the_target_charset() -> None:
    spec = {"truncate": {"PID-5.2": 2}, "charset": {"to": "ISO-8859-1", "whenUndeclared": "UTF-8"}}
    assert segment(run(spec), b"PID")[5] == b"Doe^J\xe9"  # two bytes in ISO-8859-1
    spec["charset"] = {"to": "ASCII", "unmappable": "transliterate", "whenUndeclared": "UTF-8"}
    assert segment(run(spec), b"PID")[5] == b"Doe^Je"


def test_maps_keep_clear_hold() -> None:
    table = {"GLU": "2345-7", "HBA": "4548-4"}
    out = run({"maps": [{"field": "OBX-3.1", "table": table, "otherwise": "keep"}]})
    assert segment(out, b"OBX", 0)[3] == b"2345-7^Glucose^L"
    assert segment(out, b"OBX", 1)[3] == b"4548-4^HbA1c^L~2345-7^x^L"
    out = run({"maps": [{"field": "OBX-3.1", "table": {"GLU": "G"}, "otherwise": "clear"}]})
    assert segment(out, b"OBX", 1)[3] == b"^HbA1c^L~G^x^L"
    with pytest.raises(ProfileRefusal) as refused:
        run({"maps": [{"field": "OBX-3.1", "table": {"GLU": "G"}, "otherwise": "hold"}]})
    assert (refused.value.field, refused.value.value) == ("OBX-3.1", "HBA")
    assert "otherwise: hold" in refused.value.reason
    assert "HBA" not in refused.value.describe(reveal=False)


def test_a_map_with_the_empty_key_fills_empty_and_absent_values() -> None:
    # OBX-4 is empty in both OBX; OBR has no 5th field; OBX-3.1 is never empty here
    table = {"": "U", "GLU": "G"}
    out = run({"maps": [{"field": "OBX-4", "table": table}, {"field": "OBR-5", "table": table}]})
    assert [segment(out, b"OBX", n)[4] for n in (0, 1)] == [b"U", b"U"]
    assert segment(out, b"OBR", 0) == [b"OBR", b"1", b"ORD1", b"", b"GLU^Glucose^L", b"U"]
    out = run({"maps": [{"field": "OBR-4.4", "table": {"": "LN"}}]})
    assert segment(out, b"OBR", 0)[4] == b"GLU^Glucose^L^LN"
    # without the key "", empty and absent values are left as they are, whatever "otherwise"
    out = run({"maps": [{"field": "OBX-4", "table": {"GLU": "G"}, "otherwise": "hold"}]})
    assert out == MSG
    out = run({"maps": [{"field": "OBR-5", "table": {"x": "y"}}]})
    assert segment(out, b"OBR", 0) == [b"OBR", b"1", b"ORD1", b"", b"GLU^Glucose^L"]


def test_maps_compare_unescaped_text_and_escape_what_they_write() -> None:
    payload = MSG.replace(b"CE|GLU^Glucose", b"CE|G\\S\\1^Glucose", 1)
    out = run({"maps": [{"field": "OBX-3.1", "table": {"G^1": "A|B"}}]}, payload)
    assert segment(out, b"OBX")[3] == b"A\\F\\B^Glucose^L"


def test_a_map_finds_a_key_its_message_spells_only_with_escapes() -> None:
    """A message none of whose text holds a map's key skips the map, but for a segment with an
    escape sequence: there the key may be spelled otherwise (a hex escape, \\T\\ for &)."""
    table = {"GLU": "2345-7", "A&B": "X"}
    spec = {"maps": [{"field": "OBX-3.1", "table": table}], "truncate": {"OBX-5": 4}}
    payload = (
        MSG.replace(b"CE|GLU^Glucose", b"CE|\\X47\\LU^Glucose", 1)
        .replace(b"HBA^HbA1c^L~GLU^x^L", b"A\\T\\B^HbA1c^L~QQQ^x^L", 1)
        .replace(b"||GLU^Glucose", b"||QQQ^Glucose", 1)  # OBR-4
    )
    assert b"GLU" not in payload and b"A&B" not in payload
    out = run(spec, payload)
    assert segment(out, b"OBX", 0)[3] == b"2345-7^Glucose^L"
    assert segment(out, b"OBX", 1)[3] == b"X^HbA1c^L~QQQ^x^L"
    assert segment(out, b"OBX", 0)[5] == b"Some"  # the truncation beside it still applies
    # no key anywhere, no escape: every OBX as it was but for the truncation
    plain = MSG.replace(b"GLU", b"QQQ")
    out = run(spec, plain)
    assert segment(out, b"OBX", 0)[3] == b"QQQ^Glucose^L"
    assert segment(out, b"OBX", 0)[5] == b"Some"
    assert segment(out, b"OBX", 1) == segment(plain, b"OBX", 1)


def test_sequence_numbers_write_msh_13() -> None:
    out = run({"sequenceNumbers": True}, sequence=42)
    msh = segment(out, b"MSH")
    assert msh[12] == b"42" and len(msh) == 13
    with pytest.raises(ProfileRefusal):
        run({"sequenceNumbers": True})


def test_charset_converts_and_declares_msh_18() -> None:
    spec = {"charset": {"to": "ISO-8859-1", "whenUndeclared": "UTF-8"}}
    out = run(spec)
    assert segment(out, b"MSH")[17] == b"8859/1"
    assert b"Doe^J\xe9r\xf4me" in out
    # a real peer library reads it back by what MSH-18 says
    parsed = hl7.parse(out.decode("iso-8859-1"))
    assert str(parsed["PID"][0][5]) == "Doe^Jérôme"
    back = run({"charset": {"to": "UTF-8"}}, out)
    assert segment(back, b"MSH")[17] == b"UNICODE UTF-8"
    assert b"Doe^J\xc3\xa9r\xc3\xb4me" in back


@pytest.mark.parametrize(
    ("unmappable", "expected"),
    [("replace", b"Doe^J?r?me"), ("transliterate", b"Doe^Jerome")],
)
def test_charset_unmappable(unmappable: str, expected: bytes) -> None:
    spec = {"charset": {"to": "ASCII", "unmappable": unmappable, "whenUndeclared": "UTF-8"}}
    assert segment(run(spec), b"PID")[5] == expected


def test_charset_refuses_naming_field_and_character() -> None:
    spec = {"charset": {"to": "ASCII", "unmappable": "refuse", "whenUndeclared": "UTF-8"}}
    with pytest.raises(ProfileRefusal) as refused:
        run(spec)
    assert (refused.value.field, refused.value.value) == ("PID-5", "é")
    assert "U+00E9" in str(refused.value) and "ASCII" in str(refused.value)


def test_transliteration_table() -> None:
    assert "".join(map(transliterate_char, "Straße Łódź Ærø “ok” €5 Ω")) == (
        'Strasse Lodz AEro "ok" EUR5 ?'
    )


def test_the_issues_example_all_at_once() -> None:
    spec = {
        "set": {"MSH-5": "LIS_NORTH", "MSH-11": "P"},
        "copy": {"MSH-6": "MSH-4"},
        "removeSegments": ["Z*", "NTE"],
        "clear": ["PID-19", "PID-13"],
        "truncate": {"OBX-5": 200},
        "charset": {"to": "UTF-8", "unmappable": "refuse", "whenUndeclared": "UTF-8"},
        "sequenceNumbers": True,
        "maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}, "otherwise": "keep"}],
    }
    out = run(spec, sequence=1)
    assert out == (
        b"MSH|^~\\&|LAB|NORTH^1.2.3^ISO|LIS_NORTH|NORTH^1.2.3^ISO|20260101120000||ORU^R01^ORU_R01"
        b"|C1|P|2.5.1|1|||||UNICODE UTF-8\r"
        b"PID|1||123^^^H^MR||Doe^J\xc3\xa9r\xc3\xb4me||19800101|F|||||||||||\r"
        b"OBR|1|ORD1||GLU^Glucose^L\r"
        b"OBX|1|CE|2345-7^Glucose^L||Some long value here||||||F\r"
        b"OBX|2|CE|HBA^HbA1c^L~2345-7^x^L||5.4||||||F\r"
    )
    assert parse_header(out).control_id == "C1"


# --- what a profile may not do ----------------------------------------------------------------


def test_problems_name_the_field_path() -> None:
    found = problems(
        {
            "set": {"MSH-10": "X", "MSH-18": "ASCII", "MSH-13": "1", "PID-3.1": "x"},
            "copy": {"MSH-6": "MSH-4", "PID-3": "PID-2", "MSH-7": "nonsense"},
            "clear": ["MSH-6", "MSH-2", "bad"],
            "truncate": {"MSH-10.1": 3},
            "maps": [{"field": "PID-3.1", "table": {}}],
            "removeSegments": ["P*", "*", "ZZ"],
            "sequenceNumbers": True,
        }
    )
    assert found == [
        "set.MSH-10: MSH-10 is the control ID the receiver's ACK names; a profile may not"
        " change it",
        "set.MSH-18: MSH-18 is written by charset.to; declare charset instead",
        "set.MSH-13: MSH-13 is written by sequenceNumbers",
        "set.PID-3.1: PID-3 identifies the patient (duplicates, lanes and replies use it);"
        " a profile may not change it",
        "copy.PID-3: PID-3 identifies the patient (duplicates, lanes and replies use it);"
        " a profile may not change it",
        "truncate.MSH-10.1: MSH-10 is the control ID the receiver's ACK names; a profile may"
        " not change it",
        "clear[0]: MSH-6 is written by copy too; name it once",
        "clear[1]: MSH-1 and MSH-2 are the message's delimiters; a profile may not change it",
        "clear[2]: 'bad' is not a field reference such as MSH-5, PID-13 or OBX-3.1",
        "maps[0].field: PID-3 identifies the patient (duplicates, lanes and replies use it);"
        " a profile may not change it",
        "copy.MSH-7: 'nonsense' is not a field reference such as MSH-5, PID-13 or OBX-3.1",
        "removeSegments[0]: 'P*' would remove PID (the header and the patient stay)",
        "removeSegments[1]: '*' would remove MSH and PID (the header and the patient stay)",
    ]
    with pytest.raises(ProfileError) as error:
        compile_profile({"set": {"MSH-10": "X"}})
    assert error.value.problems[0].startswith("set.MSH-10:")


def test_an_empty_profile_compiles_to_none() -> None:
    assert compile_profile(None) is None
    assert compile_profile({}) is None
    assert compile_profile({"sequenceNumbers": False, "set": {}, "maps": []}) is None


def test_field_paths() -> None:
    assert FieldPath.parse("OBX-3.1.2") == FieldPath("OBX-3.1.2", "OBX", 3, 1, 2)
    assert FieldPath.parse("MSH-5").index == 4
    assert FieldPath.parse("PID-5").index == 5
    for bad in ("MSH", "msh-5", "MSH-0", "MSH-5.0", "MSH-1000", "MSH-5.1.1.1"):
        with pytest.raises(ValueError):
            FieldPath.parse(bad)


# --- hostile input ----------------------------------------------------------------------------


@pytest.mark.parametrize("unmappable", ["refuse", "replace", "transliterate"])
@pytest.mark.parametrize("to", ["UTF-8", "ISO-8859-1", "ASCII"])
def test_bytes_that_do_not_decode_as_declared_are_refused_in_every_mode(
    unmappable: str, to: str
) -> None:
    """Latin-1 text declared UTF-8 is no character of any target: never a silent ``?``."""
    latin = MSG.replace(b"2.5.1\r", b"2.5.1||||||UNICODE UTF-8\r", 1).replace(
        b"J\xc3\xa9r\xc3\xb4me", b"J\xe9r\xf4me"
    )
    with pytest.raises(ProfileRefusal) as refused:
        run({"charset": {"to": to, "unmappable": unmappable}}, latin)
    assert (refused.value.field, refused.value.value) == ("PID-5", "0xE9")
    assert refused.value.reason == (
        "does not decode as UNICODE UTF-8: the message is not in the character set it declares"
        " (refused whatever unmappable says)"
    )


@pytest.mark.parametrize("unmappable", ["refuse", "replace", "transliterate"])
def test_undeclared_bytes_that_do_not_decode_name_when_undeclared(unmappable: str) -> None:
    with pytest.raises(ProfileRefusal) as refused:  # MSG declares nothing and holds UTF-8
        run({"charset": {"to": "ISO-8859-1", "unmappable": unmappable}})
    assert (refused.value.field, refused.value.value) == ("PID-5", "0xC3")
    assert "ASCII (MSH-18 is empty)" in refused.value.reason
    assert "whenUndeclared" in refused.value.reason
    # named, it decodes, and unmappable decides the characters the target lacks
    spec = {"charset": {"to": "ASCII", "unmappable": unmappable, "whenUndeclared": "UTF-8"}}
    expected = {"replace": b"Doe^J?r?me", "transliterate": b"Doe^Jerome"}.get(unmappable)
    if expected is not None:
        assert segment(run(spec), b"PID")[5] == expected


def test_wrong_msh_18_that_decodes_is_taken_as_declared() -> None:
    # declared ISO-8859-1 but holding UTF-8: read as it says (each byte a character)
    utf = MSG.replace(b"2.5.1\r", b"2.5.1||||||8859/1\r", 1)
    out = run({"charset": {"to": "UTF-8"}}, utf)
    assert segment(out, b"PID")[5] == "Doe^JÃ©rÃ´me".encode()


def test_an_msh_18_nobody_can_read() -> None:
    odd = MSG.replace(b"2.5.1\r", b"2.5.1||||||KLINGON\r", 1)
    with pytest.raises(ProfileRefusal) as refused:
        run({"charset": {"to": "UTF-8"}}, odd)
    assert refused.value.field == "MSH-18"
    # without a charset rule the bytes are not decoded: other rules still apply
    assert segment(run({"set": {"MSH-5": "R"}}, odd), b"PID") == segment(odd, b"PID")


def test_mixed_encodings_without_a_charset_rule_keep_every_byte() -> None:
    mixed = MSG + b"NTE|2||caf\xe9 \xff\xfe\r"
    out = run({"set": {"MSH-5": "R"}, "truncate": {"NTE-3": 100}}, mixed)
    assert out == mixed.replace(b"|LIS|", b"|R|", 1)


def test_literals_must_fit_the_messages_own_charset() -> None:
    ascii_msg = MSG.replace(b"J\xc3\xa9r\xc3\xb4me", b"Jerome")
    with pytest.raises(ProfileRefusal) as refused:
        run({"set": {"MSH-5": "Hôpital"}}, ascii_msg)
    assert refused.value.field == "MSH-5"
    utf = MSG.replace(b"2.5.1\r", b"2.5.1||||||UNICODE UTF-8\r", 1)
    assert segment(run({"set": {"MSH-5": "Hôpital"}}, utf), b"MSH")[4] == "Hôpital".encode()
    latin = MSG.replace(b"2.5.1\r", b"2.5.1||||||8859/1\r", 1)
    assert segment(run({"set": {"MSH-5": "Hôpital"}}, latin), b"MSH")[4] == b"H\xf4pital"


def test_other_delimiters() -> None:
    payload = b"MSH#*!?@#LAB#NORTH#LIS#X#2026##ADT*A01#C9#P#2.5\rPID#1##7*?*?*H##Doe*Jo@hn\rZQQ#1\r"
    out = run(
        {
            "set": {"MSH-5": "A#B*C"},
            "clear": ["PID-5.2.2"],
            "removeSegments": ["Z*"],
        },
        payload,
    )
    assert out == (
        b"MSH#*!?@#LAB#NORTH#A?F?B?S?C#X#2026##ADT*A01#C9#P#2.5\r"  # escaped in its own delimiters
        b"PID#1##7*?*?*H##Doe*Jo@\r"
    )


def test_empty_segments_and_terminators() -> None:
    payload = MSG.replace(b"\r", b"\r\n").replace(b"OBR|", b"\r\nOBR|")
    out = run({"set": {"MSH-5": "R"}}, payload)
    assert out == normalise_terminators(payload).replace(b"|LIS|", b"|R|", 1)
    assert b"\r\rOBR|" in out


def test_a_preamble_is_kept_and_a_byte_order_mark_dropped_when_converting() -> None:
    payload = b"\xef\xbb\xbf" + MSG
    assert run({"set": {"MSH-5": "R"}}, payload).startswith(b"\xef\xbb\xbfMSH|")
    assert run({"charset": {"to": "UTF-8", "whenUndeclared": "UTF-8"}}, payload).startswith(b"MSH|")


def test_no_msh_is_refused() -> None:
    for payload in (b"", b"PID|1\r", b"MSH", b"MSHx^~\\&\r", b"\x00\x00"):
        with pytest.raises(ProfileRefusal) as refused:
            run({"set": {"MSH-5": "R"}}, payload)
        assert refused.value.field == "MSH"


def test_ten_megabyte_fields() -> None:
    big = b"A" * 10_000_000
    payload = MSG.replace(b"Some long value here", big)
    started = time.monotonic()
    out = run({"truncate": {"OBX-5": 200}, "clear": ["PID-13"]}, payload)
    assert segment(out, b"OBX")[5] == b"A" * 200
    out = run({"charset": {"to": "ISO-8859-1", "whenUndeclared": "UTF-8"}}, payload)
    assert len(out) == len(payload) - 2 + len("||||||8859/1")
    out = run({"maps": [{"field": "OBX-5", "table": {"x": "y"}, "otherwise": "clear"}]}, payload)
    assert segment(out, b"OBX")[5] == b""
    assert time.monotonic() - started >= 0  # figures live in bench/profiles.py


# --- the samples ------------------------------------------------------------------------------

FIVE_RULES: dict[str, Any] = {
    "set": {"MSH-5": "LIS_NORTH", "MSH-6": "NORTH"},
    "removeSegments": ["Z*", "NTE"],
    "clear": ["PID-13"],
    "truncate": {"OBX-5": 200},
    "maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}, "otherwise": "keep"}],
}


def accepted(samples: list[Path]) -> list[tuple[Path, bytes]]:
    """The samples ingest accepts (a batch envelope, FHS/BHS, is refused at the door)."""
    out = []
    for path in samples:
        stored = path.read_bytes()
        try:
            parse_header(stored)
        except HeaderError:
            continue
        out.append((path, stored))
    assert len(out) > 100
    return out


def peer_parse(payload: bytes, encoding: str = "utf-8") -> hl7.Message:
    """python-hl7's reading of a message (it does not take empty segments)."""
    return hl7.parse("\r".join(s.decode(encoding, "replace") for s in segments(payload)))


def test_samples_keep_correlation_and_parse(samples: list[Path]) -> None:
    profile = compile_profile(FIVE_RULES)
    assert profile is not None
    for path, stored in accepted(samples):
        out = transform(stored, profile)
        header = parse_header(out)
        assert header.control_id == parse_header(stored).control_id, path.name
        assert header.receiving_application == "LIS_NORTH", path.name
        assert patient_identifiers(out) == patient_identifiers(stored), path.name
        assert not any(s.startswith((b"NTE|", b"Z")) for s in segments(out)), path.name
        assert str(peer_parse(out)["MSH"][0][5]) == "LIS_NORTH"  # a real peer library reads it


def test_samples_charset_round_trip(samples: list[Path]) -> None:
    """Every sample to ISO-8859-1 and back to UTF-8: the text is the same but for MSH-18
    (characters ISO-8859-1 lacks transliterated on the way)."""
    there = compile_profile(
        {"charset": {"to": "ISO-8859-1", "unmappable": "replace", "whenUndeclared": "UTF-8"}}
    )
    back = compile_profile({"charset": {"to": "UTF-8"}})
    assert there is not None and back is not None
    converted = 0
    for path, stored in accepted(samples):
        try:
            text = normalise_terminators(stored).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if parse_header(stored).delimiters.field != "|" or "8859" in text.split("\r")[0]:
            continue
        latin = transform(stored, there)
        again = transform(latin, back)
        msh = peer_parse(again)["MSH"][0]
        assert str(msh[18]) == "UNICODE UTF-8", path.name
        expected = text if text.isascii() or all(ord(c) < 256 for c in text) else None
        if expected is not None:
            mine = again.decode("utf-8").split("\r")
            theirs = expected.split("\r")
            assert mine[1:] == theirs[1:], path.name
            converted += 1
    assert converted > 50


# --- properties -------------------------------------------------------------------------------


@given(st.binary(max_size=400))
def test_no_profile_sends_the_very_bytes(payload: bytes) -> None:
    assert shaped(payload, None) is payload


SIDS = ["PID", "OBX", "NTE", "ZAB", "PV1"]
values = st.text(alphabet="abcXYZ019 ^~&\\é", max_size=6)
#: literals in the message's own charset (the generated messages declare none: ASCII)
literals = st.text(alphabet="abcXYZ019 ^~&\\|", max_size=6)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    header = "MSH|^~\\&|" + "|".join(draw(st.lists(values, min_size=8, max_size=20)))
    body = [header]
    for _ in range(draw(st.integers(0, 8))):
        sid = draw(st.sampled_from(SIDS))
        body.append("|".join([sid, *draw(st.lists(values, max_size=12))]))
    return ("\r".join(body) + "\r").encode("utf-8")


refs = st.builds(
    lambda sid, f, c: f"{sid}-{f}" + (f".{c}" if c else ""),
    st.sampled_from(["PID", "OBX", "NTE", "ZAB", "MSH"]),
    st.integers(4, 14),
    st.sampled_from([None, 1, 2]),
).filter(lambda r: not r.startswith(("MSH-10", "PID-3.", "MSH-13", "MSH-18")) and r != "PID-3")


@st.composite
def profiles(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    names = draw(st.lists(refs, unique=True, min_size=1, max_size=6))
    for ref in names:
        kind = draw(st.sampled_from(["set", "clear", "truncate", "maps"]))
        if kind == "set":
            spec.setdefault("set", {})[ref] = draw(literals)
        elif kind == "clear":
            spec.setdefault("clear", []).append(ref)
        elif kind == "truncate":
            spec.setdefault("truncate", {})[ref] = draw(st.integers(1, 5))
        else:
            spec.setdefault("maps", []).append(
                {"field": ref, "table": draw(st.sampled_from([{"a": "b"}, {"": "e", "a": "b"}]))}
            )
    if draw(st.booleans()):
        spec["removeSegments"] = ["Z*"]
    return spec


def _named(spec: dict[str, Any]) -> set[tuple[str, int]]:
    out = set()
    for key in ("set", "truncate"):
        out |= {(r.split("-")[0], int(r.split("-")[1].split(".")[0])) for r in spec.get(key, {})}
    out |= {(r.split("-")[0], int(r.split("-")[1].split(".")[0])) for r in spec.get("clear", [])}
    for m in spec.get("maps", []):
        r = m["field"]
        out.add((r.split("-")[0], int(r.split("-")[1].split(".")[0])))
    return out


@settings(max_examples=300)
@given(messages(), profiles())
def test_every_byte_the_profile_does_not_name_is_unchanged(
    payload: bytes, spec: dict[str, Any]
) -> None:
    profile = compile_profile(spec)
    assert profile is not None
    out = transform(payload, profile)
    named = _named(spec)
    kept = [s for s in segments(payload) if not (s.startswith(b"Z") and "removeSegments" in spec)]
    sent = segments(out)
    assert len(kept) == len(sent)
    for before, after in zip(kept, sent, strict=True):
        sid = before[:3].decode()
        old, new = before.split(b"|"), after.split(b"|")
        offset = 1 if sid == "MSH" else 0  # MSH-n is index n - 1
        for index in range(max(len(old), len(new))):
            if (sid, index + offset) in named:
                continue
            o = old[index] if index < len(old) else b""
            n = new[index] if index < len(new) else b""
            assert o == n, (sid, index + offset)


@given(st.binary(max_size=300), st.sampled_from([FIVE_RULES, {"charset": {"to": "ASCII"}}]))
def test_arbitrary_bytes_give_bytes_or_a_refusal(payload: bytes, spec: dict[str, Any]) -> None:
    """The fuzz target: whatever the stored bytes, the transform returns bytes or refuses with
    a field named; nothing else escapes."""
    profile = compile_profile(spec)
    assert profile is not None
    for candidate in (payload, b"MSH|^~\\&|" + payload):
        try:
            out = transform(candidate, profile, 1)
        except ProfileRefusal as exc:
            assert exc.field
        else:
            assert isinstance(out, bytes)


@settings(max_examples=200)
@given(messages(), profiles(), st.integers(0, 10**9))
def test_renumbering_a_shaped_message_is_shaping_it_with_that_number(
    payload: bytes, spec: dict[str, Any], number: int
) -> None:
    """The worker shapes with a placeholder MSH-13, reserves the number only once the profile
    took the message, then writes it (renumbered): the same bytes as shaping with it."""
    profile = compile_profile({**spec, "sequenceNumbers": True})
    assert profile is not None
    placeholder = transform(payload, profile, 0)
    again = renumbered(placeholder, number)
    header = placeholder.split(b"\r", 1)[0]
    assert (again is None) == (not header.isascii())  # then the worker shapes it again
    assert again is None or again == transform(payload, profile, number)


def test_renumbered_leaves_a_header_it_cannot_read_on_bytes() -> None:
    assert renumbered(b"MSH|^~\\&|A\xa4|B\r", 3) is None  # not ASCII: shape again
    assert renumbered(b"\xef\xbb\xbfMSH|^~\\&|A\rPID|1\r", 7) == (
        b"\xef\xbb\xbfMSH|^~\\&|A||||||||||7\rPID|1\r"
    )
    assert renumbered(b"PID|1\r", 1) is None
