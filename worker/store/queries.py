"""Named SQL queries loaded from the ``.sql`` files shipped in ``inturn.worker.store.sql``, and
the helpers that run them and read rows by column name.

A file holds blocks that each start with a line ``-- name: <query_name>``; the text up to the
next such line is the query; the lines that hold only a comment explain it in the file and are
left out of the text sent (:func:`parse`). Every statement the
package sends lives in one of these files, so the test that EXPLAINs every named query covers
them all.

A block that starts with ``-- fragment: <name>`` instead is a piece of text several statements
share (the lease guard of the worker's statements): no query of its own. :func:`parse` puts it
in place of each line ``-- include: <name>`` of the file's queries, indented as that line is,
so the composing happens once per file when it is loaded, and the statements sent (and
EXPLAINed) are the composed ones, the same text as if written out in each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, LiteralString, TypeVar

from psycopg import AsyncConnection
from psycopg.rows import BaseRowFactory

from inturn.worker.errors import Invalid

R = TypeVar("R")

_HEADER = re.compile(r"^-- (name|fragment): ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^([ \t]*)-- include: ([a-z_][a-z0-9_]*)[ \t]*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file's text into ``{name: query}``, its fragments composed in.

    Lines that hold only a comment are left out of each query (see :func:`_uncommented`).
    Each ``-- include: <fragment>`` line of a query is replaced by the fragment's text, every
    line of it indented as the include line is. Fragments are not returned.

    Raises:
        Invalid: a query or fragment name appears twice, a query includes a fragment the file
            does not define, a fragment includes another, or a fragment is included nowhere.
    """
    parts = _HEADER.split(text)
    blocks: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if name in blocks[kind]:
            raise Invalid(f"{'query' if kind == 'name' else kind} {name!r} is defined twice")
        blocks[kind][name] = body.strip()
    fragments = blocks["fragment"]
    for name, body in fragments.items():
        if _INCLUDE.search(body):
            raise Invalid(f"fragment {name!r} includes another fragment")
    used: set[str] = set()
    queries: dict[str, str] = {}
    for name, body in blocks["name"].items():
        for match in _INCLUDE.finditer(body):
            if match.group(2) not in fragments:
                raise Invalid(f"query {name!r} includes {match.group(2)!r}, no fragment here")
            used.add(match.group(2))
        composed = _INCLUDE.sub(lambda m: _indented(fragments[m.group(2)], m.group(1)), body)
        queries[name] = _uncommented(composed)
    if unused := sorted(fragments.keys() - used):
        raise Invalid(f"fragment {unused[0]!r} is included nowhere")
    return queries


def _uncommented(text: str) -> str:
    """``text`` without its lines that hold only a comment (``--`` after blanks): they explain
    the statement in its file, and sent they would only lengthen it (psycopg caches the
    conversion of a query of at most 4,096 bytes, and parses a longer one again at every
    execution). Comments after code on a line stay (a ``--`` may be inside a literal there)."""
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("--"))


def _indented(text: str, indent: str) -> str:
    """``text`` with ``indent`` before each of its lines that is not empty."""
    return "\n".join(indent + line if line else line for line in text.split("\n"))


@cache
def load(filename: str) -> dict[str, LiteralString]:
    """Return the named queries of ``sql/<filename>`` in the package (cached).

    Raises:
        FileNotFoundError: no such file in the package.
    """
    text = resources.files("inturn.worker.store").joinpath("sql", filename).read_text("utf-8")
    # The files ship with the package and are not user input: they are literal SQL.
    return dict(parse(text).items())


async def fetch_one(
    conn: AsyncConnection[Any],
    query: LiteralString,
    params: Mapping[str, Any] | None = None,
    *,
    row: BaseRowFactory[R],
    prepare: bool | None = None,
    binary: bool = False,
) -> R | None:
    """Run ``query`` and return its first row built by ``row`` (``dict_row``, ``class_row(X)``),
    or None when it returned no row. Columns are read by name, never by position.

    ``prepare=False`` plans the query with the values given each time (for the static queries
    with optional filters, whose best plan depends on which filters are set). ``binary=True``
    has the row sent in binary form (the same Python values): a payload travels as its own
    bytes, not as twice as many hex digits that the server writes and the client reads back.

    Raises:
        psycopg.Error: the query failed.
    """
    async with conn.cursor(row_factory=row, binary=binary) as cur:
        await cur.execute(query, params, prepare=prepare)
        return await cur.fetchone()


async def fetch_all(
    conn: AsyncConnection[Any],
    query: LiteralString,
    params: Mapping[str, Any] | None = None,
    *,
    row: BaseRowFactory[R],
    prepare: bool | None = None,
) -> list[R]:
    """Run ``query`` and return all its rows built by ``row`` (see :func:`fetch_one`).

    Raises:
        psycopg.Error: the query failed.
    """
    async with conn.cursor(row_factory=row) as cur:
        await cur.execute(query, params, prepare=prepare)
        return await cur.fetchall()
