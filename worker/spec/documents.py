"""Reading YAML and JSON documents with bounds: every configuration file inturn reads
(Destination manifests, worker configurations, feeds and channel declarations, ingest
credentials, console users) goes through :func:`load_documents`, so that no file can make a
command spend unbounded memory or time, or crash it with a traceback.

What is bounded (each a module constant, each refused with a one-line :class:`DocumentError`
naming the line where it can):

- the bytes of a file (:data:`MAX_DOCUMENT_BYTES`);
- the depth of nesting (:data:`MAX_DEPTH`): PyYAML composes recursively, so 10,000 levels would
  end in a ``RecursionError`` far down the stack;
- the size of the data once aliases are expanded (:data:`MAX_EXPANDED_NODES`), counted without
  expanding it: a kilobyte of nested aliases (the "billion laughs") describes billions of nodes
  that a validator would then walk;
- the time spent parsing (:data:`MAX_PARSE_SECONDS`);
- a key given twice in one mapping is refused, as Kubernetes' strict field validation refuses
  it, instead of the last value silently winning.

JSON is read by the same parser (JSON is YAML 1.2's flow style), so JSON files have the same
bounds. Source: YAML 1.1 (PyYAML's safe schema); the Kubernetes API conventions' strict field
validation (duplicate fields are errors).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from inturn.worker.errors import Invalid

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_EXPANDED_NODES",
    "MAX_PARSE_SECONDS",
    "DocumentError",
    "iter_documents",
    "load_documents",
    "read_document",
    "read_documents",
]

#: Largest file read, bytes (a manifest of a few hundred Destinations is well under 1 MiB).
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
#: Deepest nesting of mappings and sequences.
MAX_DEPTH = 64
#: Most scalars, mappings and sequences the documents of one file hold once every alias is
#: expanded (a 4 MiB file of plain text holds far fewer).
MAX_EXPANDED_NODES = 1_000_000
#: Longest parse of one file, seconds.
MAX_PARSE_SECONDS = 20.0


class DocumentError(Invalid):
    """A file that is not a document inturn will read: not UTF-8, not YAML, or past a bound.
    The message is one line (``line N: ...`` where the parser knows the line)."""

    kind = "invalid_document"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the bounds of the module docstring (depth and time while
    composing; duplicate keys while constructing)."""

    def __init__(self, stream: str, deadline: float) -> None:
        super().__init__(stream)
        self._depth = 0
        self._deadline = deadline

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise DocumentError(
                    f"{_line(self.peek_event())}: nested deeper than {MAX_DEPTH} levels"  # type: ignore[no-untyped-call]
                )
            if time.monotonic() > self._deadline:
                raise DocumentError(f"parsing took longer than {MAX_PARSE_SECONDS:g} s")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

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


def _expanded_size(docs: list[Any]) -> int:
    """Nodes of ``docs`` with every shared object counted each time it is referenced (what an
    alias-expanding walk would visit), computed once per distinct object; stops counting past
    :data:`MAX_EXPANDED_NODES`."""
    memo: dict[int, int] = {}

    def size(value: Any) -> int:
        if isinstance(value, dict | list):
            known = memo.get(id(value))
            if known is not None:
                return known
            memo[id(value)] = MAX_EXPANDED_NODES + 1  # a cycle counts as too large
            items = list(value.items()) if isinstance(value, dict) else value
            total = 1
            for item in items:
                total += size(item[1]) if isinstance(value, dict) else size(item)
                if total > MAX_EXPANDED_NODES:
                    break
            memo[id(value)] = total
            return total
        return 1

    total = 0
    for doc in docs:
        total += size(doc)
        if total > MAX_EXPANDED_NODES:
            break
    return total


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
    try:
        while loader.check_data():  # type: ignore[no-untyped-call]
            docs.append(loader.get_data())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "line ?"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DocumentError(f"{where}: not valid YAML ({problem})") from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    if _expanded_size(docs) > MAX_EXPANDED_NODES:
        raise DocumentError(
            f"its aliases expand to more than {MAX_EXPANDED_NODES:,} values (nested aliases?)"
        )
    return docs


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
