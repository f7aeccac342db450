"""HL7 v2 delimiters: the encoding characters of MSH-1/MSH-2, segment splitting and escaping.

Source: HL7 v2.x chapter 2, "Message delimiters" and "Use of escape sequences in text fields".
A message declares its own delimiters: MSH-1 is the field separator (the character right after
``MSH``) and MSH-2 holds, in order, the component, repetition, escape and subcomponent
characters, plus from v2.7 on an optional fifth truncation character. Nothing here assumes the
defaults ``|^~\\&``.

All functions work on ``str`` obtained by decoding the payload as latin-1, which maps every byte
to one character and back (``s.encode("latin-1")`` restores the exact bytes). Delimiters are
ASCII, and no byte of a UTF-8 multi-byte character is ASCII, so splitting such text is safe.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from inturn.worker.hl7.errors import HeaderError

#: The segment terminator HL7 requires (chapter 2). LF and CRLF are tolerated on input.
SEGMENT_TERMINATOR = "\r"

_UTF8_BOM = b"\xef\xbb\xbf"
_PREAMBLE = b" \t\r\n\x00\x0c"
_SEGMENT_SPLIT = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Delimiters:
    """The delimiters of one message.

    Attributes:
        field: MSH-1, the field separator (default ``|``).
        component, repetition, escape, subcomponent: the four characters of MSH-2, in that
            order (defaults ``^ ~ \\ &``).
        truncation: the optional fifth MSH-2 character (v2.7+, default ``#``), or None.
    """

    field: str = "|"
    component: str = "^"
    repetition: str = "~"
    escape: str = "\\"
    subcomponent: str = "&"
    truncation: str | None = None

    @property
    def encoding_characters(self) -> str:
        """MSH-2 exactly as it is written: 4 characters, or 5 with the truncation character."""
        base = self.component + self.repetition + self.escape + self.subcomponent
        return base + (self.truncation or "")

    def escape_text(self, text: str) -> str:
        """Escape ``text`` for use as a field value (chapter 2 escape sequences).

        Every delimiter becomes its escape sequence (``\\F\\ \\S\\ \\R\\ \\E\\ \\T\\ \\P\\``)
        and CR / LF become ``\\X0D\\`` / ``\\X0A\\``, so the result can never break the
        message structure.
        """
        return text.translate(_escape_table(self))

    def unescape_text(self, text: str) -> str:
        """Undo the delimiter escapes ``\\F\\ \\S\\ \\R\\ \\E\\ \\T\\ \\P\\`` and ``\\Xhh..\\``.

        Other escape sequences (formatting such as ``\\.br\\``, ``\\H\\``, character-set
        switches) are left as written. Never raises.
        """
        e = self.escape
        if e not in text:
            return text
        simple = {
            "F": self.field,
            "S": self.component,
            "R": self.repetition,
            "E": self.escape,
            "T": self.subcomponent,
        }
        if self.truncation is not None:
            simple["P"] = self.truncation
        out: list[str] = []
        i = 0
        size = len(text)
        while i < size:
            start = text.find(e, i)
            if start < 0:  # no escape left: the rest in one piece (linear, not per character)
                out.append(text[i:])
                break
            if start > i:
                out.append(text[i:start])
            i = start
            end = text.find(e, i + 1)
            if end < 0:
                out.append(text[i:])
                break
            body = text[i + 1 : end]
            if body in simple:
                out.append(simple[body])
            elif _is_hex_escape(body):
                out.append(bytes.fromhex(body[1:]).decode("latin-1"))
            else:
                out.append(text[i : end + 1])
            i = end + 1
        return "".join(out)


def _is_hex_escape(body: str) -> bool:
    digits = body[1:]
    return (
        body[:1] == "X"
        and len(digits) >= 2
        and len(digits) % 2 == 0
        and all(c in "0123456789abcdefABCDEF" for c in digits)
    )


#: The defaults ``|^~\\&`` used when a message's own delimiters cannot be read.
DEFAULT_DELIMITERS = Delimiters()


def strip_preamble(payload: bytes) -> bytes:
    """Drop a UTF-8 byte-order mark and leading whitespace, CR, LF, NUL and form feeds.

    Only for reading: the stored payload itself is never changed.
    """
    data = payload.lstrip(_PREAMBLE)
    while data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :].lstrip(_PREAMBLE)
    return data


def split_segments(text: str) -> list[str]:
    """Split message text into segments on CR, LF or CRLF, dropping empty segments."""
    return [segment for segment in _SEGMENT_SPLIT.split(text) if segment]


def first_segment(text: str) -> str:
    """The text before the first CR or LF ('' for empty text)."""
    return _SEGMENT_SPLIT.split(text, maxsplit=1)[0]


def first_segment_of(payload: bytes) -> str:
    """The first segment of ``payload`` as text (preamble skipped, latin-1), decoding only that
    segment: reading a header costs the header's size, not the message's."""
    data = strip_preamble(payload)
    # An LF is looked for only before the first CR: a CR-terminated message is not scanned
    # to its end for an LF that cannot end its first segment.
    cr = data.find(b"\r")
    lf = data.find(b"\n", 0, cr) if cr >= 0 else data.find(b"\n")
    end = lf if lf >= 0 else cr
    return data[:end].decode("latin-1") if end >= 0 else data.decode("latin-1")


def _usable_delimiter(ch: str) -> bool:
    code = ord(ch)
    return not (ch.isalnum() or ch.isspace() or code < 0x20 or code == 0x7F)


def read_delimiters(msh: str) -> Delimiters:
    """Read MSH-1 and MSH-2 from the text of an MSH segment.

    Args:
        msh: one segment starting with ``MSH`` (no segment terminator needed).

    Returns:
        The message's :class:`Delimiters`.

    Raises:
        HeaderError: 100 when ``msh`` does not start with ``MSH``; 101 when MSH-1 or MSH-2
            is missing; 102 when the field separator is a letter, digit, whitespace or control
            character, or MSH-2 is not 4 or 5 distinct usable characters.
    """
    if not msh.startswith("MSH"):
        raise HeaderError(100, "the message does not start with an MSH segment")
    if len(msh) < 4:
        raise HeaderError(101, "MSH-1 (field separator) is missing")
    field = msh[3]
    end = msh.find(field, 4)
    encoding = msh[4:] if end < 0 else msh[4:end]
    return _delimiters(field, encoding)


@functools.lru_cache(maxsize=64)
def _delimiters(field: str, encoding: str) -> Delimiters:
    """MSH-1 ``field`` and MSH-2 ``encoding`` checked, as :class:`Delimiters` (most messages
    share a handful of pairs: each is checked once; at most 64 are remembered).

    Raises:
        HeaderError: as :func:`read_delimiters` (a refusal is not remembered).
    """
    if not _usable_delimiter(field):
        raise HeaderError(102, "MSH-1 (field separator) is not a usable separator")
    if not encoding:
        raise HeaderError(101, "MSH-2 (encoding characters) is missing")
    if len(encoding) not in (4, 5):
        raise HeaderError(102, "MSH-2 (encoding characters) must be 4 or 5 characters")
    if len(set(encoding)) != len(encoding) or not all(map(_usable_delimiter, encoding)):
        raise HeaderError(102, "MSH-2 (encoding characters) holds unusable characters")
    return Delimiters(
        field=field,
        component=encoding[0],
        repetition=encoding[1],
        escape=encoding[2],
        subcomponent=encoding[3],
        truncation=encoding[4] if len(encoding) == 5 else None,
    )


def delimiters_of(payload: bytes) -> Delimiters:
    """The payload's delimiters from its first segment, or :data:`DEFAULT_DELIMITERS`.

    Never raises: for lenient readers (PID search, rejects) that must work on any bytes.
    """
    try:
        return read_delimiters(first_segment_of(payload))
    except HeaderError:
        return DEFAULT_DELIMITERS


@functools.lru_cache(maxsize=64)
def _escape_table(d: Delimiters) -> dict[int, str]:
    """:meth:`Delimiters.escape_text`'s table for ``str.translate``: each delimiter, CR and LF
    to its escape sequence (a later key wins where two are the same character)."""
    e = d.escape
    table = {
        d.escape: f"{e}E{e}",
        d.field: f"{e}F{e}",
        d.component: f"{e}S{e}",
        d.repetition: f"{e}R{e}",
        d.subcomponent: f"{e}T{e}",
        "\r": f"{e}X0D{e}",
        "\n": f"{e}X0A{e}",
    }
    if d.truncation is not None:
        table[d.truncation] = f"{e}P{e}"
    return {ord(ch): seq for ch, seq in table.items()}
