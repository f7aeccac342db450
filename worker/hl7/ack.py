"""Build and read HL7 v2 acknowledgements (ACK messages with MSA and ERR).

Source: HL7 v2.x chapter 2, "Acknowledgment messages", "MSA - message acknowledgment segment",
"ERR - error segment", tables 0008 (acknowledgment code), 0155 (accept/application ack
conditions) and 0357 (error condition codes).

Acknowledgment codes (table 0008) by mode:

==================  =================  =================
meaning             original mode      enhanced mode
==================  =================  =================
accepted            AA                 CA
error               AE                 CE
rejected            AR                 CR
==================  =================  =================

A message asks for enhanced mode by filling MSH-15 (accept acknowledgment type) or MSH-16
(application acknowledgment type); otherwise original mode applies.

The ACK built here has this layout (segments end with CR)::

    MSH|^~\\&|<MSH-5>|<MSH-6>|<MSH-3>|<MSH-4>|<now>||ACK^<trigger>^ACK|<new id>|<MSH-11>|<MSH-12>
    MSA|<code>|<MSH-10>[|<text>]
    ERR|<ERR-1 only for v2.1-2.4>||<code>^<text>^HL70357|E||||<user message>

MSH-1/MSH-2 echo the message's own delimiters. The ERR segment appears only when an error is
given; ERR-3 (code^text^HL70357), ERR-4 (severity E) and ERR-8 (user message) are always filled,
and for messages declaring v2.1 to v2.4 ERR-1 repeats the code as an ELD
(``^^^code&text&HL70357``) because those versions have no ERR-3.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from inturn.worker.hl7.delimiters import (
    DEFAULT_DELIMITERS,
    Delimiters,
    first_segment_of,
    read_delimiters,
    split_segments,
    strip_preamble,
)
from inturn.worker.hl7.errors import AckParseError, HeaderError, error_text
from inturn.worker.hl7.header import Header

__all__ = [
    "ACCEPT_CODES",
    "ACK_CODES",
    "Ack",
    "AckErrorDetail",
    "AckParseError",
    "ack_code",
    "ack_mode",
    "build_ack",
    "build_reject",
    "new_control_id",
    "parse_ack",
]

#: Every MSA-1 value of table 0008.
ACK_CODES = frozenset({"AA", "AE", "AR", "CA", "CE", "CR"})
#: MSA-1 values that mean the receiver took the message.
ACCEPT_CODES = frozenset({"AA", "CA"})

#: MSH-12 written when the message did not say (or could not be read).
DEFAULT_VERSION = "2.5.1"
#: MSH-11 written when the message did not say.
DEFAULT_PROCESSING_ID = "P"

AckMode = Literal["original", "enhanced"]
AckKind = Literal["accept", "error", "reject"]

_CODES: dict[AckMode, dict[AckKind, str]] = {
    "original": {"accept": "AA", "error": "AE", "reject": "AR"},
    "enhanced": {"accept": "CA", "error": "CE", "reject": "CR"},
}


@dataclass(frozen=True)
class AckErrorDetail:
    """What goes into the ERR segment of a negative acknowledgement.

    Attributes:
        code: a table 0357 code (see :class:`inturn.worker.hl7.errors.ErrorCode`).
        text: ERR-3.2; defaults to the table's text for ``code``.
        user_message: ERR-8, free text for a person; omitted when None.
        location: ERR-2, e.g. ``MSH^1^10`` (segment^sequence^field), written as given.
    """

    code: int
    text: str | None = None
    user_message: str | None = None
    location: str | None = None


@dataclass(frozen=True)
class Ack:
    """A parsed acknowledgement.

    Attributes:
        code: MSA-1, upper-cased (e.g. ``AA``); may be a value outside table 0008.
        control_id: MSA-2, the MSH-10 of the message acknowledged ('' when absent).
        text: MSA-3 unescaped, or None.
        error_code: ERR-3.1 (or ERR-1.4.1 for v2.4 and earlier), or None.
        error_text: ERR-8, else ERR-3.2, else ERR-1.4.2, unescaped; or None.
    """

    code: str
    control_id: str
    text: str | None = None
    error_code: str | None = None
    error_text: str | None = None

    @property
    def accepted(self) -> bool:
        """True for AA and CA."""
        return self.code in ACCEPT_CODES


def ack_mode(header: Header) -> AckMode:
    """``enhanced`` when MSH-15 or MSH-16 is filled, else ``original`` (chapter 2)."""
    return "enhanced" if header.accept_ack_type or header.application_ack_type else "original"


def ack_code(header: Header, kind: AckKind) -> str:
    """The MSA-1 code for ``kind`` in the message's mode: AA/AE/AR or CA/CE/CR."""
    return _CODES[ack_mode(header)][kind]


def new_control_id() -> str:
    """A new MSH-10 for an ACK: 20 upper-case hex characters, 80 random bits (``os.urandom``;
    the ``uuid`` module is not imported for it, which keeps a worker's resident set smaller)."""
    return os.urandom(10).hex().upper()


def _timestamp(now: datetime | None) -> str:
    moment = now if now is not None else datetime.now(UTC)
    stamp = moment.strftime("%Y%m%d%H%M%S")
    return stamp + moment.strftime("%z") if moment.tzinfo is not None else stamp


def _ascii(text: str) -> str:
    """Our own texts go out as printable ASCII, the HL7 default character set."""
    cleaned = "".join(
        ch if " " <= ch <= "~" else ("?" if ch not in "\r\n\t" else " ") for ch in text
    )
    return cleaned.strip()


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


@dataclass(frozen=True)
class _Echo:
    """The parts of the original MSH an ACK copies (raw field values)."""

    delimiters: Delimiters
    sending_application: str = ""
    sending_facility: str = ""
    receiving_application: str = ""
    receiving_facility: str = ""
    trigger: str = ""
    control_id: str = ""
    processing_id: str = ""
    version: str = ""


#: Longest MSA-2 an acknowledgement echoes, in characters: MSH-10's length (ST, 199) since
#: HL7 v2.7; a longer control ID (refused at the door) is echoed cut to it.
MAX_ECHO_CONTROL_ID = 199
#: Longest MSH-3 to MSH-6 an acknowledgement echoes, in characters: HD's length since v2.7
#: (IS 20 + ST 199 + ID 6 and two separators). Whatever a peer sends, an ACK stays small.
MAX_ECHO_HD = 227


#: C0 controls and DEL, left out of every value an acknowledgement echoes: a peer's 0x0B or
#: 0x1C would frame our ACK wrongly (MLLP has no escaping), a CR or LF would split its segment.
_NO_CONTROLS = {c: None for c in [*range(0x20), 0x7F]}


def _bounded(value: str, limit: int, escape: str) -> str:
    """``value`` without control characters, cut to ``limit`` characters, never inside an
    escape sequence (cut before an escape character left open)."""
    value = value.translate(_NO_CONTROLS)
    if len(value) <= limit:
        return value
    cut = value[:limit]
    if escape and cut.count(escape) % 2:
        cut = cut[: cut.rindex(escape)]
    return cut


def _render(
    echo: _Echo,
    code: str,
    text: str | None,
    error: AckErrorDetail | None,
    control_id: str | None,
    now: datetime | None,
) -> bytes:
    d = echo.delimiters
    fs, cs = d.field, d.component
    if code not in ACK_CODES:
        raise ValueError(f"unknown acknowledgment code {code!r}")
    escape = d.escape
    echo = dataclasses.replace(
        echo,
        sending_application=_bounded(echo.sending_application, MAX_ECHO_HD, escape),
        sending_facility=_bounded(echo.sending_facility, MAX_ECHO_HD, escape),
        receiving_application=_bounded(echo.receiving_application, MAX_ECHO_HD, escape),
        receiving_facility=_bounded(echo.receiving_facility, MAX_ECHO_HD, escape),
        trigger=_bounded(echo.trigger, MAX_ECHO_HD, escape),
        processing_id=_bounded(echo.processing_id, MAX_ECHO_HD, escape),
        version=_bounded(echo.version, MAX_ECHO_HD, escape),
        control_id=_bounded(echo.control_id, MAX_ECHO_CONTROL_ID, escape),
    )
    message_type = f"ACK{cs}{echo.trigger}{cs}ACK" if echo.trigger else "ACK"
    msh = [
        "MSH",
        d.encoding_characters,
        echo.receiving_application,
        echo.receiving_facility,
        echo.sending_application,
        echo.sending_facility,
        _timestamp(now),
        "",
        message_type,
        d.escape_text(_ascii(control_id)) if control_id else new_control_id(),
        echo.processing_id or DEFAULT_PROCESSING_ID,
        echo.version or DEFAULT_VERSION,
    ]
    msa = ["MSA", code, echo.control_id]
    if text:
        msa.append(d.escape_text(_ascii(text)))
    segments = [fs.join(msh), fs.join(msa)]
    if error is not None:
        err_text = d.escape_text(_ascii(error.text or error_text(error.code)))
        cwe = cs.join([str(error.code), err_text, "HL70357"])
        err = ["ERR", "", error.location or "", cwe, "E", "", "", ""]
        if error.user_message:
            err.append(d.escape_text(_ascii(error.user_message)))
        version = _major_minor(echo.version.split(cs, 1)[0].strip() or DEFAULT_VERSION)
        if version is not None and version < (2, 5):
            sub = d.subcomponent
            err[1] = cs * 3 + sub.join([str(error.code), err_text, "HL70357"])
        segments.append(fs.join(err).rstrip(fs))
    return ("\r".join(segments) + "\r").encode("latin-1")


def build_ack(
    header: Header,
    code: str,
    *,
    text: str | None = None,
    error: AckErrorDetail | None = None,
    control_id: str | None = None,
    now: datetime | None = None,
) -> bytes:
    """Build the acknowledgement of the message whose MSH is ``header``.

    Args:
        header: the parsed MSH of the message being acknowledged.
        code: MSA-1, one of AA, AE, AR (original mode) or CA, CE, CR (enhanced mode); see
            :func:`ack_code` to pick it from the message's mode.
        text: MSA-3, a short text (escaped; non-ASCII replaced by ``?``).
        error: the ERR segment; None for no ERR segment.
        control_id: MSH-10 of the ACK itself; default :func:`new_control_id`.
        now: MSH-7; default the current UTC time. A naive datetime is written without offset.

    Returns:
        The ACK bytes, unframed, every segment terminated by CR.

    Raises:
        ValueError: ``code`` is not in table 0008.
    """
    echo = _Echo(
        delimiters=header.delimiters,
        sending_application=header.sending_application,
        sending_facility=header.sending_facility,
        receiving_application=header.receiving_application,
        receiving_facility=header.receiving_facility,
        trigger=header.message_type.trigger,
        control_id=header.control_id,
        processing_id=header.processing_id,
        version=header.version,
    )
    return _render(echo, code, text, error, control_id, now)


def _lenient_echo(payload: bytes) -> _Echo:
    """Whatever of MSH can be read, for a reject of a message that did not parse."""
    first = first_segment_of(payload)
    try:
        delimiters = read_delimiters(first)
    except HeaderError:
        return _Echo(delimiters=DEFAULT_DELIMITERS)
    fields = first.split(delimiters.field)

    def field(number: int) -> str:
        return fields[number - 1] if number - 1 < len(fields) else ""

    trigger_parts = field(9).split(delimiters.repetition, 1)[0].split(delimiters.component)
    return _Echo(
        delimiters=delimiters,
        sending_application=field(3),
        sending_facility=field(4),
        receiving_application=field(5),
        receiving_facility=field(6),
        trigger=trigger_parts[1].strip() if len(trigger_parts) > 1 else "",
        control_id=field(10),
        processing_id=field(11),
        version=field(12),
    )


def build_reject(
    payload: bytes,
    code: str,
    error: AckErrorDetail,
    *,
    text: str | None = None,
    control_id: str | None = None,
    now: datetime | None = None,
) -> bytes:
    """Build a negative acknowledgement for a message whose header may not parse.

    Best effort: when MSH-1/MSH-2 can be read, they are echoed and MSH-3 to MSH-6, MSH-9.2,
    MSH-10, MSH-11 and MSH-12 are taken as far as present; otherwise the defaults ``|^~\\&``
    are used and MSA-2 is empty. Arguments are as for :func:`build_ack`; ``text`` defaults to
    the error's text.

    Raises:
        ValueError: ``code`` is not in table 0008.
    """
    echo = _lenient_echo(payload)
    message = text if text is not None else (error.text or error_text(error.code))
    return _render(echo, code, message, error, control_id, now)


def _component(value: str, d: Delimiters, index: int) -> str:
    parts = value.split(d.component)
    return parts[index] if index < len(parts) else ""


def _text(value: str, d: Delimiters) -> str | None:
    """Unescape a field for people: latin-1 bytes back to UTF-8 where they are UTF-8."""
    cleaned = d.unescape_text(value).encode("latin-1").decode("utf-8", "replace").strip()
    return cleaned or None


def parse_ack(payload: bytes) -> Ack:
    """Read the MSA (and first ERR) of an acknowledgement.

    Tolerates LF / CRLF separators, a missing final CR, a leading BOM or whitespace, and any
    delimiters declared in MSH-1/MSH-2. MSH-9 and MSH-10 of the ACK are not required.

    Args:
        payload: the reply, unframed.

    Returns:
        An :class:`Ack`.

    Raises:
        AckParseError: the reply does not start with a readable MSH, has no MSA segment, or
            MSA-1 is empty.
    """
    text = strip_preamble(payload).decode("latin-1")
    segments = split_segments(text)
    try:
        d = read_delimiters(segments[0] if segments else "")
    except HeaderError as exc:
        raise AckParseError(f"no usable MSH segment: {exc.text}") from None
    msa: list[str] | None = None
    err: list[str] | None = None
    for segment in segments[1:]:
        name = segment[:3]
        if name == "MSA" and msa is None:
            msa = segment.split(d.field)
        elif name == "ERR" and err is None:
            err = segment.split(d.field)
    if msa is None:
        raise AckParseError("the reply has no MSA segment")
    code = (msa[1] if len(msa) > 1 else "").strip().upper()
    if not code:
        raise AckParseError("MSA-1 (acknowledgment code) is empty")
    control_id = msa[2] if len(msa) > 2 else ""
    error_code: str | None = None
    error_message: str | None = None
    if err is not None:
        err3 = err[3].split(d.repetition, 1)[0] if len(err) > 3 else ""
        err1 = err[1].split(d.repetition, 1)[0] if len(err) > 1 else ""
        eld = _component(err1, d, 3).split(d.subcomponent)
        error_code = _component(err3, d, 0).strip() or (eld[0].strip() if eld else "") or None
        error_message = (
            (_text(err[8], d) if len(err) > 8 else None)
            or _text(_component(err3, d, 1), d)
            or (_text(eld[1], d) if len(eld) > 1 else None)
        )
    return Ack(
        code=code,
        control_id=control_id,
        text=_text(msa[3], d) if len(msa) > 3 else None,
        error_code=error_code,
        error_text=error_message,
    )
