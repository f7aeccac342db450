"""HL7 table 0357 (message error condition codes) and the errors the pure HL7 code raises.

Table 0357 is defined in HL7 v2.x chapter 2 (ERR-3, and MSA-6 before v2.5). The codes are used
both in the exceptions raised here and in the ERR segment of a negative acknowledgement.
"""

from __future__ import annotations

from enum import IntEnum

from inturn.worker.errors import Invalid


class ErrorCode(IntEnum):
    """HL7 table 0357 message error condition codes (HL7 v2.x chapter 2)."""

    ACCEPTED = 0
    SEGMENT_SEQUENCE_ERROR = 100
    REQUIRED_FIELD_MISSING = 101
    DATA_TYPE_ERROR = 102
    TABLE_VALUE_NOT_FOUND = 103
    VALUE_TOO_LONG = 104
    UNSUPPORTED_MESSAGE_TYPE = 200
    UNSUPPORTED_EVENT_CODE = 201
    UNSUPPORTED_PROCESSING_ID = 202
    UNSUPPORTED_VERSION_ID = 203
    UNKNOWN_KEY_IDENTIFIER = 204
    DUPLICATE_KEY_IDENTIFIER = 205
    APPLICATION_RECORD_LOCKED = 206
    APPLICATION_INTERNAL_ERROR = 207


#: The table's display text for each code, as written in ERR-3.2.
ERROR_TEXT: dict[int, str] = {
    0: "Message accepted",
    100: "Segment sequence error",
    101: "Required field missing",
    102: "Data type error",
    103: "Table value not found",
    104: "Value too long",
    200: "Unsupported message type",
    201: "Unsupported event code",
    202: "Unsupported processing id",
    203: "Unsupported version id",
    204: "Unknown key identifier",
    205: "Duplicate key identifier",
    206: "Application record locked",
    207: "Application internal error",
}


def error_text(code: int) -> str:
    """Return the table 0357 text for ``code``; unknown codes give ``"Error <code>"``."""
    return ERROR_TEXT.get(code, f"Error {code}")


class HL7Error(Invalid):
    """Base of the errors raised by the pure HL7 code for input it cannot use."""


class HeaderError(HL7Error):
    """The MSH segment of a message is missing or unusable.

    Attributes:
        code: a table 0357 code (100 no MSH first, 101 required field missing,
            102 bad delimiters / encoding characters), suitable for ERR-3 of the reject.
        text: a short description naming the field; it never contains message content.
    """

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {error_text(code)}: {text}")
        self.code = code
        self.text = text


class AckParseError(HL7Error):
    """A reply is not a usable acknowledgement (no MSH first, no MSA, or an empty MSA-1)."""
