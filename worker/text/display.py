"""Showing text that came from outside: control characters escaped, so it can never forge a line.

Text from peers and messages (MSA-3 and ERR text with their escapes decoded, HTTP reason phrases,
socket errors, MSH fields) is kept in the database exactly as received. Wherever it is shown (the
queue listings, ``show``, JSON output, log lines, the Destination's status) it goes through
:func:`printable` first: a CR or LF in it can then neither end a line of a listing nor start a log
line that looks like one of ours.
"""

from __future__ import annotations

import logging
from typing import Any

_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}
#: Unicode bidirectional controls, which can make a line read differently from its bytes.
_BIDI = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))


def _unsafe(ch: str) -> bool:
    import unicodedata  # on first use: a worker that logs nothing unusual never loads its table

    return unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\r``, ``\\n``, ``\\t``, ``\\xNN``,
    ``\\uNNNN``): C0 and C1 controls, DEL, the Unicode line and paragraph separators and the
    bidirectional controls. Everything else, backslashes included, is left as it is."""
    if text.isprintable() and not any(ch in _BIDI for ch in text):
        return text
    return "".join(_escape(ch) if _unsafe(ch) else ch for ch in text)


def printable_values(value: Any) -> Any:
    """``value`` (a JSON-like structure) with :func:`printable` applied to every string in it."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {key: printable_values(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [printable_values(item) for item in value]
    return value


class PrintableFilter(logging.Filter):
    """A handler filter that renders each record's message with :func:`printable`.

    The message is formatted (``msg % args``) first and the result escaped, so whatever an
    argument carries stays on the record's own line. Tracebacks are left alone.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Escape the record's rendered message in place; always keep the record."""
        message = record.getMessage()
        safe = printable(message)
        if safe is not message or record.args:
            record.msg, record.args = safe, None
        return True


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain text table, columns padded to their widest cell; every cell is made
    :func:`printable` first."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)
