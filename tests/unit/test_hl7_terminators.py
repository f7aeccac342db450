"""Segment terminators: a message terminated by CR is never changed; LF and CRLF become CR."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inturn.worker.hl7.delimiters import first_segment_of, strip_preamble
from inturn.worker.hl7.mllp import Frame, FrameReader, frame
from inturn.worker.hl7.terminators import normalise_terminators, terminator

# Field content: any byte but the terminators' own and MLLP's block bytes, plus a few LFs and
# CRs that are not terminators (an LF inside OBX-5 is what receivers have been sent).
FIELD_BYTES = st.binary(max_size=30).map(
    lambda b: bytes(x for x in b if x not in (0x0B, 0x1C, 0x0D, 0x0A))
)
FIELD_WITH_LF = st.lists(FIELD_BYTES, min_size=1, max_size=3).map(b"\n".join)
SEGMENTS = st.lists(
    st.tuples(st.sampled_from([b"PID", b"PV1", b"OBX", b"NTE", b"ZZZ"]), FIELD_WITH_LF),
    min_size=1,
    max_size=6,
)


def build(segments: list[tuple[bytes, bytes]], sep: bytes, last: bool = True) -> bytes:
    lines = [b"MSH|^~\\&|A|B|C|D|20260101||ORU^R01|ID1|P|2.5"]
    lines += [name + b"|" + body for name, body in segments]
    return sep.join(lines) + (sep if last else b"")


@given(SEGMENTS, st.booleans())
def test_a_cr_message_is_left_byte_for_byte(
    segments: list[tuple[bytes, bytes]], last: bool
) -> None:
    message = build(segments, b"\r", last)
    assert terminator(message) == "CR"
    assert normalise_terminators(message) == message


@given(SEGMENTS, st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_lf_and_crlf_messages_get_cr(
    segments: list[tuple[bytes, bytes]], sep: bytes, last: bool
) -> None:
    message = build(segments, sep, last)
    result = normalise_terminators(message)
    assert terminator(message) == ("LF" if sep == b"\n" else "CRLF")
    assert b"\r\n" not in result
    if sep == b"\r\n":
        # Only the CRLF pairs change: the LFs inside fields stay data.
        assert result == message.replace(b"\r\n", b"\r")
        assert result.split(b"\r") == message.split(b"\r\n")
    else:
        # An LF file cannot tell a terminator from an LF in a field: every LF becomes CR.
        assert result == message.replace(b"\n", b"\r")
    assert len(message) - len(result) == (message.count(b"\r\n") if sep == b"\r\n" else 0)


@given(st.binary(max_size=200))
def test_the_rule_is_idempotent_and_changes_only_terminator_bytes(payload: bytes) -> None:
    once = normalise_terminators(payload)
    assert normalise_terminators(once) == once
    strip = bytes.maketrans(b"", b"")
    assert once.translate(strip, b"\r\n") == payload.translate(strip, b"\r\n")


@given(SEGMENTS, st.sampled_from([b"\r", b"\n", b"\r\n"]))
def test_mllp_carries_the_normalised_bytes_exactly(
    segments: list[tuple[bytes, bytes]], sep: bytes
) -> None:
    message = build(segments, sep)
    wire = frame(normalise_terminators(message))
    assert FrameReader(1 << 20).feed(wire) == [Frame(normalise_terminators(message))]


@pytest.mark.parametrize(
    ("given_bytes", "expected"),
    [
        (b"MSH|a\nPID|b\n", b"MSH|a\rPID|b\r"),
        (b"MSH|a\r\nPID|b\r\n", b"MSH|a\rPID|b\r"),
        (b"MSH|a\rPID|b\r", b"MSH|a\rPID|b\r"),
        (b"MSH|a\rOBX|Line one\nLine two|F\r", b"MSH|a\rOBX|Line one\nLine two|F\r"),
        (b"MSH|a\rPID|b\n", b"MSH|a\rPID|b\n"),
        (b"MSH|a\r\nOBX|x\ny\r\n", b"MSH|a\rOBX|x\ny\r"),
        (b"MSH|a\nPID|b", b"MSH|a\rPID|b"),
        (b"\r\nMSH|a\nPID|b", b"\rMSH|a\rPID|b"),
        (b"MSH|a", b"MSH|a"),
        (b"", b""),
    ],
)
def test_examples(given_bytes: bytes, expected: bytes) -> None:
    assert normalise_terminators(given_bytes) == expected


def _terminator_scanning_everything(payload: bytes) -> str | None:
    """The rule as first written: the first CR and the first LF anywhere in the message."""
    start = len(payload) - len(payload.lstrip(b"\r\n"))
    cr, lf = payload.find(b"\r", start), payload.find(b"\n", start)
    if cr < 0 and lf < 0:
        return None
    if cr >= 0 and (lf < 0 or cr < lf):
        return "CRLF" if lf == cr + 1 else "CR"
    return "LF"


@given(st.binary(max_size=200).map(lambda b: b.replace(b"\x00", b"\r").replace(b"\x01", b"\n")))
def test_the_first_segment_is_found_without_scanning_the_whole_message(payload: bytes) -> None:
    """Looking for an LF only before the first CR (or right after it) changes no answer: the
    terminator and the first segment are those of a scan of every byte (issue 33: a 12 KB
    CR-terminated message was scanned to its end twice per send to find them)."""
    assert terminator(payload) == _terminator_scanning_everything(payload)
    data = strip_preamble(payload)
    ends = [n for n in (data.find(b"\r"), data.find(b"\n")) if n >= 0]
    assert first_segment_of(payload) == data[: min(ends, default=len(data))].decode("latin-1")
