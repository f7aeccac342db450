"""Human durations: parsed from ``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w``; ages shown as
``45s``, ``12m``, ``3h05m``, ``2d04h``."""

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


def format_age(seconds: float) -> str:
    """A short age for listings: ``45s`` under two minutes, ``12m`` under two hours, ``3h05m``
    under two days, else ``2d04h``."""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
