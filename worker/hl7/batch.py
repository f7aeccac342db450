"""HL7 v2 batches: split a batch into its messages, and build the batch that acknowledges it.

Source: HL7 v2.5 chapter 2, section 2.10.3 "HL7 batch protocol" and the segment definitions of
FHS (file header), FTS (file trailer), BHS (batch header) and BTS (batch trailer). A batch is::

    [FHS]                 file header: FHS-1/FHS-2 delimiters, FHS-11 file control ID
    { [BHS]               batch header: BHS-1/BHS-2 delimiters, BHS-11 batch control ID
      { MSH ... }         zero or more messages, each MSH to the segment before the next
      [BTS] }             batch trailer: BTS-1 batch message count
    [FTS]                 file trailer: FTS-1 file batch count

What inturn accepts: an optional FHS, then one or more batches each opened by a BHS (the BHS
may be left out only when there is a single batch in the file), each closed by an optional BTS
(a BHS or FTS closes the batch before it too), and an optional FTS as the last segment.
Anything else (a segment other than MSH before the first message of a batch, a BTS without a
BHS, a second FHS, a segment after the FTS) is a segment sequence error (table 0357 code 100).
A BTS-1 or FTS-1 that is filled must equal the count it declares (code 100 too, so that a batch
truncated in transit is never half-accepted).

Acknowledging (2.10.3.3): the answer to a batch is a batch of acknowledgements, one ACK per
message in the order received, enclosed in a BHS/BTS (and FHS/FTS when the batch came with
them). The answering BHS swaps the sending and receiving application/facility of the original
(BHS-3/4 with BHS-5/6), carries a new BHS-11 and the original's BHS-11 in BHS-12 (reference
batch control ID); BTS-1 is the number of ACKs; FHS-12 likewise references FHS-11. This module
builds only the envelope: the acknowledgements themselves are built per message by
:mod:`.ack`.

Pure: no I/O. Messages are returned as the exact bytes of the batch they came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from inturn.worker.hl7.ack import new_control_id
from inturn.worker.hl7.delimiters import (
    DEFAULT_DELIMITERS,
    Delimiters,
    read_delimiters,
    strip_preamble,
)
from inturn.worker.hl7.errors import HeaderError, HL7Error

__all__ = [
    "Batch",
    "BatchError",
    "build_batch_ack",
    "is_batch",
    "split_batch",
]

#: Segments that begin or end a batch or a file.
ENVELOPE = ("FHS", "BHS", "BTS", "FTS")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")


class BatchError(HL7Error):
    """A batch that cannot be split into its messages.

    Attributes:
        code: a table 0357 code (100 segment sequence error, 101 required field missing, 102
            unusable delimiters, 104 more messages than allowed).
        text: what is wrong, naming the segment and its position; never message content.
    """

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


@dataclass(frozen=True)
class Batch:
    """A batch split into its messages.

    Attributes:
        delimiters: from FHS-1/FHS-2 (or BHS-1/BHS-2 without a file header).
        messages: each message's bytes, exactly as in the batch, in order.
        file_header: the FHS fields (index n is FHS-n, 0 is "FHS"), or None.
        batch_header: the first BHS fields (index n is BHS-n), or None.
        batches: how many BHS/BTS batches the file held (1 without a BHS).
    """

    delimiters: Delimiters
    messages: tuple[bytes, ...]
    file_header: tuple[str, ...] | None
    batch_header: tuple[str, ...] | None
    batches: int

    @property
    def batch_control_id(self) -> str:
        """BHS-11 (or FHS-11 without a batch header), '' when absent."""
        return _field(self.batch_header or self.file_header, 11)


def is_batch(payload: bytes) -> bool:
    """Whether ``payload`` starts (after a BOM and whitespace) with FHS or BHS."""
    return strip_preamble(payload)[:3] in (b"FHS", b"BHS")


def _field(fields: tuple[str, ...] | None, number: int) -> str:
    if fields is None or number >= len(fields):
        return ""
    return fields[number]


def _header_fields(segment: str) -> tuple[Delimiters, tuple[str, ...]]:
    """Delimiters and fields of an FHS or BHS segment, numbered like MSH (index 1 is the field
    separator itself, index n is field n)."""
    try:
        delimiters = read_delimiters("MSH" + segment[3:])
    except HeaderError as exc:
        tag = segment[:3]
        raise BatchError(exc.code, f"{tag}: {exc.text.replace('MSH', tag)}") from None
    parts = segment.split(delimiters.field)
    return delimiters, (parts[0], delimiters.field, *parts[1:])


def _count(fields: list[str], name: str) -> int | None:
    raw = fields[1].strip() if len(fields) > 1 else ""
    if not raw:
        return None
    if not raw.isdigit():
        raise BatchError(102, f"{name}-1 is not a count")
    return int(raw)


def split_batch(payload: bytes, *, max_messages: int) -> Batch:
    """Split a batch (or a file of batches) into its messages.

    Args:
        payload: the bytes, starting with FHS or BHS (after an optional BOM/whitespace).
        max_messages: most messages accepted in one batch file; more is refused whole.

    Returns:
        A :class:`Batch`; its messages are slices of ``payload`` (each ends with its last
        segment's terminator).

    Raises:
        BatchError: the envelope is out of sequence, its delimiters are unusable, a declared
            count does not match, or there are more than ``max_messages`` messages.
    """
    data = strip_preamble(payload)
    text = data.decode("latin-1")
    delimiters = DEFAULT_DELIMITERS
    file_header: tuple[str, ...] | None = None
    batch_header: tuple[str, ...] | None = None
    messages: list[bytes] = []
    batches = 0
    in_batch = False  # a BHS is open (or, without one, messages have started)
    closed_file = False
    batch_messages = 0
    start: int | None = None  # offset of the current message
    position = 0
    number = 0

    def end_message(at: int) -> None:
        nonlocal start
        if start is not None:
            messages.append(data[start:at])
            start = None
            if len(messages) > max_messages:
                raise BatchError(104, f"more than {max_messages} messages in one batch")

    for match in _LINE.finditer(text):
        line = match.group()
        if not line:
            break
        offset = position
        position += len(line)
        segment = line.rstrip("\r\n")
        if not segment.strip("\x00 \t\x0c"):
            continue
        number += 1
        tag = segment[:3]
        where = f"segment {number} ({tag})"
        if closed_file:
            raise BatchError(100, f"{where}: nothing may follow FTS")
        if tag == "FHS":
            if number != 1:
                raise BatchError(100, f"{where}: FHS must be the first segment")
            delimiters, file_header = _header_fields(segment)
        elif tag == "BHS":
            end_message(offset)
            if in_batch and batch_header is None:
                raise BatchError(100, f"{where}: BHS after messages outside a batch")
            found, fields = _header_fields(segment)
            if file_header is None:
                delimiters = found
            if batch_header is None:
                batch_header = fields
            in_batch, batch_messages, batches = True, 0, batches + 1
        elif tag == "BTS":
            end_message(offset)
            if not in_batch or (batch_header is None and batches == 0):
                raise BatchError(100, f"{where}: BTS without a BHS")
            declared = _count(segment.split(delimiters.field), "BTS")
            if declared is not None and declared != batch_messages:
                raise BatchError(
                    100,
                    f"{where}: BTS-1 says {declared} messages, the batch holds {batch_messages}",
                )
            in_batch = False
        elif tag == "FTS":
            end_message(offset)
            declared = _count(segment.split(delimiters.field), "FTS")
            if declared is not None and declared != batches:
                raise BatchError(
                    100, f"{where}: FTS-1 says {declared} batches, the file holds {batches}"
                )
            in_batch, closed_file = False, True
        elif tag == "MSH":
            end_message(offset)
            if not in_batch:
                if batches > 0:
                    raise BatchError(100, f"{where}: MSH outside a batch (after a BTS)")
                if file_header is None:
                    raise BatchError(100, f"{where}: a batch starts with FHS or BHS")
                in_batch, batches = True, 1  # a file with a single batch and no BHS
            batch_messages += 1
            start = offset
        elif start is None:
            raise BatchError(100, f"{where}: {tag} outside a message")
    end_message(len(data))
    return Batch(
        delimiters=delimiters,
        messages=tuple(messages),
        file_header=file_header,
        batch_header=batch_header,
        batches=batches,
    )


def _swap_header(
    tag: str,
    fields: tuple[str, ...] | None,
    d: Delimiters,
    stamp: str,
    control_id: str,
    comment: str,
) -> str:
    """An answering FHS/BHS: applications and facilities swapped, a new control ID (-11) and
    the original's in -12."""
    out = [tag, d.encoding_characters]
    out += [
        _field(fields, 5),
        _field(fields, 6),
        _field(fields, 3),
        _field(fields, 4),
        stamp,
        "",
        "",
        comment,
        control_id,
        _field(fields, 11),
    ]
    return d.field.join(out).rstrip(d.field)


def build_batch_ack(
    batch: Batch,
    acks: list[bytes],
    *,
    comment: str = "",
    now: datetime | None = None,
) -> bytes:
    """The batch answering ``batch``: ``acks`` in order inside BHS/BTS, inside FHS/FTS when
    the original had a file header.

    Args:
        batch: the batch being answered (from :func:`split_batch`).
        acks: one acknowledgement per message, unframed, each ending with CR.
        comment: BHS-10 (and FHS-10), a short text for people; written as given (no content
            of the messages may go into it).
        now: FHS-7/BHS-7; default the current UTC time.

    Returns:
        The answering batch, unframed, segments ending with CR.
    """
    d = batch.delimiters
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d%H%M%S")
    parts: list[bytes] = []
    if batch.file_header is not None:
        fhs = _swap_header("FHS", batch.file_header, d, stamp, new_control_id(), comment)
        parts.append((fhs + "\r").encode("latin-1"))
    source = batch.batch_header if batch.batch_header is not None else batch.file_header
    bhs = _swap_header("BHS", source, d, stamp, new_control_id(), comment)
    parts.append((bhs + "\r").encode("latin-1"))
    parts.extend(acks)
    parts.append(f"BTS{d.field}{len(acks)}\r".encode("latin-1"))
    if batch.file_header is not None:
        parts.append(f"FTS{d.field}1\r".encode("latin-1"))
    return b"".join(parts)
