"""The acknowledgement rule of HL7 v2.5 chapter 2 (MSH-15, MSH-16, table 0155), both ends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inturn.worker.hl7.expect import answer_codes, due, holds
from inturn.worker.hl7.header import parse_header

CONDITIONS = ["", "AL", "NE", "ER", "SU", "XX"]


def header(msh15: str, msh16: str):  # type: ignore[no-untyped-def]
    return parse_header(f"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5|||{msh15}|{msh16}\r".encode())


@pytest.mark.parametrize(
    ("condition", "on_success", "on_error"),
    [("AL", True, True), ("NE", False, False), ("ER", False, True), ("SU", True, False)],
)
def test_table_0155(condition: str, on_success: bool, on_error: bool) -> None:
    assert holds(condition, True) is on_success  # type: ignore[arg-type]
    assert holds(condition, False) is on_error  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("msh15", "msh16", "success", "failure"),
    [
        ("", "", ("application",), ("application",)),  # original mode: always one ACK
        ("AL", "", ("accept",), ("accept",)),  # empty MSH-16 in enhanced mode: NE
        ("", "AL", ("accept", "application"), ("accept", "application")),  # empty MSH-15: AL
        ("AL", "AL", ("accept", "application"), ("accept", "application")),
        ("NE", "NE", (), ()),
        ("NE", "AL", ("application",), ("application",)),
        ("ER", "NE", (), ("accept",)),
        ("SU", "ER", ("accept",), ("application",)),
        ("al", "ne", ("accept",), ("accept",)),  # case does not matter
        ("XX", "YY", ("accept", "application"), ("accept", "application")),  # unknown: AL
    ],
)
def test_due_levels(
    msh15: str, msh16: str, success: tuple[str, ...], failure: tuple[str, ...]
) -> None:
    assert due(header(msh15, msh16), True) == success
    assert due(header(msh15, msh16), False) == failure


@given(st.sampled_from(CONDITIONS), st.sampled_from(CONDITIONS))
def test_what_ingest_sends_is_what_a_sender_waits_for(msh15: str, msh16: str) -> None:
    """On success a receiver sends one answer per level a sender awaits, in order; on failure
    it sends at most one, negative, at the first level due."""
    h = header(msh15, msh16)
    enhanced = bool(msh15 or msh16)
    sent = answer_codes(h, "accept")
    levels = due(h, True)
    assert len(sent) == len(levels)
    for code, level in zip(sent, levels, strict=True):
        assert code == ("CA" if level == "accept" and enhanced else "AA")
    for kind, pair in (("error", ("CE", "AE")), ("reject", ("CR", "AR"))):
        refused = answer_codes(h, kind)  # type: ignore[arg-type]
        assert len(refused) == min(1, len(due(h, False)))
        if refused:
            first = due(h, False)[0]
            assert refused[0] == (pair[0] if first == "accept" else pair[1])
