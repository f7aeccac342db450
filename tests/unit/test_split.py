"""Cutting files into HL7 messages (inturn.worker.hl7.split), as `inturn send` reads them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inturn.worker.hl7.mllp import frame
from inturn.worker.hl7.split import SplitError, split_messages

A = b"MSH|^~\\&|S|F|R|F|20260101||ADT^A01|ONE|P|2.5\rPID|1||1\r"
B = b"MSH|^~\\&|S|F|R|F|20260101||ADT^A03|TWO|P|2.5\rPID|1||1\r"
LIMIT = 1 << 20


def test_one_cr_message_is_kept_byte_for_byte() -> None:
    assert split_messages(A, max_message_bytes=LIMIT).messages == [A]


@pytest.mark.parametrize("sep", [b"\r", b"\n", b"\r\n"])
def test_several_messages_with_any_terminator_and_blank_lines(sep: bytes) -> None:
    a, b = A.replace(b"\r", sep), B.replace(b"\r", sep)
    data = sep + a + sep + sep + b + sep
    assert split_messages(data, max_message_bytes=LIMIT).messages == [a, b]


def test_the_last_message_keeps_its_terminator_and_a_missing_one_stays_missing() -> None:
    assert split_messages(A + B[:-1], max_message_bytes=LIMIT).messages == [A, B[:-1]]


def test_mllp_framed_files_give_their_blocks() -> None:
    data = frame(A) + b"\n" + frame(B)
    split = split_messages(data, max_message_bytes=LIMIT)
    assert (split.messages, split.framed) == ([A, B], True)


def test_a_byte_order_mark_stays_with_the_first_message() -> None:
    bom = b"\xef\xbb\xbf"
    assert split_messages(bom + A + B, max_message_bytes=LIMIT).messages == [bom + A, B]


def test_blank_content_has_no_message() -> None:
    assert split_messages(b"\r\n \n", max_message_bytes=LIMIT).messages == []


def test_msh_inside_a_field_does_not_start_a_message() -> None:
    inner = A.replace(b"PID|1||1", b"NTE|1||see MSH|x")
    assert split_messages(inner, max_message_bytes=LIMIT).messages == [inner]


def test_a_batch_file_is_its_messages_in_order() -> None:
    head, tail = b"FHS|^~\\&|S|F\rBHS|^~\\&|S|F\r", b"BTS|2\rFTS|1\r"
    assert split_messages(head + A + B + tail, max_message_bytes=LIMIT).messages == [A, B]
    bhs_only = b"\r\nBHS|^~\\&|S|F\r" + A + b"BTS|1\r"  # a batch without a file header
    assert split_messages(bhs_only, max_message_bytes=LIMIT).messages == [A]
    with pytest.raises(SplitError, match="BTS-1 says 3 messages, the batch holds 2"):
        split_messages(head + A + B + b"BTS|3\rFTS|1\r", max_message_bytes=LIMIT)
    with pytest.raises(SplitError, match="over the"):
        split_messages(head + A + B + tail, max_message_bytes=len(A) - 1)
    with pytest.raises(SplitError, match="a batch file that cannot be read"):
        split_messages(head + A + B + tail, max_message_bytes=LIMIT, max_batch_messages=1)


@pytest.mark.parametrize(
    "data,words",
    [
        (b"hello world\r", "does not start with an MSH segment"),
        (b"PID|1||1\r" + A, "does not start with an MSH segment"),
        (frame(A) + b"junk", "outside any MLLP block"),
        (frame(A) + b"\x0bMSH|unfinished", "not finished"),
        (A + b"NTE|" + b"x" * len(A) * 2 + b"\r", "over the"),
        (frame(A * 3), "over the"),
    ],
)
def test_what_is_not_a_sequence_of_messages_is_refused(data: bytes, words: str) -> None:
    with pytest.raises(SplitError, match=words):
        split_messages(data, max_message_bytes=len(A) * 2)


@given(
    st.lists(st.sampled_from([A, B]), min_size=1, max_size=6),
    st.sampled_from([b"\r", b"\n", b"\r\n"]),
)
def test_joined_messages_come_back_in_order(messages: list[bytes], sep: bytes) -> None:
    converted = [m.replace(b"\r", sep) for m in messages]
    assert split_messages(b"".join(converted), max_message_bytes=LIMIT).messages == converted
