"""Human durations for the command line: ``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w``."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> int:
    """Return ``text`` in whole seconds; a bare number is seconds.

    Raises:
        ValueError: not of the form ``<digits>[s|m|h|d|w]``.
    """
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 90, 45s, 30m, 12h, 7d or 2w")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]
