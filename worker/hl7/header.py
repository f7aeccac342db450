"""Read the MSH segment of an HL7 v2 message: only what routing and acknowledging need.

Source: HL7 v2.x chapter 2, "MSH - message header segment". Field numbers follow the standard:
MSH-1 is the field separator itself, so after splitting the segment on that separator the
list index of MSH-n is n - 1.

The payload is decoded as latin-1 for parsing only: every byte maps to one character, so each
string below encodes back (``.encode("latin-1")``) to the exact bytes of the message. Field
values are raw: escape sequences are left as written.
"""

from __future__ import annotations

from dataclasses import dataclass

from inturn.worker.hl7.delimiters import Delimiters, first_segment_of, read_delimiters
from inturn.worker.hl7.errors import HeaderError

__all__ = ["Header", "HeaderError", "MessageType", "parse_header", "second_header"]


@dataclass(frozen=True)
class MessageType:
    """MSH-9, the message type.

    Attributes:
        raw: the field as written, e.g. ``ADT^A01^ADT_A01`` (first repetition only).
        code: component 1, the message code, e.g. ``ADT``.
        trigger: component 2, the trigger event, e.g. ``A01`` (may be empty, e.g. ``ACK``).
        structure: component 3, the message structure, e.g. ``ADT_A01`` (may be empty).
    """

    raw: str
    code: str
    trigger: str
    structure: str

    @property
    def type_key(self) -> str:
        """``code^trigger`` joined with ``^`` whatever the message's component separator.

        Just ``code`` when the trigger is empty. This is the form destination filters use.
        """
        return f"{self.code}^{self.trigger}" if self.trigger else self.code


@dataclass(frozen=True)
class Header:
    """The MSH fields inturn uses. Strings are raw field values (latin-1 decoded, unescaped).

    Attributes:
        delimiters: MSH-1 and MSH-2.
        sending_application, sending_facility: MSH-3, MSH-4.
        receiving_application, receiving_facility: MSH-5, MSH-6.
        date_time: MSH-7, the message date/time as written.
        message_type: MSH-9.
        control_id: MSH-10, never empty.
        processing_id: MSH-11 (e.g. ``P``, ``T``, ``D``), may be empty.
        version: MSH-12 as written (may carry components), may be empty.
        accept_ack_type: MSH-15 (``AL``, ``NE``, ``ER``, ``SU`` or empty).
        application_ack_type: MSH-16 (same values, or empty).
    """

    delimiters: Delimiters
    sending_application: str
    sending_facility: str
    receiving_application: str
    receiving_facility: str
    date_time: str
    message_type: MessageType
    control_id: str
    processing_id: str
    version: str
    accept_ack_type: str
    application_ack_type: str

    @property
    def field_separator(self) -> str:
        """MSH-1."""
        return self.delimiters.field

    @property
    def encoding_characters(self) -> str:
        """MSH-2 as written (4 or 5 characters)."""
        return self.delimiters.encoding_characters

    @property
    def version_id(self) -> str:
        """The first component of MSH-12, e.g. ``2.5.1``."""
        return self.version.split(self.delimiters.component, 1)[0].strip()


def _field(fields: list[str], number: int) -> str:
    """MSH-``number`` from the segment split on the field separator ('' when absent)."""
    index = number - 1
    return fields[index] if index < len(fields) else ""


def parse_header(payload: bytes) -> Header:
    """Parse the MSH segment at the start of ``payload``.

    A UTF-8 byte-order mark and leading whitespace / CR / LF / NUL are skipped. Segments may be
    separated by CR, LF or CRLF. Only the first segment is read.

    Args:
        payload: the message bytes, unframed.

    Returns:
        A :class:`Header`.

    Raises:
        HeaderError: with a table 0357 code: 100 when the first segment is not MSH (batch
            envelopes starting with FHS/BHS included); 101 when MSH-1, MSH-2, MSH-9 (or its
            message code) or MSH-10 is missing; 102 when MSH-1/MSH-2 are not usable delimiters.
    """
    first = first_segment_of(payload)
    if not first:
        raise HeaderError(100, "the message is empty")
    if first.startswith(("FHS", "BHS")):
        raise HeaderError(100, "batch envelopes (FHS/BHS) are not accepted; send one message")
    delimiters = read_delimiters(first)
    fields = first.split(delimiters.field)
    # fields[0] is "MSH" and fields[1] is MSH-2: MSH-n is fields[n - 1] for n >= 2.
    raw_type = _field(fields, 9).split(delimiters.repetition, 1)[0]
    if not raw_type.strip():
        raise HeaderError(101, "MSH-9 (message type) is missing")
    parts = [*raw_type.split(delimiters.component), "", ""]
    code, trigger, structure = (part.strip() for part in parts[:3])
    if not code:
        raise HeaderError(101, "MSH-9.1 (message code) is missing")
    control_id = _field(fields, 10)
    if not control_id.strip():
        raise HeaderError(101, "MSH-10 (message control ID) is missing")
    return Header(
        delimiters=delimiters,
        sending_application=_field(fields, 3),
        sending_facility=_field(fields, 4),
        receiving_application=_field(fields, 5),
        receiving_facility=_field(fields, 6),
        date_time=_field(fields, 7),
        message_type=MessageType(raw=raw_type, code=code, trigger=trigger, structure=structure),
        control_id=control_id,
        processing_id=_field(fields, 11),
        version=_field(fields, 12),
        accept_ack_type=_field(fields, 15).strip().upper(),
        application_ack_type=_field(fields, 16).strip().upper(),
    )


def second_header(payload: bytes, delimiters: Delimiters) -> int | None:
    """The byte offset in ``payload`` of an MSH segment after its first one, or None.

    A message has exactly one MSH segment, and an MLLP block carries exactly one message (HL7
    v2.x chapter 2, "Message construction rules"; Appendix C, MLLP): a second MSH at the start
    of a segment (after CR or LF) is a second message in the same frame, which a receiver
    would otherwise take for part of the first. Several messages travel in a batch
    (FHS/BHS), never back to back in one frame. Linear in ``len(payload)``.

    Args:
        payload: the message bytes, unframed, whose MSH ``delimiters`` were read.
        delimiters: the message's own delimiters (the second MSH is found by the same field
            separator).
    """
    marker = b"MSH" + delimiters.field.encode("latin-1")
    first = payload.find(marker)
    if first < 0:
        return None
    found = [
        at
        for at in (
            payload.find(b"\r" + marker, first + 1),
            payload.find(b"\n" + marker, first + 1),
        )
        if at >= 0
    ]
    return min(found) + 1 if found else None
