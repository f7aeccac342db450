"""Reading YAML and JSON documents with bounds: every configuration file inturn reads
(Destination manifests, worker configurations, feeds and channel declarations, ingest
credentials, console users) goes through :func:`load_documents`, so that no file can make a
command spend unbounded memory or time, or crash it with a traceback.

What is bounded (each a module constant, each refused with a one-line :class:`DocumentError`
naming the line where it can):

- the bytes of a file (:data:`MAX_DOCUMENT_BYTES`);
- the depth of nesting (:data:`MAX_DEPTH`): PyYAML composes recursively, so 10,000 levels would
  end in a ``RecursionError`` far down the stack;
- the values composed (:data:`MAX_EXPANDED_NODES`), counted while the parser composes them, so
  that a file of a million tiny values stops at the bound instead of holding them all;
- the alias references (:data:`MAX_ALIASES`) and the size of the data once aliases and merge
  keys (``<<``) are expanded (:data:`MAX_EXPANDED_NODES` again), counted on the composed node
  graph *before* anything is constructed: a kilobyte of nested aliases (the "billion laughs")
  describes billions of nodes that a validator would then walk, and a few hundred merges of one
  large mapping make PyYAML copy its pairs into every one of them (a 150 KB file took 34 s and
  1.5 GiB before this check; pyyaml issue #897 is the nested form);
- the time spent parsing and constructing (:data:`MAX_PARSE_SECONDS`);
- a key given twice in one mapping is refused, as Kubernetes' strict field validation refuses
  it, instead of the last value silently winning.

JSON documents (a Destination's JSON, a worker configuration) are read by the same parser (JSON is
YAML 1.2's flow style), so they have the same bounds; files and request bodies that are JSON
only (a bookings import, the console API's bodies) go through :func:`load_json`, with the same
bounds but the standard library's parser. Objects that arrive already parsed (a Destination as
the API server stores it, for the operator) are checked by :func:`check_shape` (depth and size)
before anything walks them recursively. PyYAML has no option for any of these bounds (its loaders
expand merges and follow aliases without a limit), so they are enforced here, on its composer and
constructor. Source: YAML 1.1 (PyYAML's safe schema); the Kubernetes API conventions' strict field
validation (duplicate fields are errors).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from inturn.worker.errors import Invalid

__all__ = [
    "MAX_ALIASES",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_EXPANDED_NODES",
    "MAX_PARSE_SECONDS",
    "DocumentError",
    "check_shape",
    "iter_documents",
    "load_documents",
    "load_json",
    "read_document",
    "read_documents",
]

#: Largest file read, bytes (a manifest of a few hundred Destinations is well under 1 MiB).
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
#: Deepest nesting of mappings and sequences.
MAX_DEPTH = 64
#: Most scalars, mappings and sequences the documents of one file hold, composed and once every
#: alias and merge is expanded (a Destination manifest holds 25 to 90, so 2,000 fit; the pure
#: Python parser holds about 1 KiB and spends about 20 us per value while composing).
MAX_EXPANDED_NODES = 100_000
#: Most alias references (``*name``) in one file.
MAX_ALIASES = 1_000
#: Longest parse (and construction) of one file, seconds.
MAX_PARSE_SECONDS = 10.0


class DocumentError(Invalid):
    """A file that is not a document inturn will read: not UTF-8, not YAML, or past a bound.
    The message is one line (``line N: ...`` where the parser knows the line)."""

    kind = "invalid_document"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the bounds of the module docstring (depth, values, aliases and
    time while composing; time and duplicate keys while constructing)."""

    def __init__(self, stream: str, deadline: float) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0
        self._aliases = 0
        self._deadline = deadline

    def _in_time(self) -> None:
        if time.monotonic() > self._deadline:
            raise DocumentError(f"parsing took longer than {MAX_PARSE_SECONDS:g} s")

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._composed += 1
        try:
            if self._depth > MAX_DEPTH:
                raise DocumentError(
                    f"{_line(self.peek_event())}: nested deeper than {MAX_DEPTH} levels"  # type: ignore[no-untyped-call]
                )
            if self._composed > MAX_EXPANDED_NODES:
                raise DocumentError(
                    f"{_line(self.peek_event())}: more than {MAX_EXPANDED_NODES:,} values"  # type: ignore[no-untyped-call]
                )
            if self.check_event(yaml.AliasEvent):
                self._aliases += 1
                if self._aliases > MAX_ALIASES:
                    raise DocumentError(
                        f"{_line(self.peek_event())}: more than {MAX_ALIASES:,} aliases"  # type: ignore[no-untyped-call]
                    )
            self._in_time()
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        self._in_time()
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    earlier = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor says so
                if earlier is not None:
                    raise DocumentError(
                        f"{_line(key_node)}: key {str(key)[:80]!r} given twice (first on"
                        f" {_line(earlier)}); a key may appear once in a mapping"
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _line(node_or_event: Any) -> str:
    mark = getattr(node_or_event, "start_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "line ?"


def _measure(root: Any, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """``(values, levels)`` of a composed node graph with every alias (and merge, whose value is
    an alias or a list of them) counted each time it is referenced, as constructing would copy
    or a walk would visit them: the values, and the depth of nesting once aliases are followed
    (an alias of a deep node placed deep nests deeper than either). Computed once per distinct
    node (``memo``), so measuring costs the size of the file, not of the expansion; stops
    counting past the bounds. A cycle (an alias inside its own anchor) counts as too large.
    Recursion is bounded by :data:`MAX_DEPTH` (checked while composing)."""
    known = memo.get(id(root))
    if known is not None:
        return known
    if isinstance(root, yaml.ScalarNode):
        return 1, 0
    memo[id(root)] = (MAX_EXPANDED_NODES + 1, MAX_DEPTH + 1)  # in progress: a cycle
    values, levels = 1, 1
    children: Any = root.value
    if isinstance(root, yaml.MappingNode):
        children = (part for pair in root.value for part in pair)
    for child in children:
        child_values, child_levels = _measure(child, memo)
        values += child_values
        levels = max(levels, child_levels + 1)
        if values > MAX_EXPANDED_NODES or levels > MAX_DEPTH:
            break
    memo[id(root)] = (values, levels)
    return values, levels


def load_documents(text: str) -> list[Any]:
    """Every document of ``text`` (YAML, one or more ``---``-separated documents, or JSON), as
    plain dicts, lists and scalars; empty documents are ``None``.

    Raises:
        DocumentError: past a bound of the module docstring, a key given twice, or not YAML.
    """
    if len(text) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB")
    loader = _BoundedLoader(text, time.monotonic() + MAX_PARSE_SECONDS)
    docs: list[Any] = []
    expanded = 0
    memo: dict[int, tuple[int, int]] = {}
    try:
        while loader.check_node():
            node = loader.get_node()
            values, levels = _measure(node, memo)
            expanded += values
            # before constructing: nothing is expanded or copied yet
            if expanded > MAX_EXPANDED_NODES:
                raise DocumentError(
                    f"its aliases expand to more than {MAX_EXPANDED_NODES:,} values"
                    " (nested aliases or merges?)"
                )
            if levels > MAX_DEPTH:
                raise DocumentError(
                    f"its aliases nest deeper than {MAX_DEPTH} levels once expanded"
                )
            docs.append(loader.construct_document(node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "line ?"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DocumentError(f"{where}: not valid YAML ({problem})") from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    return docs


def check_shape(value: Any, *, what: str = "the document") -> None:
    """Check a value that arrived already parsed (JSON from the API server, a request body)
    against :data:`MAX_DEPTH` and :data:`MAX_EXPANDED_NODES`, without recursion (a walk of
    10,000 levels must not end in a ``RecursionError``).

    Raises:
        DocumentError: nested deeper, or holding more values, than the bounds.
    """
    count = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_EXPANDED_NODES:
            raise DocumentError(f"{what} holds more than {MAX_EXPANDED_NODES:,} values")
        if isinstance(item, Mapping) or (
            isinstance(item, Sequence) and not isinstance(item, str | bytes)
        ):
            if depth > MAX_DEPTH:
                raise DocumentError(f"{what} is nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DocumentError(f"key {key[:80]!r} given twice; a key may appear once in an object")
        out[key] = value
    return out


def load_json(data: bytes | str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """One JSON document (RFC 8259) with the bounds of the module docstring: at most
    ``max_bytes``, :data:`MAX_DEPTH` levels, :data:`MAX_EXPANDED_NODES` values, each member name
    once per object (RFC 8259 section 4 leaves duplicates to the reader; inturn refuses them).

    Raises:
        DocumentError: too large, not UTF-8, not JSON, or past a bound (one line).
    """
    if len(data) > max_bytes:
        raise DocumentError(f"larger than {_size(max_bytes)}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"byte {exc.start}: not UTF-8 text") from None
    try:
        doc = json.loads(data, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    check_shape(doc)
    return doc


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n:,} bytes"


def read_documents(path: str | Path) -> list[Any]:
    """:func:`load_documents` of a file, read at most :data:`MAX_DOCUMENT_BYTES` + 1 bytes.

    Raises:
        DocumentError: too large, not UTF-8, or as :func:`load_documents`.
        OSError: the file cannot be read.
    """
    with Path(path).open("rb") as f:
        data = f.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"byte {exc.start}: not UTF-8 text") from None
    return load_documents(text)


def iter_documents(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(1-based number, document)`` of every non-empty document of the file at ``path``.

    Raises:
        DocumentError, OSError: as :func:`read_documents`.
    """
    for i, doc in enumerate(read_documents(path), start=1):
        if doc is not None:
            yield i, doc


def read_document(path: str | Path) -> Any:
    """The one document of the file at ``path`` (``None`` when it is empty).

    Raises:
        DocumentError: more than one document, or as :func:`read_documents`.
        OSError: the file cannot be read.
    """
    docs = [d for d in read_documents(path) if d is not None]
    if len(docs) > 1:
        raise DocumentError(f"{len(docs)} documents where one is expected")
    return docs[0] if docs else None
