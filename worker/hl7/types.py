"""Message-type patterns on ``MSH-9.1^MSH-9.2``, as destination filters and ``spec.replies`` use
them (rules in :mod:`inturn.worker.ingest.routing`'s docstring).

Patterns are matched in time linear in the text (RE2, no backtracking: ``*a*a*a*b`` over a
long value costs what ``*b`` does), so that no pattern a Destination declares can stall ingest.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import re2  # type: ignore[import-untyped]

__all__ = ["Matcher", "compile_any", "compile_pattern", "glob_regex", "type_matches"]


class Matcher(Protocol):
    """A compiled pattern (or set of patterns): ``fullmatch(text)`` is truthy when the whole of
    ``text`` matches."""

    def fullmatch(self, text: str) -> object: ...


def glob_regex(pattern: str) -> str:
    """The regular expression (RE2 syntax, whole-text) of a glob: ``*`` any run, ``?`` one
    character, every other character itself. Runs of ``*`` are folded into one."""
    parts: list[str] = []
    for ch in pattern:
        if ch == "*":
            if not parts or parts[-1] != ".*":
                parts.append(".*")
        elif ch == "?":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return "(?s:" + "".join(parts) + ")"


def _options() -> object:
    options = re2.Options()
    # A pattern is at most 199 characters, its DFA at most one state per character: far under
    # RE2's default memory budget (8 MiB), which bounds the DFA whatever the text.
    options.max_mem = 8 << 20
    return options


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Matcher:
    """Compile a message-type or field pattern (``*`` any run, ``?`` one character, rest
    literal) for RE2: matching takes time linear in the text, never backtracking.

    Returns a matcher whose ``fullmatch`` tests the whole text.
    """
    return _compile(pattern)


class _AnyOf:
    """Several compiled patterns: a text matches when it matches one of them. Each pattern is
    its own RE2 program: a glob's DFA has at most one state per pattern character, while one
    alternation of many globs can need the product of theirs (RE2 then runs out of its DFA
    budget and falls back to a slower NFA)."""

    __slots__ = ("_compiled",)

    def __init__(self, compiled: tuple[Matcher, ...]) -> None:
        self._compiled = compiled

    def fullmatch(self, text: str) -> bool:
        return any(c.fullmatch(text) for c in self._compiled)


@lru_cache(maxsize=1024)
def compile_any(patterns: tuple[str, ...]) -> Matcher:
    """One matcher for several patterns: ``fullmatch`` is truthy when the text matches any of
    them (each pattern a linear pass over the text).

    Raises:
        ValueError: no patterns.
    """
    if not patterns:
        raise ValueError("no patterns")
    unique = tuple(dict.fromkeys(patterns))
    compiled = tuple(_compile(p) for p in unique)
    return compiled[0] if len(compiled) == 1 else _AnyOf(compiled)


def _compile(pattern: str) -> Matcher:
    compiled: Matcher = re2.compile(glob_regex(pattern), _options())
    return compiled


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
