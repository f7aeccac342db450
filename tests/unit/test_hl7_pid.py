"""PID-3 patient identifiers for data-subject erasure."""

from __future__ import annotations

from pathlib import Path

from inturn.worker.hl7.pid import has_patient_id, patient_identifiers

MSG = (
    b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\r"
    b"EVN|A01|2024\r"
    b"PID|1|EXT9|12345^^^HOSP^MR~ 987-65 ^^^SSA^SS~^^^EMPTY~A\\T\\B^^^X||DOE^JANE\r"
    b"PV1|1|I\r"
)


def test_every_repetition_of_pid3() -> None:
    assert patient_identifiers(MSG) == {"12345", "987-65", "A&B"}


def test_has_patient_id() -> None:
    assert has_patient_id(MSG, "12345")
    assert has_patient_id(MSG, " 987-65 ")
    assert not has_patient_id(MSG, "EXT9")  # PID-2 is not read
    assert not has_patient_id(MSG, "")
    assert not has_patient_id(MSG, "1234")


def test_custom_delimiters_and_lf_separators() -> None:
    msg = b"MSH#$*@%#A#B#C#D#2024##ADT$A01#1#P#2.5\nPID#1##X1$$$H*X2$$$H#|not-a-field\n"
    assert patient_identifiers(msg) == {"X1", "X2"}


def test_several_pid_segments() -> None:
    msg = MSG + b"PID|2||777^^^HOSP\r"
    assert patient_identifiers(msg) == {"12345", "987-65", "A&B", "777"}


def test_no_pid_or_no_pid3() -> None:
    assert patient_identifiers(b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1\r") == set()
    assert patient_identifiers(b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1\rPID|1\r") == set()
    assert patient_identifiers(b"MSH|^~\\&|x\rPIDX|1||9\r") == set()


def test_unreadable_header_falls_back_to_default_delimiters() -> None:
    assert patient_identifiers(b"junk\rPID|1||55^^^H\r") == {"55"}
    assert patient_identifiers(b"") == set()


def test_utf8_identifier() -> None:
    msg = "MSH|^~\\&|A|B|C|D|2024||ADT^A01|1\rPID|1||Ü-1^^^H\r".encode()
    assert patient_identifiers(msg) == {"Ü-1"}


def test_samples_have_identifiers(samples: list[Path]) -> None:
    with_pid = 0
    for path in samples:
        payload = path.read_bytes()
        ids = patient_identifiers(payload)
        if b"\nPID|" in payload or b"\rPID|" in payload:
            with_pid += 1
            assert all(i and i == i.strip() for i in ids), path.name
    assert with_pid > 50
    first = next(p for p in samples if p.name.startswith("Test__Orders__"))
    assert patient_identifiers(first.read_bytes())
