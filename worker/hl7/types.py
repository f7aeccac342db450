"""Message-type patterns on ``MSH-9.1^MSH-9.2``, as destination filters and ``spec.replies`` use
them (rules in :mod:`inturn.worker.ingest.routing`'s docstring).

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["compile_pattern", "type_matches"]


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a message-type pattern (``*`` any run, ``?`` one character, rest literal).

    Returns a regular expression that must match the whole key (use ``fullmatch``).
    """
    parts = []
    for ch in pattern:
        if ch == "*":
            parts.append(".*")
        elif ch == "?":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts), re.DOTALL)


def type_matches(patterns: Sequence[str], code: str, trigger: str) -> bool:
    """Whether a message of type ``code^trigger`` passes a destination's filter.

    Args:
        patterns: the destination's ``messageTypes``; empty means every type.
        code: MSH-9.1, e.g. ``ADT``.
        trigger: MSH-9.2, e.g. ``A01``, or ``''``.
    """
    if not patterns:
        return True
    keys = (f"{code}^{trigger}",) if trigger else (code, f"{code}^")
    return any(compile_pattern(p).fullmatch(key) for p in patterns for key in keys)
