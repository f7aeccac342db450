"""The named-query loader (inturn.worker.store.queries): blocks by name, and fragments composed
into the queries that include them when a file is loaded."""

from __future__ import annotations

import pytest

from inturn.worker.errors import Invalid
from inturn.worker.store.queries import load, parse

TEXT = """-- a file's preamble, no query
-- fragment: guard
-- what the guard does
UPDATE t
   SET n = n + 1
RETURNING 1 AS held

-- name: one
WITH g AS (
    -- include: guard
)
SELECT held FROM g;

-- name: two
-- include: guard
"""


def test_a_fragment_is_composed_in_place_indented_as_its_include_line() -> None:
    queries = parse(TEXT)
    assert sorted(queries) == ["one", "two"]  # the fragment is no query
    assert queries["one"] == (
        "WITH g AS (\n"
        "    UPDATE t\n"
        "       SET n = n + 1\n"
        "    RETURNING 1 AS held\n"
        ")\n"
        "SELECT held FROM g;"
    )
    assert queries["two"] == (
        "UPDATE t\n   SET n = n + 1\nRETURNING 1 AS held"  # its comment line stays in the file
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", "query 'a' is defined twice"),
        (
            "-- fragment: f\nx\n-- fragment: f\ny\n-- name: a\n-- include: f\n",
            "fragment 'f' is defined twice",
        ),
        ("-- name: a\n-- include: nothing\n", "includes 'nothing', no fragment here"),
        (
            "-- fragment: f\n-- include: g\n-- fragment: g\nx\n-- name: a\n-- include: f\n",
            "fragment 'f' includes another",
        ),
        ("-- fragment: f\nx\n-- name: a\nSELECT 1;\n", "fragment 'f' is included nowhere"),
    ],
)
def test_a_file_whose_fragments_do_not_add_up_is_refused(text: str, message: str) -> None:
    with pytest.raises(Invalid, match=message):
        parse(text)


#: The lease guard's check of holder, epoch and expiry under a share lock of the lease row, as
#: composed into every guarded statement (its renewing and checking forms alike).
CHECKED = (
    "(SELECT FROM inturn_lease\n"
    "                    WHERE destination = %(destination)s AND holder = %(holder)s\n"
    "                      AND epoch = %(epoch)s AND expires_at > clock_timestamp()"
    " AND NOT %(renew)s\n"
    "                      AND set_config('synchronous_commit', 'on', true) = 'on'\n"
    "                      FOR SHARE) AS checked\n"
    ")"
)


def test_the_worker_statements_share_one_lease_guard() -> None:
    """Every statement of queue.sql that touches the lease is composed with the one guard text:
    renewed by holder and epoch, the transaction made synchronous (pooler-safe)."""
    queue = load("queue.sql")
    guarded = sorted(name for name, query in queue.items() if "inturn_lease" in query)
    assert guarded == sorted(
        ["head", "succeeded_next", "succeeded_next_expecting", "retry", "succeeded", "gave_up",
         "sender_changed", "pending_window", "take", "make_due", "make_due_unreachable",
         "pull_lock", "pull", "pull_unlinked", "reserve_sequence",
         "mark_remembered"]
    )  # fmt: skip
    guard = (
        "renewed AS (\n"
        "    UPDATE inturn_lease\n"
        "       SET expires_at = clock_timestamp() + make_interval(secs => ttl_seconds)\n"
        "     WHERE destination = %(destination)s AND holder = %(holder)s AND epoch = %(epoch)s\n"
        "       AND %(renew)s AND set_config('synchronous_commit', 'on', true) = 'on'\n"
        "    RETURNING 1 AS held\n"
        "),\n"
        "lease AS (\n"
        "    SELECT held FROM renewed\n"
        "    UNION ALL\n"
        "    SELECT 1 FROM " + CHECKED
    )
    for name in guarded:
        # renewed (an UPDATE) when "renew", else checked under a share lock (issue 43)
        assert queue[name].count("inturn_lease") == 2, name
        assert queue[name].startswith("WITH\n") or "\nWITH\n" in queue[name], name
        assert guard in queue[name], name
    assert not any("-- include:" in query for query in queue.values())


#: psycopg converts a query's placeholders once and caches the result only for a query of at
#: most this many bytes (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH, 4096 in psycopg 3.3); a
#: longer one is parsed again in Python at every execution (about 100 us a message, issue 43).
PSYCOPG_CACHED_QUERY_BYTES = 4096


def test_the_per_message_statements_stay_within_psycopgs_query_cache() -> None:
    """Every statement of the worker's queue (the single stream's and the lanes', per message
    or per pull; the lease guard included: the text sent) stays short enough for psycopg to
    cache its conversion. The lanes' take was 5,029 bytes with its comments, parsed again at
    every turn; comment lines are no longer sent."""
    queue = load("queue.sql")
    assert {"head", "succeeded_next", "pull", "pending_window", "take"} <= set(queue)
    too_long = {n: len(q.encode()) for n, q in queue.items()}
    assert {n: b for n, b in too_long.items() if b > PSYCOPG_CACHED_QUERY_BYTES} == {}


def test_comment_lines_are_not_sent() -> None:
    """A line holding only a comment stays in the file, not in the statement; a comment after
    code on its line stays (its ``--`` could be inside a literal)."""
    text = (
        "-- name: one\n-- what it does\nSELECT 1,  -- the first\n    -- why\n  2\n"
        "-- fragment: f\n-- the fragment's own note\nx\n"
        "-- name: two\nSELECT\n  -- include: f\n"
    )
    assert parse(text) == {"one": "SELECT 1,  -- the first\n  2", "two": "SELECT\n  x"}


def test_every_shipped_file_composes() -> None:
    """Each .sql file of the package loads: its fragments are defined once, each is included,
    and no include line is left in a statement (the same texts the EXPLAIN test plans)."""
    from importlib import resources

    names = [
        entry.name
        for entry in resources.files("inturn.worker.store").joinpath("sql").iterdir()
        if entry.name.endswith(".sql")
    ]
    assert "queue.sql" in names and "ingest.sql" in names
    for name in names:
        assert not any("-- include:" in query for query in load(name).values()), name


def test_between_renewals_the_worker_sends_the_guard_without_its_update() -> None:
    """The per-message statements' checking forms (delivery.CHECKING, sent with ``renew``
    false): the lease guard's share-locked check alone, no UPDATE of the lease carried along
    (its executor start cost about 35,000 instructions a message, issue 43); the rest of each
    statement as composed, within psycopg's cache."""
    from inturn.worker.store import delivery

    queue = load("queue.sql")
    assert set(delivery.CHECKING) == set(delivery.RENEWABLE)
    assert set(delivery.CHECKING_BEFORE_0057) == set(delivery.BEFORE_0057)
    check = "lease AS (\n    SELECT 1 AS held FROM " + CHECKED
    forms = {**delivery.CHECKING, **{f"{n} before 0057": q for n, q in
                                     delivery.CHECKING_BEFORE_0057.items()}}  # fmt: skip
    for name, query in forms.items():
        assert query.count("inturn_lease") == 1, name
        assert "renewed" not in query and "UPDATE inturn_lease" not in query, name
        assert check in query, name
        assert len(query.encode()) <= PSYCOPG_CACHED_QUERY_BYTES, name
    for name in delivery.RENEWABLE:  # the same statement after the guard
        after = queue[name][queue[name].index("FOR SHARE) AS checked\n)") :]
        assert delivery.CHECKING[name].endswith(after), name
    with pytest.raises(ValueError):
        delivery.checking(queue["poll_head"])  # no guard to take the UPDATE out of
