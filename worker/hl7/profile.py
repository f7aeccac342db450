"""Receiver profiles (a Destination's ``spec.profile``): the stored message reshaped for one
receiver, right before it is framed.

Source: HL7 v2.x chapter 2: "Message construction rules" (segments, fields, repetitions,
components, subcomponents; the delimiters of MSH-1/MSH-2), "Use of escape sequences in text
fields" (``\\F\\ \\S\\ \\R\\ \\E\\ \\T\\``), MSH-13 and "Sequence number protocol", MSH-18
and HL7 table 0211 (alternate character sets).

Pure: :func:`transform` is a function of (the stored bytes, a compiled :class:`Profile`, a
sequence number or None) to the bytes a receiver gets, or a :class:`ProfileRefusal` naming the
field and the value that stopped it. No I/O; the stored bytes are never changed (the audit trail
and resends keep them as received).

What a profile does, in this order (each rule acts on the segments the message has; none adds a
segment):

1. the segment terminators are made CR (:func:`inturn.worker.hl7.terminators.normalise_terminators`,
   as every sender does anyway);
2. the message is decoded by its own MSH-18 (its first repetition, HL7 table 0211 names, e.g.
   ``UNICODE UTF-8``, ``8859/1``; empty: ASCII, or what ``charset.whenUndeclared`` says). Without
   a ``charset`` rule bytes that do not decode are kept as they are, byte for byte; with one
   they are refused (:class:`ProfileRefusal`, whatever ``unmappable`` says);
3. ``removeSegments``: segments whose ID matches a name or glob (``Z*``, ``NTE``) are left out
   (never MSH or PID: see :func:`problems`);
4. per segment: ``copy`` (the value read from the message as stored, before any rule: the same
   segment when source and target name one segment ID, else the first segment of the source's
   ID, first repetition), ``set`` (a literal), ``maps`` (a lookup table; a value not in it is
   kept, cleared or held, as ``otherwise`` says; an empty or absent value is looked up only
   when the table has the key ``""``), ``clear``
   (emptied, the separators around it kept), ``truncate`` (cut to at most N bytes in the
   character set sent, never inside a character or an escape sequence);
5. ``sequenceNumbers``: MSH-13 holds the sequence number the worker reserved for this send;
6. ``charset``: MSH-18 names the target and the text is encoded in it; a byte that does not
   decode as the message's charset (step 2) is refused in every mode (it is no character: the
   message is not what it declares); a character the target does not have is refused, replaced
   by ``?`` or transliterated (``é`` -> ``e``, ``ß`` ->
   ``ss``: a small table, then Unicode NFKD without its combining marks, else ``?``).

A reference ``SEG-F`` names a whole field, every repetition; ``SEG-F.C`` and ``SEG-F.C.S`` name
that component (subcomponent) in every repetition. Literal and mapped values are one value: a
delimiter in them is escaped (``\\F\\ \\S\\ \\R\\ \\E\\ \\T\\``); a copied value keeps the
structure its target can hold (a whole field copied into a component has its component and
repetition separators escaped). Values are compared and written as text; bytes that a rule
does not name are left as they were (with a ``charset`` rule: the same text, in the target's
encoding).

Correlation: a profile never changes MSH-10 (the receiver's ACK names it) or PID-3 (patient
identity), nor the delimiters of MSH-1/MSH-2; :func:`problems` refuses such a profile.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import re2  # type: ignore[import-untyped]

from inturn.worker.errors import Invalid
from inturn.worker.hl7.delimiters import Delimiters, read_delimiters, strip_preamble
from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.terminators import normalise_terminators

__all__ = [
    "CHARSET_TARGETS",
    "PATH_PATTERN",
    "SEGMENT_GLOB_PATTERN",
    "FieldPath",
    "Profile",
    "ProfileError",
    "ProfileRefusal",
    "compile_profile",
    "problems",
    "renumbered",
    "shaped",
    "transform",
]

Unmappable = Literal["refuse", "replace", "transliterate"]
Otherwise = Literal["keep", "clear", "hold"]

#: A reference: segment ID, field 1..999, optionally ``.component`` and ``.subcomponent``.
PATH_PATTERN = r"^[A-Z][A-Z0-9]{2}-[1-9][0-9]{0,2}(\.[1-9][0-9]{0,2}){0,2}$"
_PATH = re.compile(PATH_PATTERN)
#: A ``removeSegments`` item: a segment ID or a glob of one (``*`` any run, ``?`` one character).
SEGMENT_GLOB_PATTERN = r"^[A-Z0-9*?]{1,8}$"
#: Fields a profile may not change: the delimiters, the control ID the ACK names, the patient.
CORRELATION_PATTERN = r"^(MSH-(1|2|10)|PID-3)([.].*)?$"
_CORRELATION = re.compile(CORRELATION_PATTERN)
#: Segments ``removeSegments`` may not remove (the header, the patient).
KEPT_SEGMENTS = ("MSH", "PID")

#: ``charset.to`` -> (Python codec, the MSH-18 value written, HL7 table 0211).
CHARSET_TARGETS: dict[str, tuple[str, str]] = {
    "UTF-8": ("utf-8", "UNICODE UTF-8"),
    "ASCII": ("ascii", "ASCII"),
    **{f"ISO-8859-{n}": (f"iso8859_{n}", f"8859/{n}") for n in range(1, 16) if n != 12},
}

#: HL7 table 0211 names (and the DICOM-style aliases seen in feeds) this module can read, with
#: their Python codecs. Names are compared upper-cased without surrounding spaces.
READABLE_0211: dict[str, str] = {
    "ASCII": "ascii",
    "ISO IR6": "ascii",
    "UNICODE UTF-8": "utf-8",
    "ISO IR192": "utf-8",
    "ISO IR100": "iso8859_1",
    "GB 18030-2000": "gb18030",
    "KS X 1001": "euc_kr",
    "BIG-5": "big5",
    **{f"8859/{n}": f"iso8859_{n}" for n in range(1, 16) if n != 12},
}
#: Codecs whose bytes below 0x80 are always ASCII characters (delimiters can be found on the
#: bytes): a message in one of these is worked on with no decoding at all when no rule needs it.
_ASCII_SAFE = frozenset({"ascii", "utf-8", *(f"iso8859_{n}" for n in range(1, 16) if n != 12)})

#: Most bytes of one segment ID glob list, table, ... are bounded by the schema; these bound the
#: work on one message: none (the stored message is bounded by ingest's frame limit).

_QUESTION = "inturn-profile-question"
_TRANSLIT = "inturn-profile-transliterate"

#: Transliterations NFKD does not give (letters without a decomposition, punctuation).
_TRANSLIT_TABLE: dict[str, str] = {
    "ß": "ss",
    "ẞ": "SS",
    "æ": "ae",
    "Æ": "AE",
    "œ": "oe",
    "Œ": "OE",
    "ø": "o",
    "Ø": "O",
    "ł": "l",
    "Ł": "L",
    "đ": "d",
    "Đ": "D",
    "ð": "d",
    "Ð": "D",
    "þ": "th",
    "Þ": "Th",
    "ı": "i",
    "ĸ": "k",
    "ŋ": "n",
    "Ŋ": "N",
    "ħ": "h",
    "Ħ": "H",
    "ŧ": "t",
    "Ŧ": "T",
    "‘": "'",
    "’": "'",
    "‚": "'",
    "“": '"',
    "”": '"',
    "„": '"',
    "«": '"',
    "»": '"',
    "‹": "'",
    "›": "'",
    "–": "-",
    "—": "-",
    "‐": "-",
    "−": "-",
    "…": "...",
    "•": "*",
    "·": ".",
    "×": "x",
    "÷": "/",
    "€": "EUR",
    "£": "GBP",
    "¥": "JPY",
    "©": "(c)",
    "®": "(R)",
    "™": "TM",
    "°": "deg",
    "µ": "u",
    "±": "+/-",
    "\u00a0": " ",
}


#: Most ASCII characters one character is transliterated to.
MAX_TRANSLITERATION = 8


def transliterate_char(ch: str) -> str:
    """An ASCII stand-in for ``ch``: the table of this module, else its NFKD decomposition
    without combining marks (``é`` -> ``e``, ``ﬁ`` -> ``fi``), else ``?``. Always ASCII, at
    most :data:`MAX_TRANSLITERATION` characters."""
    if ch < "\x80":
        return ch
    known = _TRANSLIT_TABLE.get(ch)
    if known is not None:
        return known
    decomposed = unicodedata.normalize("NFKD", ch)
    plain = "".join(
        c if c < "\x80" else _TRANSLIT_TABLE.get(c, "")
        for c in decomposed
        if not unicodedata.combining(c)
    )
    return plain[:MAX_TRANSLITERATION] if plain and plain.isascii() else "?"


def _question(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: each byte that does not decode, or character that does not
    encode, becomes one ``?``."""
    if isinstance(exc, UnicodeDecodeError | UnicodeEncodeError):
        return "?" * (exc.end - exc.start), exc.end
    raise exc


def _transliterate(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: characters the target does not have, transliterated (ASCII)."""
    if isinstance(exc, UnicodeEncodeError):
        text = exc.object[exc.start : exc.end]
        return "".join(transliterate_char(c) for c in text), exc.end
    return _question(exc)


codecs.register_error(_QUESTION, _question)
codecs.register_error(_TRANSLIT, _transliterate)


# --- the errors ------------------------------------------------------------------------------


class ProfileError(Invalid):
    """A profile that can never be applied (a Destination's spec): every problem, one line each
    (``set.MSH-10: ...``), paths relative to ``spec.profile``.

    Attributes:
        problems: the lines.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


class ProfileRefusal(Invalid):
    """This message cannot be shaped as the profile says: a permanent refusal of this message
    (the same message and profile refuse every time). The destination's ``ackPolicy.profile``
    decides (:meth:`inturn.worker.spec.config.AckPolicy.action`): unset, the worker keeps it
    at the head under ``retry.maxAttempts`` 0 (a corrected profile lets it go at its next
    attempt) and gives it up at once onto ``delivery-failed`` above 0.

    Attributes:
        field: where, e.g. ``OBX-3.1``, ``PID-5``, ``MSH-18``.
        value: what was found there (a code, a character, a byte as ``0xE9``); it may be
            message content, so callers withhold it where payloads are kept out
            (:meth:`describe`).
        reason: why, e.g. ``has no entry in the map (otherwise: hold)``.
    """

    def __init__(self, field: str, value: str, reason: str) -> None:
        super().__init__(f"{field} {value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason

    def describe(self, *, reveal: bool = True) -> str:
        """One line: the field, the value (``reveal``) or ``(value withheld)``, and why."""
        shown = repr(self.value[:64]) if reveal else "(value withheld)"
        return f"{self.field} {shown}: {self.reason}"


# --- references ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldPath:
    """A reference as written, e.g. ``OBX-3.1`` is ``FieldPath("OBX-3.1", "OBX", 3, 1, None)``.

    Attributes:
        text: as written.
        segment: the segment ID.
        field: the field number (for MSH, MSH-1 is the field separator).
        component, subcomponent: None when the reference does not name one.
    """

    text: str
    segment: str
    field: int
    component: int | None = None
    subcomponent: int | None = None

    @classmethod
    def parse(cls, text: str) -> FieldPath:
        """``"OBX-3.1"`` -> :class:`FieldPath`.

        Raises:
            ValueError: not a reference such as MSH-5, PID-13 or OBX-3.1.
        """
        if not isinstance(text, str) or not _PATH.match(text):
            raise ValueError(f"{text!r} is not a field reference such as MSH-5, PID-13 or OBX-3.1")
        segment, rest = text.split("-", 1)
        numbers = [int(n) for n in rest.split(".")] + [0, 0]
        return cls(text, segment, numbers[0], numbers[1] or None, numbers[2] or None)

    @property
    def index(self) -> int:
        """The field's index in the segment split on the field separator."""
        return self.field - 1 if self.segment == "MSH" else self.field


# --- the compiled profile --------------------------------------------------------------------


@dataclass(frozen=True)
class ValueMap:
    """One item of ``maps``: values of ``path`` looked up in ``table``.

    Attributes:
        path: where the values are.
        table: value -> replacement (text, unescaped).
        otherwise: what a value not in the table does: ``keep``, ``clear`` or ``hold``.
    """

    path: FieldPath
    table: Mapping[str, str] = field(hash=False)
    otherwise: Otherwise = "keep"


@dataclass(frozen=True)
class Charset:
    """The ``charset`` rule.

    Attributes:
        to: the target as written (``UTF-8``, ``ISO-8859-1``, ``ASCII``).
        unmappable: what a character the target lacks does.
        when_undeclared: the charset assumed for a message whose MSH-18 is empty (a ``to``
            name; HL7's default is ASCII).
    """

    to: str
    unmappable: Unmappable = "refuse"
    when_undeclared: str = "ASCII"

    @property
    def codec(self) -> str:
        """The Python codec of the target."""
        return CHARSET_TARGETS[self.to][0]

    @property
    def msh18(self) -> str:
        """The MSH-18 value written (HL7 table 0211)."""
        return CHARSET_TARGETS[self.to][1]

    @property
    def mime(self) -> str:
        """The target's IANA (MIME) charset name, e.g. for an HTTP ``Content-Type``:
        ``UTF-8``, ``ISO-8859-1``, ``US-ASCII`` (source: the IANA "Character Sets" registry,
        preferred MIME names)."""
        return "US-ASCII" if self.to == "ASCII" else self.to


@dataclass(frozen=True)
class Profile:
    """A compiled ``spec.profile`` (:func:`compile_profile`). Immutable; share it.

    Attributes: as the spec's fields (see the module docstring), references parsed.
    """

    set: tuple[tuple[FieldPath, str], ...] = ()
    copy: tuple[tuple[FieldPath, FieldPath], ...] = ()
    remove_segments: tuple[str, ...] = ()
    clear: tuple[FieldPath, ...] = ()
    truncate: tuple[tuple[FieldPath, int], ...] = ()
    charset: Charset | None = None
    sequence_numbers: bool = False
    maps: tuple[ValueMap, ...] = ()
    #: built by __post_init__: per segment ID, what its rules do (MSH: the header, the first
    #: segment); the removeSegments globs as one expression, and what it said per segment ID
    _plans: Mapping[str, _Plan] = field(default_factory=dict, hash=False, compare=False, repr=False)
    _remove: re.Pattern[str] | None = field(default=None, hash=False, compare=False, repr=False)
    _lookup: dict[str, _Plan] = field(default_factory=dict, hash=False, compare=False, repr=False)
    #: the maps a message is searched for (:func:`_guardable`), and per set of maps a message
    #: cannot hit, the plans without them and their own look-up (at most 64 sets kept)
    _guarded: tuple[ValueMap, ...] = field(default=(), hash=False, compare=False, repr=False)
    _variants: dict[frozenset[ValueMap], tuple[Mapping[str, _Plan], dict[str, _Plan]]] = field(
        default_factory=dict, hash=False, compare=False, repr=False
    )
    #: whether :func:`_screen` applies: every copy reads the segment it writes
    _screenable: bool = field(default=True, hash=False, compare=False, repr=False)
    #: per (delimiters, widest character): the screen of :func:`_screen` (at most 64 kept)
    _screens: dict[tuple[Delimiters, int], Any] = field(
        default_factory=dict, hash=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        ops = [
            *(_Op("copy", t, source=s) for t, s in self.copy),
            *(_Op("set", t, literal=v) for t, v in self.set),
            *(_Op("map", m.path, vmap=m) for m in self.maps),
            *(_Op("clear", t) for t in self.clear),
            *(_Op("truncate", t, limit=n) for t, n in self.truncate),
        ]
        by_segment: dict[str, list[_Op]] = {}
        for op in ops:
            by_segment.setdefault(op.target.segment, []).append(op)
        if self.sequence_numbers or self.charset is not None:
            by_segment.setdefault("MSH", [])
        plans = {
            sid: _plan(sid, tuple(seg_ops), self.sequence_numbers, self.charset)
            for sid, seg_ops in by_segment.items()
        }
        object.__setattr__(self, "_plans", plans)
        object.__setattr__(self, "_screenable", all(s.segment == t.segment for t, s in self.copy))
        guarded = {m for plan in plans.values() for m in plan.maps if m is not None}
        object.__setattr__(
            self, "_guarded", tuple(m for m in self.maps if m in guarded and _guardable(m))
        )
        if self.remove_segments:
            alternatives = "|".join(_glob_regex(g) for g in self.remove_segments)
            object.__setattr__(self, "_remove", re.compile(f"(?:{alternatives})"))

    @property
    def empty(self) -> bool:
        """True when the profile changes nothing (then the worker does not call
        :func:`transform` at all: the stored bytes go as they are)."""
        return not (
            self.set
            or self.copy
            or self.remove_segments
            or self.clear
            or self.truncate
            or self.charset
            or self.sequence_numbers
            or self.maps
        )

    def to_spec(self) -> dict[str, Any]:
        """The ``spec.profile`` node this profile was compiled from (defaults written out);
        :func:`compile_profile` of it gives an equal profile."""
        out: dict[str, Any] = {}
        if self.set:
            out["set"] = {p.text: v for p, v in self.set}
        if self.copy:
            out["copy"] = {t.text: s.text for t, s in self.copy}
        if self.remove_segments:
            out["removeSegments"] = list(self.remove_segments)
        if self.clear:
            out["clear"] = [p.text for p in self.clear]
        if self.truncate:
            out["truncate"] = {p.text: n for p, n in self.truncate}
        if self.charset is not None:
            out["charset"] = {
                "to": self.charset.to,
                "unmappable": self.charset.unmappable,
                "whenUndeclared": self.charset.when_undeclared,
            }
        if self.sequence_numbers:
            out["sequenceNumbers"] = True
        if self.maps:
            out["maps"] = [
                {"field": m.path.text, "table": dict(m.table), "otherwise": m.otherwise}
                for m in self.maps
            ]
        return out

    def removes(self, segment_id: str) -> bool:
        """Whether ``removeSegments`` leaves out segments of this ID (never MSH or PID)."""
        return (
            self._remove is not None
            and segment_id not in KEPT_SEGMENTS
            and self._remove.fullmatch(segment_id) is not None
        )

    def _classify(
        self, segment_id: str, plans: Mapping[str, _Plan], lookup: dict[str, _Plan]
    ) -> _Plan:
        """What a segment (not the first) of this ID gets under ``plans``: left out, its plan,
        or nothing; remembered in ``lookup`` (at most 1,024 IDs: a peer's message cannot grow
        it past that)."""
        if len(segment_id) < 3 or segment_id == "MSH":
            plan = _SKIP
        elif self.removes(segment_id):
            plan = _REMOVE
        else:
            plan = plans.get(segment_id, _SKIP)
        if len(lookup) < 1024:
            lookup[segment_id] = plan
        return plan

    def _for_text(self, text: str, d: Delimiters) -> tuple[Mapping[str, _Plan], dict[str, _Plan]]:
        """The plans (and their look-up) for one message: without the maps none of whose keys
        stands in ``text`` (:func:`_guardable`). A segment with an escape sequence (where a
        value could be spelled otherwise than its key) takes the whole plans all the same
        (:func:`_apply`)."""
        if not self._guarded:
            return self._plans, self._lookup
        absent = frozenset(m for m in self._guarded if not any(k in text for k in m.table))
        if not absent:
            return self._plans, self._lookup
        variant = self._variants.get(absent)
        if variant is None:
            variant = (_without_maps(self._plans, absent), {})
            if len(self._variants) < 64:
                self._variants[absent] = variant
        return variant


OpKind = Literal["copy", "set", "map", "clear", "truncate"]


@dataclass(frozen=True)
class _Op:
    kind: OpKind
    target: FieldPath
    source: FieldPath | None = None
    literal: str = ""
    limit: int = 0
    vmap: ValueMap | None = None


def _glob_regex(glob: str) -> str:
    """A glob as a regular expression matching segment IDs (three letters or digits) only."""
    body = "".join(
        "[A-Z0-9]*" if c == "*" else "[A-Z0-9]" if c == "?" else re.escape(c) for c in glob
    )
    return f"(?=[A-Z0-9]{{3}}(?![A-Z0-9])){body}"


# --- validation and compilation --------------------------------------------------------------


def _mapping(node: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = node.get(key)
    return value if isinstance(value, Mapping) else {}


def _listed(node: Mapping[str, Any], key: str) -> list[Any]:
    value = node.get(key)
    return value if isinstance(value, list) else []


def _targets(node: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """(spec path, reference) of every field a profile writes (parts of the wrong type are
    left to the schema's own problem lines)."""
    for key in ("set", "copy", "truncate"):
        for ref in _mapping(node, key):
            yield f"{key}.{ref}", ref
    for i, ref in enumerate(_listed(node, "clear")):
        if isinstance(ref, str):
            yield f"clear[{i}]", ref
    for i, item in enumerate(_listed(node, "maps")):
        if isinstance(item, Mapping) and isinstance(item.get("field"), str):
            yield f"maps[{i}].field", item["field"]


def problems(node: Mapping[str, Any] | None, *, schema_rules: bool = False) -> list[str]:
    """What is wrong with a ``spec.profile`` node (already well typed by the schema), one
    ``path: problem`` line each, paths relative to ``spec.profile``; empty when it can be used.

    Refused: a reference that is not one; a rule that writes MSH-1, MSH-2 (the delimiters),
    MSH-10 (the receiver's ACK names it: correlation) or PID-3 (the patient's identifiers:
    duplicates, lanes and replies are decided on them); MSH-18 (``charset`` writes it) and
    MSH-13 with ``sequenceNumbers``; a field written by more than one of ``set``, ``copy`` and
    ``clear``; a ``removeSegments`` glob that matches MSH or PID; an unknown charset.

    ``schema_rules``: the schema's CEL rules (:mod:`inturn.worker.spec.schema_profile`) have
    judged ``clear`` and ``maps`` already; their correlation lines are not said twice.
    """
    if not isinstance(node, Mapping) or not node:
        return []
    out: list[str] = []
    written: dict[str, str] = {}
    for where, ref in _targets(node):
        try:
            path = FieldPath.parse(ref)
        except ValueError as exc:
            out.append(f"{where}: {exc}")
            continue
        if _CORRELATION.match(ref):
            if schema_rules and where.startswith(("clear[", "maps[")):
                continue
            what = {
                "MSH-1": "MSH-1 and MSH-2 are the message's delimiters",
                "MSH-2": "MSH-1 and MSH-2 are the message's delimiters",
                "MSH-10": "MSH-10 is the control ID the receiver's ACK names",
                "PID-3": "PID-3 identifies the patient (duplicates, lanes and replies use it)",
            }[f"{path.segment}-{path.field}"]
            out.append(f"{where}: {what}; a profile may not change it")
            continue
        if path.segment == "MSH" and path.field == 18:
            out.append(f"{where}: MSH-18 is written by charset.to; declare charset instead")
        if path.segment == "MSH" and path.field == 13 and node.get("sequenceNumbers") is True:
            out.append(f"{where}: MSH-13 is written by sequenceNumbers")
        kind = where.split(".", 1)[0].split("[", 1)[0]
        if kind in ("set", "copy", "clear"):
            if ref in written:
                out.append(f"{where}: {ref} is written by {written[ref]} too; name it once")
            else:
                written[ref] = kind
    for target, source in _mapping(node, "copy").items():
        try:
            FieldPath.parse(source)
        except ValueError as exc:
            out.append(f"copy.{target}: {exc}")
    for i, glob in enumerate(_listed(node, "removeSegments")):
        if not isinstance(glob, str) or not re.match(SEGMENT_GLOB_PATTERN, glob):
            out.append(f"removeSegments[{i}]: {glob!r} is not a segment ID or glob such as Z*")
            continue
        regex = re.compile(f"^{_glob_regex(glob)}$")
        kept = [s for s in KEPT_SEGMENTS if regex.match(s)]
        if kept:
            out.append(
                f"removeSegments[{i}]: {glob!r} would remove {' and '.join(kept)}"
                " (the header and the patient stay)"
            )
    charset = node.get("charset")
    if isinstance(charset, Mapping):
        for key in ("to", "whenUndeclared"):
            name = charset.get(key)
            if name is not None and name not in CHARSET_TARGETS:
                out.append(f"charset.{key}: must be one of {', '.join(CHARSET_TARGETS)}")
    return out


def shaped(payload: bytes, profile: Profile | None, sequence: int | None = None) -> bytes:
    """What is sent: ``payload`` itself (the same object, not a copy) when there is no profile,
    else :func:`transform` of it. The worker's cost without a profile is this one test.

    Raises:
        ProfileRefusal: as :func:`transform`.
    """
    return payload if profile is None else transform(payload, profile, sequence)


def compile_profile(node: Mapping[str, Any] | None) -> Profile | None:
    """Compile a ``spec.profile`` node (as the schema defaults it) into a :class:`Profile`, or
    None when it is absent or changes nothing.

    Raises:
        ProfileError: :func:`problems` found some (every line).
    """
    if not node:
        return None
    found = problems(node)
    if found:
        raise ProfileError(found)
    charset = node.get("charset")
    profile = Profile(
        set=tuple((FieldPath.parse(k), str(v)) for k, v in (node.get("set") or {}).items()),
        copy=tuple(
            (FieldPath.parse(k), FieldPath.parse(v)) for k, v in (node.get("copy") or {}).items()
        ),
        remove_segments=tuple(node.get("removeSegments") or ()),
        clear=tuple(FieldPath.parse(k) for k in node.get("clear") or ()),
        truncate=tuple(
            (FieldPath.parse(k), int(v)) for k, v in (node.get("truncate") or {}).items()
        ),
        charset=(
            None
            if not charset
            else Charset(
                to=charset["to"],
                unmappable=charset.get("unmappable", "refuse"),
                when_undeclared=charset.get("whenUndeclared", "ASCII"),
            )
        ),
        sequence_numbers=bool(node.get("sequenceNumbers", False)),
        maps=tuple(
            ValueMap(
                FieldPath.parse(m["field"]),
                {str(k): str(v) for k, v in (m.get("table") or {}).items()},
                m.get("otherwise", "keep"),
            )
            for m in node.get("maps") or ()
        ),
    )
    return None if profile.empty else profile


# --- the transform ---------------------------------------------------------------------------


def readable_codec(msh18: str) -> str | None:
    """The Python codec of an MSH-18 value (HL7 table 0211, case and spaces around ignored;
    DICOM's ``ISO IR100``/``ISO IR192`` too), or None when this module cannot read it."""
    return READABLE_0211.get(msh18.strip().upper())


@dataclass
class _Message:
    """The message as text while a profile works on it.

    Attributes:
        d: its delimiters.
        codec: the codec its text was decoded with (``latin-1``: worked on as its bytes, one
            character a byte, for ASCII, UTF-8 and ISO-8859 messages without a charset rule).
        source: the codec of its characters (MSH-18's, or assumed).
        out_codec: the codec the result is encoded with.
        errors: the error handler of that encoding.
    """

    d: Delimiters
    codec: str
    source: str
    out_codec: str
    errors: str


def _declared_charset(msh: str, d: Delimiters) -> str:
    fields = msh.split(d.field)
    raw = fields[17] if len(fields) > 17 else ""
    return raw.split(d.repetition, 1)[0].split(d.component, 1)[0].strip()


def transform(payload: bytes, profile: Profile, sequence: int | None = None) -> bytes:
    """The bytes a receiver gets: ``payload`` (the stored message) shaped by ``profile``.

    Args:
        payload: the stored message, unframed.
        profile: a compiled, non-empty profile.
        sequence: the MSH-13 value (>= 0) when ``profile.sequence_numbers``; ignored otherwise.

    Returns:
        The message to frame, CR-terminated (see the module docstring for what changes).

    Raises:
        ProfileRefusal: the message has no usable MSH; its MSH-18 names a charset this module
            cannot read while ``charset`` is set; a byte does not decode as the message's
            charset says (with ``charset``, whatever ``unmappable`` says), or a character has no
            place in the target (``unmappable: refuse``); a literal or mapped value has no place
            in the message's own charset (no ``charset`` rule); a map's ``otherwise: hold``; a
            sequence number is needed and none was given.
    """
    data = normalise_terminators(payload)
    body = strip_preamble(data)
    preamble = data[: len(data) - len(body)]
    end = body.find(b"\r")
    first = (body if end < 0 else body[:end]).decode("latin-1")
    try:
        d = read_delimiters(first)
    except HeaderError as exc:
        raise ProfileRefusal("MSH", first[:8], f"no usable MSH: {exc.text}") from None
    declared = _declared_charset(first, d)
    charset = profile.charset
    if charset is None:
        known = readable_codec(declared) if declared else "ascii"
        source = known or "latin-1"
        # ASCII-safe messages are worked on as their bytes; bytes that do not decode in the
        # others stay as they were (surrogateescape): byte for byte either way
        codec = "latin-1" if known is None or known in _ASCII_SAFE else known
        msg = _Message(d, codec, source, codec, "surrogateescape")
        text = body.decode(codec, "surrogateescape")
    else:
        if declared:
            found = readable_codec(declared)
            if found is None:
                raise ProfileRefusal(
                    "MSH-18", declared, "is not a character set of HL7 table 0211 inturn can read"
                )
            source = found
        else:
            source = CHARSET_TARGETS[charset.when_undeclared][0]
        said = declared or f"{charset.when_undeclared} (MSH-18 is empty)"
        text = _decode(body, source, said, d, declared=bool(declared))
        handler = {"refuse": "strict", "replace": _QUESTION, "transliterate": _TRANSLIT}
        msg = _Message(d, source, source, charset.codec, handler[charset.unmappable])
        if b"\xef\xbb\xbf" in preamble:  # a UTF-8 mark means nothing in the target
            preamble = preamble.replace(b"\xef\xbb\xbf", b"")
    out = _apply(text, profile, msg, sequence)
    try:
        encoded = out.encode(msg.out_codec, msg.errors)
    except UnicodeEncodeError as exc:
        bad = out[exc.start]
        where = _locate(out, exc.start, d)
        target = charset.to if charset is not None else msg.source
        raise ProfileRefusal(
            where, bad, f"(U+{ord(bad):04X}) has no place in {target} (unmappable: refuse)"
        ) from None
    return preamble + encoded


def renumbered(sent: bytes, sequence: int) -> bytes | None:
    """``sent`` (what :func:`transform` gave, with ``sequenceNumbers``) with MSH-13 set to
    ``sequence`` (>= 0), the rest byte for byte; None when its header is not ASCII (a
    multi-byte charset could hide a delimiter byte there: call :func:`transform` again).

    The worker shapes a message with a placeholder number first and reserves its number only
    once the profile took it (a refused message spends no number: the receiver sees no gap),
    then writes the number here, without shaping the message twice.
    """
    body = strip_preamble(sent)
    start = len(sent) - len(body)
    end = body.find(b"\r")
    header = body if end < 0 else body[:end]
    if len(header) < 4 or not header.isascii() or not header.startswith(b"MSH"):
        return None
    fs = header[3:4]
    fields = header.split(fs)
    while len(fields) <= 12:
        fields.append(b"")
    fields[12] = str(sequence).encode("ascii")
    return sent[:start] + fs.join(fields) + (b"" if end < 0 else body[end:])


def _decode(body: bytes, codec: str, said: str, d: Delimiters, *, declared: bool) -> str:
    """``body`` decoded as ``codec`` (``said``: the charset's name as the message has it;
    ``declared``: whether its MSH-18 names it, else it is ``whenUndeclared``'s).

    A byte that does not decode is refused, naming its field, whatever ``unmappable`` says:
    ``unmappable`` is about characters the target lacks, and such a byte is no character at all
    (the message is not in the charset it declares, e.g. Latin-1 ``MÜLLER`` declared ``UNICODE
    UTF-8``): replacing it would send a ``?`` for a letter nobody can tell, silently.
    """
    try:
        return body.decode(codec)
    except UnicodeDecodeError as exc:
        why = (
            "the message is not in the character set it declares"
            if declared
            else "charset.whenUndeclared names the character set of a message without MSH-18"
        )
        before = body[: exc.start].decode(codec, _QUESTION)
        where = _locate(before + "?", len(before), d)
        raise ProfileRefusal(
            where,
            f"0x{body[exc.start]:02X}",
            f"does not decode as {said}: {why} (refused whatever unmappable says)",
        ) from None


def _locate(text: str, pos: int, d: Delimiters) -> str:
    """The field reference (``PID-5``) of character ``pos`` of the message text (``segment 3``
    when the segment has no ID to name)."""
    start = text.rfind("\r", 0, pos) + 1
    segment = text[start:pos]
    sid = segment[:3]
    if len(sid) < 3 or not sid.isalnum() or not sid.isascii() or segment[3:4] not in (d.field, ""):
        return f"segment {text.count(chr(13), 0, pos) + 1}"
    count = segment.count(d.field)
    number = count + 1 if sid == "MSH" else count
    return f"{sid}-{number}" if number > 0 else sid


@dataclass
class _Context:
    """What the rules of one message share: the message, its sequence number, the values
    copies read from other segments, and its escaped literals (each escaped once)."""

    msg: _Message
    sequence: int | None
    firsts: Mapping[str, str]
    literals: dict[str, str] = field(default_factory=dict)
    #: Most bytes one character can take in the encoding sent (truncation's quick look).
    widest: int = 1


_OpFn = Callable[[list[str], _Context], bool]


@dataclass(frozen=True)
class _Plan:
    """The rules of one segment ID: the segment is split into fields up to ``depth`` (-1: all)
    and each op (fields, context) -> changed runs in turn.

    ``maps`` stands beside ``ops``: the map an op looks up (None for the other kinds), so that a
    message none of whose map keys it can hold drops those ops (:func:`_without_maps`).
    ``short``: when every op is a truncation, the smallest limit (bytes): a segment whose every
    character, at the message's widest encoding, fits in it is not split at all; else -1.
    ``maps`` and ``limits`` are empty for the header's plan (it is always applied whole).
    """

    depth: int
    ops: tuple[_OpFn, ...]
    maps: tuple[ValueMap | None, ...] = ()
    #: beside ``ops``: a truncation's limit, None for the other kinds
    limits: tuple[int | None, ...] = ()
    short: int = field(init=False, default=-1)
    #: with one op, a truncation: its field's index and limit (the loop's own quick look)
    field_limit: tuple[int, int] = field(init=False, default=(-1, -1))

    def __post_init__(self) -> None:
        limits = self.limits
        if limits and all(n is not None for n in limits):
            object.__setattr__(self, "short", min(n for n in limits if n is not None))
            if len(limits) == 1 and limits[0] is not None:
                object.__setattr__(self, "field_limit", (self.depth - 1, limits[0]))


def _plan(sid: str, ops: tuple[_Op, ...], sequence_numbers: bool, charset: Charset | None) -> _Plan:
    """Compile the rules of segment ID ``sid`` (``MSH``: the header also gets MSH-13 and
    MSH-18)."""
    fns: list[_OpFn] = []
    maps: list[ValueMap | None] = []
    limits: list[int | None] = []
    copies = tuple((op.target, op.source) for op in ops if op.source is not None)
    if copies:
        fns.append(_copy_op(copies))
        maps.append(None)
        limits.append(None)
    for op in ops:
        if op.kind == "set":
            fns.append(_set_op(op.target, op.literal))
        elif op.kind == "map":
            assert op.vmap is not None
            fns.append(_map_op(op.vmap))
        elif op.kind == "clear":
            fns.append(_clear_op(op.target))
        elif op.kind == "truncate":
            fns.append(_truncate_op(op.target, op.limit))
        else:
            continue
        maps.append(op.vmap if op.kind == "map" else None)
        limits.append(op.limit if op.kind == "truncate" else None)
    if sid == "MSH":
        if sequence_numbers:
            fns.append(_sequence_op)
        if charset is not None:
            msh18 = charset.msh18

            def declare(parts: list[str], ctx: _Context) -> bool:
                _write(parts, 17, msh18)
                return True

            fns.append(declare)
        return _Plan(-1, tuple(fns))
    indexes = [op.target.index for op in ops]
    indexes += [s.index for _, s in copies if s is not None and s.segment == sid]
    return _Plan(max(indexes) + 1, tuple(fns), tuple(maps), tuple(limits))


#: Most keys of one map whose presence a message is searched for (:func:`_without_maps`): a
#: larger table is looked up segment by segment, as a search per key would cost more.
GUARDED_KEYS = 32


def _guardable(vmap: ValueMap) -> bool:
    """Whether a map changes nothing in a message none of whose keys stands in its text: it
    keeps what it does not find, and each key is ASCII (a value is then the same characters
    whatever the message's charset); the message must also have no escape sequence (checked
    per message), so that every value looked up is a piece of the text as it stands."""
    return (
        vmap.otherwise == "keep"
        and 0 < len(vmap.table) <= GUARDED_KEYS
        and all(key.isascii() for key in vmap.table)
    )


def _without_maps(plans: Mapping[str, _Plan], absent: frozenset[ValueMap]) -> dict[str, _Plan]:
    """``plans`` without the ops of the maps in ``absent`` (a plan left with no op: skipped,
    :data:`_SKIP`; the header's plan keeps its depth)."""
    out: dict[str, _Plan] = {}
    for sid, plan in plans.items():
        if not any(m in absent for m in plan.maps):
            out[sid] = plan
            continue
        kept = [
            (fn, m, n)
            for fn, m, n in zip(plan.ops, plan.maps, plan.limits, strict=True)
            if m not in absent
        ]
        if not kept:
            out[sid] = _SKIP
            continue
        out[sid] = _Plan(
            plan.depth,
            tuple(fn for fn, _, _ in kept),
            tuple(m for _, m, _ in kept),
            tuple(n for _, _, n in kept),
        )
    return out


def _sequence_op(parts: list[str], ctx: _Context) -> bool:
    if ctx.sequence is None:
        raise ProfileRefusal("MSH-13", "", "no sequence number was reserved")
    _write(parts, 12, str(ctx.sequence))
    return True


def _copy_op(pairs: tuple[tuple[FieldPath, FieldPath | None], ...]) -> _OpFn:
    def copy(parts: list[str], ctx: _Context) -> bool:
        d = ctx.msg.d
        values = []
        for target, source in pairs:  # every value read before any is written
            assert source is not None
            same = source.segment == target.segment
            raw = _read(parts, source, d) if same else ctx.firsts.get(source.text, "")
            values.append(_fit(raw, target, d))
        for (target, _), value in zip(pairs, values, strict=True):
            _update(parts, target, d, _constant(value), bool(value))
        return True

    return copy


def _constant(value: str) -> Callable[[str], str]:
    """A rule's new value whatever the old one."""
    return lambda _old: value


def _set_op(target: FieldPath, literal: str) -> _OpFn:
    def set_(parts: list[str], ctx: _Context) -> bool:
        value = ctx.literals.get(literal)
        if value is None:
            value = ctx.literals[literal] = _literal(literal, target, ctx.msg)
        _update(parts, target, ctx.msg.d, _constant(value), True)
        return True

    return set_


def _clear_op(target: FieldPath) -> _OpFn:
    index = target.index

    def clear(parts: list[str], ctx: _Context) -> bool:
        if index >= len(parts) or not parts[index]:
            return False
        if target.component is None:
            parts[index] = ""
            return True
        new = _in_components(parts[index], target, ctx.msg.d, _cleared, False)
        if new is None:
            return False
        parts[index] = new
        return True

    return clear


def _truncate_op(target: FieldPath, limit: int) -> _OpFn:
    index = target.index

    def truncate(parts: list[str], ctx: _Context) -> bool:
        if index >= len(parts):
            return False
        old = parts[index]
        if len(old) * ctx.widest <= limit:  # fits whatever its characters
            return False
        msg = ctx.msg
        if target.component is None:
            new = _truncated(old, limit, msg)
        else:
            new = _in_components(old, target, msg.d, lambda v: _truncated(v, limit, msg), False)
        if new is None:
            return False
        parts[index] = new
        return True

    return truncate


def _map_op(vmap: ValueMap) -> _OpFn:
    target = vmap.path
    index = target.index
    first_component = target.component == 1 and target.subcomponent is None
    table = vmap.table
    blank = "" in table  # a key "" maps an empty or absent value too

    def map_(parts: list[str], ctx: _Context) -> bool:
        if blank:
            return _map_blank(parts, ctx)
        if index >= len(parts):
            return False
        old = parts[index]
        if not old:
            return False
        msg = ctx.msg
        d = msg.d
        new: str | None
        if target.component is None:
            new = _mapped(old, vmap, msg, ctx)
        elif first_component and d.repetition not in old:
            value, sep, tail = old.partition(d.component)
            if d.escape not in value and value.isascii() and vmap.otherwise == "keep":
                hit = table.get(value)  # the common case, without a call
                if hit is None:
                    return False
                found = ctx.literals.get(hit)
                if found is None:
                    found = ctx.literals[hit] = _literal(hit, target, msg)
            else:
                found = _mapped(value, vmap, msg, ctx)
            new = None if found is None else found + sep + tail
        else:
            new = _in_components(old, target, d, lambda v: _mapped(v, vmap, msg, ctx), False)
        if new is None or new == old:
            return False
        parts[index] = new
        return True

    def _map_blank(parts: list[str], ctx: _Context) -> bool:
        length = len(parts)
        before = parts[index] if index < length else None
        msg = ctx.msg
        _update(parts, target, msg.d, lambda v: _mapped(v, vmap, msg, ctx), True)
        if before is None and not parts[index]:
            del parts[length:]  # nothing written: the segment keeps its length
            return False
        return parts[index] != before

    return map_


#: What a segment ID is to a profile: a plan, left out (:data:`_REMOVE`) or left alone.
_REMOVE = _Plan(0, ())
_SKIP = _Plan(0, ())


def _apply(text: str, profile: Profile, msg: _Message, sequence: int | None) -> str:
    """The message text with ``removeSegments`` and the field rules applied.

    One pass over the segments; a segment is split into fields only when a rule names its ID,
    only as far as the last field named, and joined again only when a rule changed it; a
    segment no rule names costs one dictionary look-up (see ``bench/profiles.py``).
    """
    d = msg.d
    fs = d.field
    if profile._screenable and (len(profile._plans) > ("MSH" in profile._plans) or profile._remove):
        widest = _widest(msg)
        # with characters of several bytes a truncation's bound in characters is loose: the
        # screen would find most segments, a scan spent for nothing
        screen = _screen(profile, d, widest) if widest == 1 or not profile.truncate else None
        if screen is not None and screen.search(text) is None:
            # no segment but the header can change: it alone is shaped, the rest not split
            end = text.find("\r")
            if end < 0:
                end = len(text)
            ctx = _Context(msg, sequence, {}, widest=widest)
            return _shape_head(text[:end], profile._plans.get("MSH"), ctx, fs) + text[end:]
    plans, lookup = profile._for_text(text, d)
    head = plans.get("MSH")
    if len(plans) == (head is not None) and profile._remove is None and not profile.copy:
        # the header alone is named: the rest is not even split
        end = text.find("\r")
        if end < 0:
            end = len(text)
        ctx = _Context(msg, sequence, {}, widest=_widest(msg))
        return _shape_head(text[:end], head, ctx, fs) + text[end:]
    segments = text.split("\r")
    firsts = _copy_sources(segments, profile, d) if profile.copy else {}
    ctx = _Context(msg, sequence, firsts, widest=_widest(msg))
    segments[0] = _shape_head(segments[0], head, ctx, fs)
    removed = False
    widest = ctx.widest
    reduced = plans is not profile._plans
    escape = d.escape
    for i in range(1, len(segments)):
        segment = segments[i]
        if reduced and escape in segment:  # a value may be escaped: every map applies
            plan = profile._lookup.get(segment[:3])
            if plan is None:
                plan = profile._classify(segment[:3], profile._plans, profile._lookup)
        else:
            plan = lookup.get(segment[:3])
            if plan is None:
                plan = profile._classify(segment[:3], plans, lookup)
        if plan is _SKIP or segment[3:4] not in (fs, ""):
            continue
        if plan is _REMOVE:
            segments[i] = "\x00"
            removed = True
            continue
        if plan.short >= 0:  # truncations only: is there a field long enough to cut?
            chars = plan.short // widest  # a field of more characters may need cutting
            n = len(segment)
            # a run of chars + 1 without a separator covers [n - chars - 1, chars + 1)
            if n <= chars or (
                n < 2 * chars + 2 and segment.find(fs, n - chars - 1, chars + 1) >= 0
            ):
                continue
        parts = segment.split(fs, plan.depth)
        index, limit = plan.field_limit
        if index > 0 and (index >= len(parts) or len(parts[index]) * widest <= limit):
            continue  # one truncation, and its field fits
        changed = False
        for op in plan.ops:
            if op(parts, ctx):
                changed = True
        if changed:
            segments[i] = fs.join(parts)
    if removed:
        return "\r".join([s for s in segments if s != "\x00"])
    return "\r".join(segments)


def _screen(profile: Profile, d: Delimiters, widest: int) -> Any:
    """One RE2 expression that finds, in a message with delimiters ``d`` whose characters take
    at most ``widest`` bytes once encoded, every segment but the header that ``profile`` could
    change or leave out, and some that it cannot (it is a screen: no match means the header
    alone changes); None when it cannot be written (RE2 refused it). Remembered per (``d``,
    ``widest``), at most 64 pairs.

    Per segment ID (a segment starts after a CR): ``removeSegments`` and ``set`` name every
    segment of the ID; ``clear`` one whose field is not empty; ``truncate`` one whose field has
    more characters than the limit over ``widest``; a map one whose field holds one of its keys
    or a hex escape sequence (the only escape that can spell an ASCII key that has no
    delimiter in it), if it keeps what it does not know, else one whose field is not empty.
    ``copy`` (only where each reads the segment it writes: ``Profile._screenable``) names every
    segment of its target's ID. RE2 scans the text once, in linear time.
    """
    key = (d, widest)
    if key in profile._screens:
        return profile._screens[key]
    fs = _re2_char(d.field)
    cr = _re2_char("\r")
    other = f"[^{fs}{cr}]"
    end = f"(?:{fs}|{cr}|$)"
    reserved = {d.field, d.component, d.repetition, d.escape, d.subcomponent, "\r", "\n"}
    if d.truncation is not None:
        reserved.add(d.truncation)

    def at(path: FieldPath, then: str) -> str:
        skip = f"(?:{other}*{fs}){{{path.index - 1}}}" if path.index > 1 else ""
        return f"{path.segment}{fs}{skip}{then}"

    branches: list[str] = []
    if profile.remove_segments:
        globs = "|".join(
            "".join(
                "[A-Z0-9]*" if c == "*" else "[A-Z0-9]" if c == "?" else _re2_char(c) for c in g
            )
            for g in profile.remove_segments
        )
        branches.append(f"(?:{globs}){end}")
    for path, _ in (*profile.set, *profile.copy):
        if path.segment != "MSH":
            branches.append(f"{path.segment}{end}")
    for path in profile.clear:
        if path.segment != "MSH":
            branches.append(at(path, other))
    for path, limit in profile.truncate:
        if path.segment != "MSH":
            branches.append(at(path, f"{other}{{{min(limit // widest + 1, 1000)}}}"))
    for vmap in profile.maps:
        path = vmap.path
        if path.segment == "MSH":
            continue
        keys = list(vmap.table)
        if vmap.otherwise == "keep" and "" in vmap.table:
            branches.append(f"{path.segment}{end}")  # an empty value is looked up too
        elif (
            vmap.otherwise == "keep"
            and len(keys) <= GUARDED_KEYS
            and all(k.isascii() and not reserved.intersection(k) for k in keys)
        ):
            spelled = "|".join(
                ["".join(map(_re2_char, k)) for k in keys] + [_re2_char(d.escape) + "X"]
            )
            branches.append(at(path, f"{other}*(?:{spelled})"))
        else:
            branches.append(at(path, other))
    screen = None
    if branches:
        options = re2.Options()
        options.max_mem = 8 << 20  # RE2's default: it bounds the DFA whatever the text
        try:
            screen = re2.compile(f"{cr}(?:{'|'.join(branches)})", options)
        except re2.error:
            screen = None
    if len(profile._screens) < 64:
        profile._screens[key] = screen
    return screen


def _re2_char(ch: str) -> str:
    """``ch`` as an RE2 literal (letters and digits as they are, the rest ``\\x{..}``)."""
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{ord(ch):x}}}"


def _shape_head(segment: str, plan: _Plan | None, ctx: _Context, fs: str) -> str:
    """The header (the first segment) with its rules applied."""
    if plan is None:
        return segment
    parts = segment.split(fs)
    for op in plan.ops:
        op(parts, ctx)
    return fs.join(parts)


def _widest(msg: _Message) -> int:
    """Most bytes one character of the message's text takes once encoded."""
    if msg.out_codec in _SINGLE_BYTE and msg.errors != _TRANSLIT:
        return 1
    return MAX_TRANSLITERATION if msg.errors == _TRANSLIT else 4


def _copy_sources(segments: list[str], profile: Profile, d: Delimiters) -> dict[str, str]:
    """The raw values copies read from a segment other than their target's (first segment of the
    source's ID, first repetition), by reference text, from the message as stored."""
    wanted = {s.text: s for t, s in profile.copy if s.segment != t.segment}
    out: dict[str, str] = {}
    fs = d.field
    for segment in segments if wanted else ():
        if not wanted:
            break
        if segment[3:4] not in (fs, ""):
            continue
        sid = segment[:3]
        for ref, path in list(wanted.items()):
            if path.segment == sid:
                out[ref] = _read(segment.split(fs), path, d)
                del wanted[ref]
    for ref in wanted:
        out[ref] = ""
    return out


def _read(fields: list[str], path: FieldPath, d: Delimiters) -> str:
    """The raw value of ``path`` in a split segment (its first repetition for a component)."""
    if path.index >= len(fields):
        return ""
    value = fields[path.index]
    if path.component is None:
        return value
    parts = value.split(d.repetition, 1)[0].split(d.component)
    if path.component > len(parts):
        return ""
    value = parts[path.component - 1]
    if path.subcomponent is None:
        return value
    subs = value.split(d.subcomponent)
    return subs[path.subcomponent - 1] if path.subcomponent <= len(subs) else ""


def _write(fields: list[str], index: int, value: str) -> None:
    while len(fields) <= index:
        fields.append("")
    fields[index] = value


def _cleared(old: str) -> str | None:
    return "" if old else None


def _update(
    fields: list[str],
    path: FieldPath,
    d: Delimiters,
    fn: Callable[[str], str | None],
    create: bool,
) -> None:
    """Apply ``fn`` (old raw value -> new raw value, None: unchanged) to ``path`` in every
    repetition; ``create``: write it even where the field or component is absent."""
    index = path.index
    if index >= len(fields):
        if not create:
            return
        _write(fields, index, "")
    old = fields[index]
    new = fn(old) if path.component is None else _in_components(old, path, d, fn, create)
    if new is not None:
        fields[index] = new


def _in_components(
    old: str, path: FieldPath, d: Delimiters, fn: Callable[[str], str | None], create: bool
) -> str | None:
    """A field's raw value with ``fn`` applied to ``path``'s component (subcomponent) in every
    repetition; None when nothing changed."""
    assert path.component is not None
    if not old and not create:
        return None
    reps = old.split(d.repetition)
    changed = False
    c = path.component - 1
    for r, rep in enumerate(reps):
        comps = rep.split(d.component)
        if c >= len(comps):
            if not create:
                continue
            comps.extend([""] * (c + 1 - len(comps)))
        if path.subcomponent is None:
            new = fn(comps[c])
            if new is None:
                continue
            comps[c] = new
        else:
            subs = comps[c].split(d.subcomponent)
            s = path.subcomponent - 1
            if s >= len(subs):
                if not create:
                    continue
                subs.extend([""] * (s + 1 - len(subs)))
            new = fn(subs[s])
            if new is None:
                continue
            subs[s] = new
            comps[c] = d.subcomponent.join(subs)
        reps[r] = d.component.join(comps)
        changed = True
    return d.repetition.join(reps) if changed else None


def _literal(value: str, target: FieldPath, msg: _Message) -> str:
    """A literal or mapped value as the text of the message: escaped; worked on as bytes, in the
    message's own charset (refused when it has no place there)."""
    escaped = msg.d.escape_text(value)
    if escaped.isascii() or msg.codec != "latin-1":
        return escaped  # decoded text: the final encoding (and its unmappable rule) decides
    try:
        return escaped.encode(msg.source).decode("latin-1")
    except UnicodeEncodeError as exc:
        raise ProfileRefusal(
            target.text,
            value,
            f"has a character ({escaped[exc.start]!r}) that the message's character set"
            f" ({msg.source}) does not have; declare charset",
        ) from None


def _fit(raw: str, target: FieldPath, d: Delimiters) -> str:
    """A raw value copied into ``target``: the separators it cannot hold escaped."""
    if target.component is None:
        return raw
    pairs = [(d.repetition, "R"), (d.component, "S")]
    if target.subcomponent is not None:
        pairs.append((d.subcomponent, "T"))
    e = d.escape
    for ch, code in pairs:
        if ch in raw:
            raw = raw.replace(ch, f"{e}{code}{e}")
    return raw


#: Codecs of one byte per character.
_SINGLE_BYTE = frozenset({"latin-1", *(c for c in _ASCII_SAFE if c != "utf-8")})


def _utf8_cut(data: bytes) -> int:
    """How many bytes of ``data`` (a cut of UTF-8) hold whole characters."""
    back = len(data)
    while back > 0 and 0x80 <= data[back - 1] < 0xC0:  # continuation bytes
        back -= 1
    if back == 0:
        return len(data) if not data or data[0] < 0x80 else 0
    lead = data[back - 1]
    if lead < 0xC0:
        return len(data)  # ASCII (or stray continuation bytes kept as they are)
    size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if len(data) - (back - 1) >= size else back - 1


def _truncated(old: str, limit: int, msg: _Message) -> str | None:
    """``old`` cut to at most ``limit`` bytes in the encoding sent, never inside a character or
    an escape sequence; None when it fits."""
    codec = msg.out_codec
    if codec in _SINGLE_BYTE and msg.errors != _TRANSLIT:
        if len(old) <= limit:
            return None
        text = old[:limit]
        if msg.codec == "latin-1" and msg.source in ("utf-8", "ascii"):
            # the characters' bytes (an undeclared message's high bytes are most often UTF-8)
            text = text[: _utf8_cut(text.encode("latin-1"))]
    else:
        encoded = old.encode(codec, msg.errors)
        if len(encoded) <= limit:
            return None
        cut = encoded[:limit]
        if codec == "utf-8":
            text = cut[: _utf8_cut(cut)].decode("utf-8", "surrogateescape")
        else:
            text = _prefix_text(cut, codec)
    e = msg.d.escape
    if text.count(e) % 2:  # an escape sequence was opened and not closed: cut before it
        text = text[: text.rfind(e)]
    return text


def _prefix_text(cut: bytes, codec: str) -> str:
    """Bytes of a multi-byte encoding back to text; a character cut in two is left out."""
    for drop in range(4):
        try:
            return cut[: len(cut) - drop].decode(codec)
        except UnicodeDecodeError:
            continue
    return cut.decode(codec, "surrogateescape")


def _mapped(old: str, vmap: ValueMap, msg: _Message, ctx: _Context) -> str | None:
    """A value looked up in a map's table (None: unchanged). An empty value is looked up only
    when the table has the key ``""``."""
    if not old:
        if "" not in vmap.table:
            return None
        written = ctx.literals.get(vmap.table[""])
        if written is None:
            written = ctx.literals[vmap.table[""]] = _literal(vmap.table[""], vmap.path, msg)
        return written
    d = msg.d
    value = d.unescape_text(old) if d.escape in old else old
    if msg.codec == "latin-1" and not value.isascii():
        value = value.encode("latin-1").decode(msg.source, "replace")
    found = vmap.table.get(value)
    if found is not None:
        written = ctx.literals.get(found)
        if written is None:
            written = ctx.literals[found] = _literal(found, vmap.path, msg)
        return written
    if vmap.otherwise == "keep":
        return None
    if vmap.otherwise == "clear":
        return ""
    raise ProfileRefusal(vmap.path.text, value, "has no entry in the map (otherwise: hold)")
