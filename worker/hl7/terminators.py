"""Segment terminators: which one a message uses, and the one rule for normalising them.

Source: HL7 v2.x chapter 2, "Message construction rules": every segment ends with a carriage
return (0x0D), and a CR is never data (data carries ``\\X0D\\`` or ``\\.br\\`` instead). Files
written on other systems often end their segments with LF or CRLF, which receivers that split
on CR alone cannot read.

The rule, used at the door (what is stored), by every sender (what is sent) and by
``inturn queue payload`` (what is printed), so that all three agree:

* the terminator of a message is the one that ends its first segment (MSH);
* a message terminated by CR is left byte for byte, LF bytes inside fields included;
* a message terminated by CRLF has each CRLF pair turned into CR (a lone LF or CR stays);
* a message terminated by LF alone has each CRLF and each LF turned into CR;
* a message with no terminator at all (one segment) is left as it is.

The rule is idempotent: applying it to its own result changes nothing.
"""

from __future__ import annotations

from typing import Literal

Terminator = Literal["CR", "CRLF", "LF"]

_CR = 0x0D
_LF = 0x0A


def terminator(payload: bytes) -> Terminator | None:
    """The terminator that ends the first segment of ``payload``, or None when there is none.

    Leading CR / LF bytes (blank lines before MSH) are skipped.
    """
    start = 0
    while start < len(payload) and payload[start] in (_CR, _LF):
        start += 1
    cr = payload.find(b"\r", start)
    # an LF matters only before the first CR or right after it (CRLF): no scan to the end
    lf = payload.find(b"\n", start, cr + 2) if cr >= 0 else payload.find(b"\n", start)
    if cr < 0 and lf < 0:
        return None
    if cr >= 0 and (lf < 0 or cr < lf):
        return "CRLF" if lf == cr + 1 else "CR"
    return "LF"


def normalise_terminators(payload: bytes) -> bytes:
    """Return ``payload`` with its segment terminators made CR by the module's rule.

    Only terminator bytes change; a message already terminated by CR is returned unchanged
    (the same bytes, byte for byte).
    """
    kind = terminator(payload)
    if kind == "CRLF":
        return payload.replace(b"\r\n", b"\r")
    if kind == "LF":
        return payload.replace(b"\r\n", b"\r").replace(b"\n", b"\r")
    return payload
