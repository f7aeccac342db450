"""HL7 batches (v2.5 chapter 2, 2.10.3): splitting and the answering batch."""

from __future__ import annotations

import pytest

from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.batch import BatchError, build_batch_ack, is_batch, split_batch


def m(n: int, terminator: str = "\r") -> bytes:
    t = terminator
    return (
        f"MSH|^~\\&|LAB|HOSP|EHR|HOSP|20261201||ORU^R01|R{n}|P|2.5{t}PID|1||P{n}^^^H^MR{t}"
    ).encode()


FHS = b"FHS|^~\\&|LAB|HOSP|EHR|HOSP|20261201||||F-1\r"
BHS = b"BHS|^~\\&|LAB|HOSP|EHR|HOSP|20261201||||B-1\r"


@pytest.mark.parametrize(
    ("payload", "messages", "batches"),
    [
        (FHS + BHS + m(1) + m(2) + b"BTS|2\rFTS|1\r", [m(1), m(2)], 1),
        (BHS + m(1) + b"BTS|1\r", [m(1)], 1),
        (BHS + m(1) + m(2), [m(1), m(2)], 1),  # trailers are optional
        (FHS + m(1) + b"FTS|1\r", [m(1)], 1),  # a file with one batch and no BHS
        (
            FHS + BHS + m(1) + b"BTS|1\r" + BHS + m(2) + m(3) + b"BTS|2\rFTS|2\r",
            [m(1), m(2), m(3)],
            2,
        ),
        (BHS + b"BTS|0\r", [], 1),  # an empty batch
        (b"\xef\xbb\xbf\r\n" + BHS + m(1, "\n") + b"BTS|1\n", [m(1, "\n")], 1),  # BOM, LF
    ],
    ids=["file", "batch", "no-trailers", "no-bhs", "two-batches", "empty", "lf"],
)
def test_split(payload: bytes, messages: list[bytes], batches: int) -> None:
    assert is_batch(payload)
    batch = split_batch(payload, max_messages=10)
    assert list(batch.messages) == messages
    assert batch.batches == batches


@pytest.mark.parametrize(
    ("payload", "code", "text"),
    [
        (BHS + m(1) + b"BTS|3\r", 100, "BTS-1 says 3 messages, the batch holds 1"),
        (FHS + BHS + m(1) + b"BTS|1\rFTS|2\r", 100, "FTS-1 says 2 batches"),
        (BHS + b"PID|1||42\r" + m(1), 100, "segment 2 (PID): PID outside a message"),
        (BHS + m(1) + b"BTS|1\r" + m(2), 100, "MSH outside a batch"),
        (FHS + m(1) + b"FTS|1\r" + m(2), 100, "nothing may follow FTS"),
        (BHS + FHS + m(1), 100, "FHS must be the first segment"),
        (BHS + m(1) + b"BTS|x\r", 102, "BTS-1 is not a count"),
        (b"BHS|^~\r" + m(1), 102, "BHS"),
        (BHS + m(1) + m(2) + m(3), 104, "more than 2 messages"),
    ],
)
def test_refused(payload: bytes, code: int, text: str) -> None:
    with pytest.raises(BatchError) as caught:
        split_batch(payload, max_messages=2)
    assert caught.value.code == code
    assert text in caught.value.text


def test_a_single_message_is_not_a_batch() -> None:
    assert not is_batch(m(1))


def test_the_answer_references_the_batch_and_counts_the_acks() -> None:
    batch = split_batch(FHS + BHS + m(1) + m(2) + b"BTS|2\rFTS|1\r", max_messages=10)
    acks = [b"MSH|^~\\&|EHR|HOSP|LAB|HOSP|1||ACK|A1|P|2.5\rMSA|AA|R1\r"] * 2
    answer = build_batch_ack(batch, acks, comment="2 accepted")
    segments = answer.decode().split("\r")
    fhs, bhs = segments[0].split("|"), segments[1].split("|")
    # FHS-3..6 and BHS-3..6 swapped, -10 the comment, -11 new, -12 the original's -11
    assert fhs[2:6] == ["EHR", "HOSP", "LAB", "HOSP"] and fhs[11] == "F-1"
    assert bhs[2:6] == ["EHR", "HOSP", "LAB", "HOSP"] and bhs[11] == "B-1"
    assert bhs[9] == "2 accepted" and bhs[10] not in ("", "B-1")
    assert segments[-3:] == ["BTS|2", "FTS|1", ""]
    again = split_batch(answer, max_messages=10)
    assert [parse_ack(a).code for a in again.messages] == ["AA", "AA"]


def test_without_a_file_header_the_answer_has_none() -> None:
    batch = split_batch(BHS + m(1) + b"BTS|1\r", max_messages=10)
    answer = build_batch_ack(batch, [])
    assert answer.startswith(b"BHS|") and answer.endswith(b"BTS|0\r")
