"""Named SQL queries loaded from the ``.sql`` files shipped in ``inturn.worker.store.sql``, and
the helpers that run them and read rows by column name.

A file holds blocks that each start with a line ``-- name: <query_name>``; the text up to the
next such line is the query (comments included, which Postgres ignores). Every statement the
package sends lives in one of these files, so the test that EXPLAINs every named query covers
them all.
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

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file's text into ``{name: query}``.

    Raises:
        Invalid: a name appears twice.
    """
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise Invalid(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


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
