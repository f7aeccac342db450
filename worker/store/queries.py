"""Named SQL queries loaded from the ``.sql`` files shipped in ``inturn.worker.store.sql``.

A file holds blocks that each start with a line ``-- name: <query_name>``; the text up to the
next such line is the query (comments included, which Postgres ignores).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file's text into ``{name: query}``.

    Raises:
        ValueError: a name appears twice.
    """
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
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
