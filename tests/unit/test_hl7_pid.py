"""Patient identifiers in PID-2, PID-3, PID-4 and MRG-1, for erasure and lookups."""

from __future__ import annotations

import string
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from inturn.worker.hl7.delimiters import Delimiters
from inturn.worker.hl7.pid import (
    PatientId,
    has_patient_id,
    index_keys,
    lookup_key,
    patient_identifiers,
)

MSH = b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\r"

MSG = (
    MSH + b"EVN|A01|2024\r"
    b"PID|1||12345^^^HOSP^MR~ 987-65 ^^^SSA&2.16.840.1.113883.4.1&ISO^SS~^^^EMPTY~A\\T\\B^^^X"
    b"||DOE^JANE\r"
    b"PV1|1|I\r"
)


def ids(payload: bytes) -> set[str]:
    return {p.id for p in patient_identifiers(payload)}


def test_every_repetition_of_pid3_with_its_authorities() -> None:
    assert patient_identifiers(MSG) == [
        PatientId("PID-3", "12345", ("HOSP",)),
        PatientId("PID-3", "987-65", ("SSA", "2.16.840.1.113883.4.1")),
        PatientId("PID-3", "A&B", ("X",)),
    ]


def test_pid2_external_id_of_older_feeds() -> None:
    msg = MSH + b"PID|1|EXT-9^^^OLDSYS~EXT-10|||DOE^JOHN\r"
    assert patient_identifiers(msg) == [
        PatientId("PID-2", "EXT-9", ("OLDSYS",)),
        PatientId("PID-2", "EXT-10", ()),
    ]
    assert has_patient_id(msg, "EXT-9")
    assert has_patient_id(msg, "EXT-9", "OLDSYS")
    assert has_patient_id(msg, "EXT-10")


def test_pid4_alternate_id() -> None:
    msg = MSH + b"PID|1||MRN1^^^HOSP|ALT-77^^^CLINIC~ALT-78^^^CLINIC|DOE^JOHN\r"
    assert [p for p in patient_identifiers(msg) if p.field == "PID-4"] == [
        PatientId("PID-4", "ALT-77", ("CLINIC",)),
        PatientId("PID-4", "ALT-78", ("CLINIC",)),
    ]
    assert has_patient_id(msg, "ALT-78", "CLINIC")
    assert not has_patient_id(msg, "ALT-78", "HOSP")


def test_mrg1_prior_identifiers_of_a_merge() -> None:
    msg = (
        b"MSH|^~\\&|A|B|C|D|2024||ADT^A40^ADT_A39|9|P|2.5\r"
        b"EVN|A40|2024\r"
        b"PID|1||NEW-1^^^HOSP^MR||DOE^JANE\r"
        b"MRG|OLD-1^^^HOSP^MR~OLD-2^^^LAB|||OLD-ACCT\r"
    )
    assert [p for p in patient_identifiers(msg) if p.field == "MRG-1"] == [
        PatientId("MRG-1", "OLD-1", ("HOSP",)),
        PatientId("MRG-1", "OLD-2", ("LAB",)),
    ]
    assert has_patient_id(msg, "OLD-2")
    assert has_patient_id(msg, "OLD-1", "HOSP")
    assert not has_patient_id(msg, "OLD-2", "HOSP")
    assert not has_patient_id(msg, "OLD-ACCT")  # MRG-3 (account) does not name the patient


def test_authority_matches_namespace_or_universal_id_and_is_required_when_asked() -> None:
    assert has_patient_id(MSG, "987-65", "SSA")
    assert has_patient_id(MSG, "987-65", " 2.16.840.1.113883.4.1 ")
    assert not has_patient_id(MSG, "987-65", "ISO")  # the ID type is not an authority
    assert not has_patient_id(MSH + b"PID|1||55\r", "55", "HOSP")
    assert has_patient_id(MSH + b"PID|1||55\r", "55")


def test_has_patient_id() -> None:
    assert has_patient_id(MSG, "12345")
    assert has_patient_id(MSG, " 987-65 ")
    assert not has_patient_id(MSG, "")
    assert not has_patient_id(MSG, "1234")
    assert not has_patient_id(MSG, "DOE")  # PID-5 is a name, not an identifier


def test_custom_delimiters_and_lf_separators() -> None:
    msg = b"MSH#$*@%#A#B#C#D#2024##ADT$A01#1#P#2.5\nPID#1#P2#X1$$$H*X2$$$H%U#|not-a-field\n"
    assert patient_identifiers(msg) == [
        PatientId("PID-2", "P2", ()),
        PatientId("PID-3", "X1", ("H",)),
        PatientId("PID-3", "X2", ("H", "U")),
        PatientId("PID-4", "|not-a-field", ()),
    ]


def test_several_segments_and_repeats_reported_once() -> None:
    msg = MSG + b"PID|2||777^^^HOSP~12345^^^HOSP\r"
    assert ids(msg) == {"12345", "987-65", "A&B", "777"}
    assert len(patient_identifiers(msg)) == 4


def test_no_pid_or_no_identifier_fields() -> None:
    assert patient_identifiers(b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1\r") == []
    assert patient_identifiers(b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1\rPID|1\r") == []
    assert patient_identifiers(b"MSH|^~\\&|x\rPIDX|1||9\rMRGX|1\r") == []


def test_unreadable_header_falls_back_to_default_delimiters() -> None:
    assert ids(b"junk\rPID|1||55^^^H\r") == {"55"}
    assert patient_identifiers(b"") == []


def test_utf8_identifier() -> None:
    msg = "MSH|^~\\&|A|B|C|D|2024||ADT^A01|1\rPID|1||Ü-1^^^Hô\r".encode()
    assert patient_identifiers(msg) == [PatientId("PID-3", "Ü-1", ("Hô",))]


def test_index_keys_find_by_id_alone_or_with_its_authority() -> None:
    keys = set(index_keys(MSG))
    assert lookup_key("12345") in keys
    assert lookup_key(" 12345 ", "HOSP") in keys
    assert lookup_key("12345", "SSA") not in keys
    assert lookup_key("987-65", "2.16.840.1.113883.4.1") in keys
    assert len(keys) == 3 + 4
    assert all(len(k) == 32 and set(k) <= set(string.hexdigits.lower()) for k in keys)
    assert index_keys(MSH) == []


def test_samples_have_identifiers(samples: list[Path]) -> None:
    with_pid = 0
    for path in samples:
        payload = path.read_bytes()
        found = patient_identifiers(payload)
        if b"\nPID|" in payload or b"\rPID|" in payload:
            with_pid += 1
            assert all(p.id and p.id == p.id.strip() for p in found), path.name
    assert with_pid > 50
    first = next(p for p in samples if p.name.startswith("Test__Orders__"))
    assert patient_identifiers(first.read_bytes())


usable = list(string.punctuation)
id_text = st.text(
    alphabet=string.ascii_letters + string.digits + "-. |^~\\&#", min_size=1, max_size=12
)


@given(
    st.lists(st.sampled_from(usable), min_size=5, max_size=5, unique=True),
    st.sampled_from([("PID", 2), ("PID", 3), ("PID", 4), ("MRG", 1)]),
    st.lists(st.tuples(id_text, st.one_of(st.none(), id_text)), min_size=1, max_size=4),
    st.sampled_from(["\r", "\n", "\r\n"]),
)
@settings(max_examples=200)
def test_every_field_round_trips_under_any_delimiters(
    delims: list[str],
    where: tuple[str, int],
    wanted: list[tuple[str, str | None]],
    terminator: str,
) -> None:
    fs, cs, rs, es, ss = delims
    d = Delimiters(fs, cs, rs, es, ss)
    seg, number = where
    repetitions = [
        d.escape_text(ident)
        + (f"{cs}{cs}{cs}{d.escape_text(authority)}" if authority is not None else "")
        for ident, authority in wanted
    ]
    fields = [seg, *([""] * number)]
    fields[1] = "1" if number != 1 else fields[1]
    fields[number] = rs.join(repetitions)
    header = fs.join(["MSH", cs + rs + es + ss, "A", "B", "C", "D", "2024", "", "ADT", "1"])
    payload = (header + terminator + fs.join(fields) + terminator).encode()
    keys = set(index_keys(payload))
    for ident, authority in wanted:
        if not ident.strip():
            continue
        assert has_patient_id(payload, ident), (payload, ident)
        assert lookup_key(ident) in keys
        if authority is not None and authority.strip():
            assert has_patient_id(payload, ident, authority)
            assert lookup_key(ident, authority) in keys
    assert all(p.field == f"{seg}-{number}" for p in patient_identifiers(payload))


@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    for prefix in (b"", MSH, MSH + b"PID|", MSH + b"MRG|"):
        found = patient_identifiers(prefix + data)
        assert all(p.id and p.id == p.id.strip() for p in found)
        assert len(index_keys(prefix + data)) >= len({p.id for p in found})
