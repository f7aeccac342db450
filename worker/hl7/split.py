"""Cut the content of a file (or of standard input) into HL7 v2 messages, without I/O.

What files of HL7 messages look like in practice, and how each is read:

* **MLLP-framed** (the bytes contain the start-block byte 0x0B): every block is one message,
  read by :class:`inturn.worker.hl7.mllp.FrameReader`, whose tolerance ingest shares (filler
  between blocks, a missing CR after the end block).
* **A batch** (the text begins with ``FHS`` or ``BHS``: HL7 v2.x chapter 2, "Batch protocol"):
  its messages, in order, as :func:`inturn.worker.hl7.batch.split_batch` finds them (the
  envelope, FHS/BHS/BTS/FTS, is checked and left out: ingest stores a batch's messages one by
  one anyway).
* **Plain**: one message or several in a row. A message starts at every segment whose name is
  ``MSH``, at the start of the text or right after a segment terminator (CR, LF or CRLF: files
  written on other systems end their segments with LF or CRLF, HL7 v2.x chapter 2 asks for CR).
  Blank lines between messages and at the end are dropped.

The message bytes are returned as they were in the file (terminators included): turning LF or
CRLF into CR is the receiver's business (ingest applies
:func:`inturn.worker.hl7.terminators.normalise_terminators` at the door, and so does every
sender), so a CR-terminated message goes byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inturn.worker.errors import Invalid
from inturn.worker.hl7.batch import BatchError, split_batch
from inturn.worker.hl7.mllp import SB, Frame, FrameReader, FrameTooLarge, Garbage

#: A segment named MSH at the start of the text or after a terminator.
_MSH_START = re.compile(rb"(?:^|(?<=[\r\n]))MSH")
#: Bytes that may surround messages without being part of one.
_BLANK = b"\r\n\t \x00\x0c"
#: The UTF-8 byte-order mark some editors write first.
_BOM = b"\xef\xbb\xbf"


class SplitError(Invalid):
    """The content is not a sequence of HL7 messages; the message says where and why."""


@dataclass(frozen=True)
class Split:
    """The messages found, in order; ``framed`` tells whether they came MLLP-framed."""

    messages: list[bytes]
    framed: bool


#: Most messages one batch file may hold (ingest's ``--max-batch-messages`` default).
MAX_BATCH_MESSAGES = 1000


def split_messages(
    data: bytes, *, max_message_bytes: int, max_batch_messages: int = MAX_BATCH_MESSAGES
) -> Split:
    """Cut ``data`` into messages (see the module docstring).

    Args:
        data: a file's bytes.
        max_message_bytes: the largest message accepted, in bytes (ingest's
            ``--max-frame-bytes`` by default).
        max_batch_messages: the most messages a batch file may hold.

    Returns:
        A :class:`Split`; its list is empty when ``data`` holds only blank bytes.

    Raises:
        SplitError: bytes that are not a message where one should start (a plain file whose
            text does not begin with ``MSH``, ``FHS`` or ``BHS``), bytes outside any block of
            a framed file, an unfinished block, a message larger than ``max_message_bytes``,
            or a batch whose envelope is broken or that holds more than
            ``max_batch_messages`` (:class:`~inturn.worker.hl7.batch.BatchError`'s words).
    """
    if bytes([SB]) in data:
        return Split(_framed(data, max_message_bytes), framed=True)
    body = data.lstrip(_BLANK)
    if not body.strip(_BLANK):
        return Split([], framed=False)
    if body.removeprefix(_BOM).startswith((b"FHS", b"BHS")):
        return Split(_batch(body, max_message_bytes, max_batch_messages), framed=False)
    starts = [m.start() for m in _MSH_START.finditer(body)]
    if body.startswith(_BOM + b"MSH"):
        starts.insert(0, 0)
    if not starts or starts[0] != 0:
        head = body[:20].decode("latin-1")
        raise SplitError(f"does not start with an MSH segment (it starts {head!r})")
    messages: list[bytes] = []
    for begin, end in zip(starts, [*starts[1:], len(body)], strict=True):
        message = body[begin:end]
        trimmed = message.rstrip(b"\r\n")
        # keep the message's own last terminator (one CR, LF or CRLF), drop blank lines
        tail = message[len(trimmed) : len(trimmed) + 2]
        message = trimmed + (tail if tail == b"\r\n" else tail[:1])
        if len(message) > max_message_bytes:
            raise SplitError(
                f"message {len(messages) + 1} is {len(message)} bytes, over the"
                f" {max_message_bytes}-byte limit"
            )
        messages.append(message)
    return Split(messages, framed=False)


def _batch(body: bytes, max_message_bytes: int, max_batch_messages: int) -> list[bytes]:
    try:
        messages = list(split_batch(body, max_messages=max_batch_messages).messages)
    except BatchError as exc:
        raise SplitError(f"a batch file that cannot be read: {exc.text}") from None
    for n, message in enumerate(messages, 1):
        if len(message) > max_message_bytes:
            raise SplitError(
                f"message {n} of the batch is {len(message)} bytes, over the"
                f" {max_message_bytes}-byte limit"
            )
    return messages


def _framed(data: bytes, max_message_bytes: int) -> list[bytes]:
    reader = FrameReader(max_message_bytes)
    messages: list[bytes] = []
    for event in reader.feed(data):
        if isinstance(event, Garbage):
            raise SplitError(f"{event.count} bytes outside any MLLP block")
        if isinstance(event, FrameTooLarge):
            raise SplitError(f"block {len(messages) + 1} is over the {event.limit}-byte limit")
        if isinstance(event, Frame):  # (Dropped only follows a drop(), never made here)
            messages.append(event.payload)
    if reader.mid_frame:
        raise SplitError("the last MLLP block is not finished (no end-block byte 0x1C)")
    return messages
