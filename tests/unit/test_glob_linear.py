"""Field and message-type patterns: matched by RE2 in time linear in the value (no backtracking),
with the same answers as a plain glob, and exclusions that fail closed past the bounds of what a
filter reads (issue 41, part 3)."""

from __future__ import annotations

import fnmatch
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inturn.worker.hl7.filter import (
    MAX_VALUE_CHARS,
    MAX_VALUES_PER_REFERENCE,
    FieldCondition,
    FieldRef,
    MessageFields,
)
from inturn.worker.hl7.types import compile_any, compile_pattern, glob_regex

HEADER = b"MSH|^~\\&|LAB|NORTH|LIS|NORTH|20260101||ORU^R01|C1|P|2.5.1\r"


def reference(pattern: str, text: str) -> bool:
    """A glob by the standard library's translation (backtracking, fine for short inputs)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="ab*?.^\\(", max_size=12),
    st.text(alphabet="ab.^\\(\n", max_size=16),
)
def test_same_answers_as_a_backtracking_glob(pattern: str, text: str) -> None:
    assert bool(compile_pattern(pattern).fullmatch(text)) == reference(pattern, text)


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("*a*a*a*a*b", "a" * 280, False),
        ("*a*a*a*a*a*a*a*a*b", "a" * 1024, False),
        ("*a*a*a*a*a*a*a*a*b", "a" * 1023 + "b", True),
        ("?" * 199, "x" * 199, True),
        ("*" + "?*" * 99, "y" * 1024, True),
        ("(a|b)*", "(a|b)zz", True),
        ("[x]", "x", False),
    ],
)
def test_hostile_patterns_answer_correctly(pattern: str, text: str, expected: bool) -> None:
    """Patterns that make a backtracking engine take seconds (the reported 10.3 s for
    ``*a*a*a*a*b`` over 280 characters) are answered right; bench/filters.py times them."""
    assert bool(compile_pattern(pattern).fullmatch(text)) is expected


def test_regex_metacharacters_are_literals() -> None:
    assert glob_regex("a.b*") == "(?s:a\\.b.*)"
    assert glob_regex("a***b") == "(?s:a.*b)"
    assert not compile_pattern("a.b").fullmatch("axb")


def test_many_patterns_are_one_matcher() -> None:
    matcher = compile_any(tuple(f"*{i:03d}" for i in range(64)))
    assert matcher.fullmatch("code-063")
    assert not matcher.fullmatch("code-064")
    with pytest.raises(ValueError):
        compile_any(())


def test_fnmatch_agrees_on_plain_globs() -> None:
    for pattern in ("ADT^A0?", "ORU*", "*^R01"):
        for text in ("ADT^A01", "ADT^A10", "ORU^R01", "ORM^O01"):
            assert bool(compile_pattern(pattern).fullmatch(text)) == fnmatch.fnmatchcase(
                text, pattern
            )


def _condition(op: str, *values: str, field: str = "OBX-3") -> FieldCondition:
    return FieldCondition(field, FieldRef.parse(field), op, values)  # type: ignore[arg-type]


def _many_obx(count: int, last: str) -> bytes:
    body = b"".join(b"OBX|%d|NM|C%d\r" % (i, i) for i in range(count))
    return HEADER + body + b"OBX|%d|NM|%s\r" % (count, last.encode())


@pytest.mark.parametrize("op", ["NotIn", "NotMatches"])
def test_an_exclusion_past_the_value_cap_excludes(op: str) -> None:
    """The excluded code sits after MAX_VALUES_PER_REFERENCE others: it is never read, so the
    exclusion does not hold (the destination does not take the message)."""
    message = MessageFields(_many_obx(MAX_VALUES_PER_REFERENCE + 5, "SECRET"))
    assert not message.complete(FieldRef.parse("OBX-3"))
    assert not _condition(op, "SECRET").holds(message)
    # and an unrelated value does not change that: what is unread may be anything
    assert not _condition(op, "NOPE").holds(message)


@pytest.mark.parametrize("op", ["NotIn", "NotMatches"])
def test_an_exclusion_under_the_cap_still_decides(op: str) -> None:
    message = MessageFields(_many_obx(10, "OTHER"))
    assert message.complete(FieldRef.parse("OBX-3"))
    assert _condition(op, "SECRET").holds(message)
    assert not _condition(op, "OTHER").holds(message)


def test_exactly_the_cap_is_complete() -> None:
    message = MessageFields(_many_obx(MAX_VALUES_PER_REFERENCE - 1, "LAST"))
    ref = FieldRef.parse("OBX-3")
    assert len(message.values(ref)) == MAX_VALUES_PER_REFERENCE
    assert message.complete(ref)
    assert _condition("NotIn", "ELSE").holds(message)


def test_a_value_cut_at_the_character_cap_fails_an_exclusion_closed() -> None:
    """The excluding suffix lies past MAX_VALUE_CHARS: NotMatches '*SECRET' cannot see it."""
    long_value = "x" * (MAX_VALUE_CHARS + 10) + "SECRET"
    message = MessageFields(HEADER + f"OBX|1|NM|{long_value}\r".encode())
    assert not message.complete(FieldRef.parse("OBX-3"))
    assert not _condition("NotMatches", "*SECRET").holds(message)
    # an inclusion is decided on what was read
    assert _condition("Matches", "xxx*").holds(message)
    assert not _condition("Matches", "*SECRET").holds(message)


def test_a_message_without_the_field_still_passes_an_exclusion() -> None:
    message = MessageFields(HEADER + b"PID|1||123\r")
    assert _condition("NotIn", "A").holds(message)
    assert _condition("NotMatches", "*").holds(message)


def test_the_matching_budget_fails_closed_and_is_shared_by_the_message() -> None:
    """A message built to be expensive (1,000 long values against 64 patterns): once its budget
    is spent, pattern conditions do not hold, whichever way they point; In/NotIn (set lookups)
    still decide."""
    from inturn.worker.hl7.filter import MAX_MATCH_BUDGET

    body = b"".join(
        b"OBX|%d|NM|%05d%s\r" % (i, i, b"a" * (MAX_VALUE_CHARS - 5))
        for i in range(MAX_VALUES_PER_REFERENCE)
    )
    message = MessageFields(HEADER + body)
    patterns = tuple("*" + "a*" * 50 + f"{i:03d}" for i in range(64))
    assert 64 * MAX_VALUES_PER_REFERENCE * MAX_VALUE_CHARS > MAX_MATCH_BUDGET
    assert not _condition("NotMatches", *patterns).holds(message)
    assert not _condition("Matches", "*").holds(message)  # the budget is gone for the message
    assert _condition("NotIn", "x").holds(message)
    assert _condition("In", "00000" + "a" * (MAX_VALUE_CHARS - 5)).holds(message)


def test_a_cheap_message_keeps_its_answers() -> None:
    message = MessageFields(_many_obx(3, "GLU"))
    assert _condition("Matches", "G*").holds(message)
    assert _condition("NotMatches", "X*", "Y?").holds(message)


def test_a_message_is_cut_the_same_across_slices() -> None:
    """Segments are cut a slice at a time; a segment, a CRLF pair or a value sitting on a slice's
    edge reads as it does when the message is cut whole."""
    from inturn.worker.hl7 import filter as field_filter

    for terminator in (b"\r", b"\n", b"\r\n"):
        body = b"".join(
            b"OBX|%d|NM|V%06d%s" % (i, i, terminator) + b"NTE|1||" + b"n" * (i % 977) + terminator
            for i in range(3000)
        )
        message = HEADER.replace(b"\r", terminator) + body
        assert len(message) > 3 * field_filter._SLICE_BYTES
        fields = MessageFields(message)
        values = fields.values(FieldRef.parse("OBX-3"))
        assert values[: field_filter.MAX_VALUES_PER_REFERENCE] == tuple(
            f"V{i:06d}" for i in range(field_filter.MAX_VALUES_PER_REFERENCE)
        )
        segments = fields._all()
        assert len(segments["OBX"]) == 3000 and len(segments["NTE"]) == 3000
        assert all(s.startswith("OBX|") for s in segments["OBX"])
        assert set(segments) == {"MSH", "OBX", "NTE"}


def test_routing_that_reads_fields_leaves_the_event_loop_free() -> None:
    """A channel whose destinations read fields is routed in a worker thread: another task of
    the loop (another channel's connection) runs while a 16 MiB message is read; a channel that
    filters on types only is routed inline (no thread for a few pattern tests)."""
    import asyncio

    from inturn.worker.hl7.filter import conditions_of
    from inturn.worker.ingest.routing import Route, RouteTable, route_message

    patterns = ["*" + "a*" * 60 + f"{i:03d}" for i in range(64)]
    nodes = [{"field": f"OBX-{f}", "operator": "NotMatches", "values": patterns} for f in (3, 5)]
    table = RouteTable(
        [
            Route("ns/fields", "lab", (), field_conditions=conditions_of(nodes)),
            Route("ns/types", "adt", ("ADT^*",)),
        ]
    )
    assert table.reads_fields("lab") and not table.reads_fields("adt")
    seg = b"OBX|1|NM|" + b"a" * 1000 + b"|" + b"a" * 1000 + b"\r"
    message = HEADER + seg * (16 * 1024 * 1024 // len(seg))

    async def ticks_while_routing(channel: str) -> tuple[int, tuple[str, ...]]:
        ticks = 0
        stop = asyncio.Event()

        async def other_channel() -> None:
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0)
                ticks += 1

        task = asyncio.create_task(other_channel())
        await asyncio.sleep(0)
        before = ticks
        decision = await route_message(table, channel, "ORU", "R01", message)
        during = ticks - before
        stop.set()
        await task
        return during, decision.destinations

    during, chosen = asyncio.run(ticks_while_routing("lab"))
    assert chosen == ("ns/fields",)
    assert during > 0
    during, chosen = asyncio.run(ticks_while_routing("adt"))
    assert chosen == () and during == 0
