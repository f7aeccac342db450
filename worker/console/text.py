"""Payloads shown to a person: split into segments, each made printable.

HTML escaping is the templates' job (Jinja2 autoescape); control characters are made visible
by :func:`inturn.worker.text.display.printable`, as everywhere else stored text is shown.
"""

from __future__ import annotations

import re

from inturn.worker.text.display import printable


def segments(payload: bytes, codec: str = "utf-8") -> list[str]:
    """Split an HL7 v2 message into its segments (HL7 v2.x chapter 2: segments end with CR;
    LF and CRLF are tolerated), each decoded as ``codec`` (UTF-8; a receiver profile's charset
    for a message as sent) with undecodable bytes shown as ``\\xNN`` and control characters
    escaped. Empty segments are dropped."""
    text = payload.decode(codec, errors="backslashreplace")
    parts = re.split(r"\r\n|\r|\n", text)
    return [printable(p) for p in parts if p]
