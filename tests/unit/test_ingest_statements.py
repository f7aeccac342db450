"""Ingest's store statements run for every batch: psycopg converts a query's ``%(name)s``
placeholders once and caches the result only for queries under its limit (about 80 us a call
for the store statement without the cache). Sent compacted, each stays under it."""

from __future__ import annotations

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from inturn.worker.store import ingest


def test_the_store_statements_fit_psycopgs_conversion_cache() -> None:
    sizes = {
        name: len(query.encode())
        for name, query in (
            ("store_log", ingest.STORE_LOG),
            ("reserve_log", ingest.RESERVE_LOG),
            ("store_log_sealed", ingest.STORE_LOG_SEALED),
        )
    }
    assert all(size <= MAX_CACHED_STATEMENT_LENGTH for size in sizes.values()), sizes


def test_compacting_drops_comments_and_blank_runs_only() -> None:
    query = "-- a comment\nSELECT a,   b\n      FROM t  -- trailing stays\n\n WHERE x = ','\n"
    assert ingest.compact_query(query) == "SELECT a, b\nFROM t -- trailing stays\nWHERE x = ','"
