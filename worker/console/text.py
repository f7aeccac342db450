"""Showing stored text safely: control characters made visible, payloads split into segments.

HTML escaping is the templates' job (Jinja2 autoescape); this module only makes characters that
a browser would swallow or that could disguise text (NUL, ESC, CR, BiDi overrides aside) visible
as ``\\xNN`` escapes, so an error or a segment reads exactly as stored.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """Replace every control character with ``\\xNN`` (``\\`` itself stays as it is)."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def segments(payload: bytes) -> list[str]:
    """Split an HL7 v2 message into its segments (HL7 v2.x chapter 2: segments end with CR;
    LF and CRLF are tolerated), each decoded as UTF-8 with undecodable bytes shown as
    ``\\xNN`` and control characters escaped. Empty segments are dropped."""
    text = payload.decode("utf-8", errors="backslashreplace")
    parts = re.split(r"\r\n|\r|\n", text)
    return [escape_controls(p) for p in parts if p]
