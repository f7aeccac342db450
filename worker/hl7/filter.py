"""Field conditions of a Destination's filter (``spec.filter.fields``): which messages it takes,
by the values of HL7 fields such as ``MSH-4``, ``PV1-3`` or ``PID-3.4``.

Source: HL7 v2.x chapter 2, "Message construction rules" (segments, fields, repetitions,
components, subcomponents; the delimiters of MSH-1/MSH-2; escape sequences). Field numbers
follow the standard: ``MSH-3`` is the sending application (MSH-1 is the field separator).

A reference is ``SEG-F``, ``SEG-F.C`` or ``SEG-F.C.S``: segment ID, field, and optionally
component and subcomponent (``PID-3.4`` is the assigning authority of a patient identifier).
A component or subcomponent left out means the first one, as HAPI's ``Terser`` reads ``PID-3``
and as ``spec.replies`` reads ``ORC-2``: ``PV1-3`` is the point of care, ``PID-3.4`` the
authority's namespace ID.

The values of a reference in a message are those of every segment of that ID (a message may
carry several OBX or PID segments; MSH is the header, the first segment) and every repetition
of the field, escape sequences undone (``\\F\\``, ``\\S\\``, ``\\T\\``, ``\\R\\``,
``\\E\\``, ``\\Xhh\\``), decoded as UTF-8 (invalid bytes replaced), stripped of surrounding
white space; empty values are not values. A condition:

* ``In``: some value equals one of ``values`` (case-sensitive);
* ``NotIn``: no value equals any of ``values`` (a message without the field passes);
* ``Matches``: some value matches one of the patterns in ``values`` (``*`` any run, ``?`` one
  character, every other character itself, the whole value: the rules of ``messageTypes``);
* ``NotMatches``: no value matches any of them;
* ``Exists``: the field has a value; ``DoesNotExist``: it has none (``values`` not given).

A filter takes a message when its type passes ``messageTypes`` and every condition holds.

Bounds: at most :data:`MAX_VALUES_PER_REFERENCE` values of a reference are read, each of at most
:data:`MAX_VALUE_CHARS` characters; patterns are matched by RE2 in time linear in the value
(:mod:`inturn.worker.hl7.types`), and all the pattern matching of one message shares one budget
(:data:`MAX_MATCH_BUDGET`). What a bound leaves unread never lets a message through an
exclusion: when values were left out or cut, ``NotIn`` and ``NotMatches`` do not hold (the
destination does not take the message); ``In`` and ``Matches`` hold only on a value actually
read; past the budget, pattern conditions not yet decided do not hold.

Pure: bytes in, booleans out; nothing here raises on any message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inturn.worker.hl7.delimiters import (
    Delimiters,
    delimiters_of,
    first_segment_of,
    strip_preamble,
)
from inturn.worker.hl7.types import compile_any

__all__ = [
    "FIELD_REF_PATTERN",
    "OPERATORS",
    "FieldCondition",
    "FieldRef",
    "MessageFields",
    "conditions_of",
    "holds",
]

#: A field reference: segment ID (a capital letter, then two capitals or digits), field number
#: 1..999, then optionally ``.component`` and ``.subcomponent`` (1..999 each).
FIELD_REF_PATTERN = r"^[A-Z][A-Z0-9]{2}-[1-9][0-9]{0,2}(\.[1-9][0-9]{0,2}){0,2}$"
_REF = re.compile(FIELD_REF_PATTERN)

Operator = Literal["In", "NotIn", "Matches", "NotMatches", "Exists", "DoesNotExist"]
#: The operators, in the order the documentation lists them.
OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Matches", "NotMatches", "Exists", "DoesNotExist")
#: Operators that take no ``values``.
VALUELESS: frozenset[str] = frozenset({"Exists", "DoesNotExist"})

#: Most values of one reference read from one message (a bound on what a peer's message can
#: make a filter compute; a message with more occurrences is judged on the first ones).
MAX_VALUES_PER_REFERENCE = 1000
#: Longest field value compared, in characters: a longer one is cut to this before comparing
#: (no identifier, code or facility name comes near it).
MAX_VALUE_CHARS = 1024
#: Pattern matching one message may cost, all conditions of all destinations together, in
#: characters scanned (a value's length per pattern, plus :data:`MATCH_CALL_COST` a call):
#: about 20 ms of CPU on the development machine (bench/filters.py). Past it, the conditions
#: still to decide fail closed (``Matches`` does not hold, ``NotMatches`` does not hold), so a
#: message built to be expensive cannot hold ingest's other channels for long.
MAX_MATCH_BUDGET = 4_000_000
#: What one pattern match costs beyond its characters, in the same units.
MATCH_CALL_COST = 64
#: Bytes of a message cut into segments in one step (:meth:`MessageFields._all`).
_SLICE_BYTES = 256 * 1024
#: A segment terminator (CR or LF), where a slice may end.
_TERMINATOR = re.compile(rb"[\r\n]")


@dataclass(frozen=True)
class FieldRef:
    """Where a value is: ``PID-3.4`` is ``FieldRef("PID", 3, 4, 1)``.

    Attributes:
        segment: the segment ID, e.g. ``PID``.
        field: the field number (1-based; for MSH, MSH-1 is the field separator).
        component: the component number (1 when the reference does not say).
        subcomponent: the subcomponent number (1 when the reference does not say).
    """

    segment: str
    field: int
    component: int = 1
    subcomponent: int = 1

    @classmethod
    def parse(cls, text: str) -> FieldRef:
        """``"PID-3.4"`` -> ``FieldRef("PID", 3, 4, 1)``.

        Raises:
            ValueError: not a reference (:data:`FIELD_REF_PATTERN`), or ``MSH-1``/``MSH-2``
                (the delimiters themselves, which have no components to compare).
        """
        if not _REF.match(text):
            raise ValueError(f"{text!r} is not a field reference such as MSH-4, PV1-3 or PID-3.4")
        segment, rest = text.split("-", 1)
        numbers = [int(n) for n in rest.split(".")]
        if segment == "MSH" and numbers[0] <= 2:
            raise ValueError("MSH-1 and MSH-2 are the delimiters; filters read MSH-3 and later")
        numbers += [1] * (3 - len(numbers))
        return cls(segment, numbers[0], numbers[1], numbers[2])


@dataclass(frozen=True)
class FieldCondition:
    """One item of ``spec.filter.fields``.

    Attributes:
        field: the reference as written (``PID-3.4``).
        ref: the parsed reference.
        operator: one of :data:`OPERATORS`.
        values: the values (``In``/``NotIn``) or patterns (``Matches``/``NotMatches``); empty
            for ``Exists``/``DoesNotExist``.
    """

    field: str
    ref: FieldRef
    operator: Operator
    values: tuple[str, ...] = ()

    def holds(self, message: MessageFields) -> bool:
        """Whether ``message`` passes this condition (rules in the module docstring)."""
        found = message.values(self.ref)
        op = self.operator
        if op == "Exists":
            return bool(found)
        if op == "DoesNotExist":
            return not found
        if op in ("In", "NotIn"):
            wanted = set(self.values)
            hit = any(v in wanted for v in found)
        else:
            matcher = compile_any(self.values)
            hit = False
            for v in found:
                if not message.spend(len(self.values) * (len(v) + MATCH_CALL_COST)):
                    return False  # past the message's matching budget: fail closed
                if matcher.fullmatch(v):
                    hit = True
                    break
        if op in ("In", "Matches"):
            return hit
        # an exclusion fails closed: a value a bound left unread may be the excluded one
        return not hit and message.complete(self.ref)

    def to_spec(self) -> dict[str, Any]:
        """The spec form (``{"field", "operator", "values"?}``), the inverse of :func:`parse`."""
        out: dict[str, Any] = {"field": self.field, "operator": self.operator}
        if self.operator not in VALUELESS:
            out["values"] = list(self.values)
        return out


def parse(node: Mapping[str, Any]) -> FieldCondition:
    """A condition from its spec form (``{"field": "MSH-4", "operator": "In", "values": [..]}``).

    Raises:
        ValueError: a bad reference or operator, values given to ``Exists``/``DoesNotExist``
            or missing for the others (each message starts with the key it is about).
    """
    field = node.get("field")
    if not isinstance(field, str):
        raise ValueError(f"field: {field!r} is not a field reference such as MSH-4")
    try:
        ref = FieldRef.parse(field)
    except ValueError as exc:
        raise ValueError(f"field: {exc}") from None
    op = node.get("operator")
    if op not in OPERATORS:
        raise ValueError(f"operator: must be one of {', '.join(OPERATORS)}")
    values = tuple(str(v) for v in node.get("values") or ())
    if op in VALUELESS and values:
        raise ValueError(f"values: {op} takes no values")
    if op not in VALUELESS and not values:
        raise ValueError(f"values: {op} needs at least one value")
    return FieldCondition(str(field), ref, op, values)


def conditions_of(nodes: Sequence[Mapping[str, Any]] | None) -> tuple[FieldCondition, ...]:
    """Conditions from a list in spec form (None or empty: none).

    Raises:
        ValueError: an item is not a valid condition (see :func:`parse`).
    """
    return tuple(parse(n) for n in nodes or ())


def holds(conditions: Sequence[FieldCondition], message: MessageFields) -> bool:
    """Whether every condition holds for ``message`` (True for no conditions)."""
    return all(c.holds(message) for c in conditions)


class MessageFields:
    """One message, read for field values on first use.

    The message is cut into segments once (for the first reference), and only the segments of
    a referenced ID are split into fields, once per ID; values are kept per reference, so many
    destinations testing ``MSH-4`` read it once.

    Args:
        payload: the message bytes (unframed; a preamble and a byte-order mark are skipped).
    """

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._segments: dict[str, list[str]] | None = None
        self._delimiters: Delimiters | None = None
        self._fields: dict[str, list[list[str]]] = {}
        self._values: dict[FieldRef, tuple[str, ...]] = {}
        self._incomplete: set[FieldRef] = set()
        self._budget = MAX_MATCH_BUDGET

    def spend(self, cost: int) -> bool:
        """Take ``cost`` from this message's matching budget (:data:`MAX_MATCH_BUDGET`);
        False, taking nothing, when it does not cover it."""
        if cost > self._budget:
            self._budget = 0
            return False
        self._budget -= cost
        return True

    def _segments_of(self, segment_id: str) -> tuple[list[list[str]], Delimiters]:
        """The fields of every segment ``segment_id`` (index n is field n, for MSH too)."""
        if self._delimiters is None:
            self._delimiters = delimiters_of(self._payload)
        d = self._delimiters
        found = self._fields.get(segment_id)
        if found is None:
            if segment_id == "MSH":
                # the header: the first segment alone, decoding only its bytes
                texts: Sequence[str] = [first_segment_of(self._payload)]
            else:
                texts = self._all().get(segment_id, ())
            found = []
            for segment in texts:
                if not segment.startswith(segment_id):
                    continue
                if segment[3:4] not in (d.field, ""):
                    continue
                fields = segment.split(d.field)
                if segment_id == "MSH":  # MSH-1 is the separator itself: MSH-n at index n
                    fields = [segment_id, d.field, *fields[1:]]
                found.append(fields)
            self._fields[segment_id] = found
        return found, d

    def _all(self) -> dict[str, list[str]]:
        """Every segment by its ID (the message cut once, on CR, LF or CRLF).

        The message is cut a slice of about :data:`_SLICE_BYTES` at a time (each slice ends
        at a segment terminator), so that no single step holds the interpreter for longer than
        a slice takes: routing runs in a worker thread, and the event loop gets the interpreter
        between two steps (a 16 MiB message cut whole took three steps of 10-15 ms each).
        """
        if self._segments is None:
            data = strip_preamble(self._payload)
            by_id: dict[str, list[str]] = {}
            start, size = 0, len(data)
            while start < size:
                end = start + _SLICE_BYTES
                if end < size:
                    found = _TERMINATOR.search(data, end)
                    end = found.start() if found is not None else size
                else:
                    end = size
                text = data[start:end].decode("latin-1")
                for segment in text.replace("\r\n", "\r").replace("\n", "\r").split("\r"):
                    if segment:
                        by_id.setdefault(segment[:3], []).append(segment)
                start = end
            self._segments = by_id
        return self._segments

    def values(self, ref: FieldRef) -> tuple[str, ...]:
        """The distinct non-empty values of ``ref`` in message order, at most
        :data:`MAX_VALUES_PER_REFERENCE` (rules in the module docstring)."""
        cached = self._values.get(ref)
        if cached is not None:
            return cached
        segments, d = self._segments_of(ref.segment)
        out: list[str] = []
        seen: set[str] = set()
        complete = True
        for fields in segments:
            if ref.field >= len(fields):
                continue
            if len(out) >= MAX_VALUES_PER_REFERENCE:
                complete = False
                break
            repetitions = fields[ref.field].split(d.repetition)
            for at, repetition in enumerate(repetitions):
                value, cut = _part(d, repetition, ref)
                complete = complete and not cut
                if value and value not in seen:
                    seen.add(value)
                    out.append(value)
                    if len(out) >= MAX_VALUES_PER_REFERENCE:
                        complete = complete and at == len(repetitions) - 1
                        break
        found = tuple(out)
        self._values[ref] = found
        if not complete:
            self._incomplete.add(ref)
        return found

    def complete(self, ref: FieldRef) -> bool:
        """Whether :meth:`values` of ``ref`` read every value whole: False when values were
        left out past :data:`MAX_VALUES_PER_REFERENCE` or a value was cut at
        :data:`MAX_VALUE_CHARS` (exclusions then fail closed)."""
        self.values(ref)
        return ref not in self._incomplete


def _part(d: Delimiters, repetition: str, ref: FieldRef) -> tuple[str, bool]:
    """Component ``ref.component``, subcomponent ``ref.subcomponent`` of one repetition, as
    text ('' when absent), and whether it was cut at :data:`MAX_VALUE_CHARS`."""
    components = repetition.split(d.component, ref.component)
    if ref.component > len(components):
        return "", False
    component = components[ref.component - 1]
    subs = component.split(d.subcomponent, ref.subcomponent)
    if ref.subcomponent > len(subs):
        return "", False
    whole = subs[ref.subcomponent - 1]
    raw = whole[: MAX_VALUE_CHARS * 4]  # escapes take up to 4 characters
    text = d.unescape_text(raw).encode("latin-1", "replace").decode("utf-8", "replace").strip()
    cut = len(text) > MAX_VALUE_CHARS or (len(raw) < len(whole) and bool(whole[len(raw) :].strip()))
    return text[:MAX_VALUE_CHARS], cut
