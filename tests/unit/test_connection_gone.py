"""One classification of "this connection is gone", as a table over every SQLSTATE.

``inturn.worker.store.faults.connection_gone`` decides, for ingest's store (retry on a fresh
connection), the pools (check the idle ones), the worker's loop (reconnect) and every command's
one-line error. The table below names the codes of PostgreSQL's Appendix A that end a session;
every other documented code must not.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
from psycopg import errors

from inturn.worker.cli import database_error
from inturn.worker.store.faults import classify, classify_step, connection_gone

#: The documented codes after which the server has ended the session (class 08 is gone whole).
ENDS_SESSION = {"57P01", "57P02", "57P04", "57P05", "25P03", "25P04"}


def errcodes_files() -> list[Path]:
    """PostgreSQL's own errcodes.txt where a server is installed here (pgserver, Debian)."""
    found = sorted(Path("/usr/share/postgresql").glob("*/errcodes.txt"))
    try:
        import pgserver

        found += sorted(Path(pgserver.__file__).parent.glob("pginstall/share/**/errcodes.txt"))
    except ImportError:
        pass
    return found


def documented_codes() -> list[str]:
    """Every error SQLSTATE: psycopg's table (generated from PostgreSQL's errcodes.txt) and the
    errcodes.txt of every PostgreSQL installed here (which may know codes psycopg does not)."""
    table: dict[str, object] = errors._sqlcodes
    codes = {code for code in table if re.fullmatch(r"[0-9A-Z]{5}", code)}
    for path in errcodes_files():
        for line in path.read_text().splitlines():
            if re.match(r"^[0-9A-Z]{5}\s+E\s", line):  # errors; W and S are no exceptions
                codes.add(line.split()[0])
    return sorted(codes)


def error_for(code: str) -> psycopg.Error:
    """An exception as psycopg raises it for ``code`` (its own class, or for a code it does not
    know, a DatabaseError carrying the code)."""
    try:
        return errors.lookup(code)(f"a server error {code}")
    except KeyError:
        unknown = type(f"Unknown{code}", (psycopg.DatabaseError,), {"sqlstate": code})
        return unknown(f"a server error {code}")  # type: ignore[no-any-return]


def test_the_table_is_the_documented_list() -> None:
    codes = documented_codes()
    assert len(codes) > 240
    assert {"57P05", "25P03", "08006", "22P07", "XX000"} <= set(codes)


@pytest.mark.parametrize("code", documented_codes())
def test_every_documented_sqlstate(code: str) -> None:
    exc = error_for(code)
    assert exc.sqlstate == code
    gone = code[:2] == "08" or code in ENDS_SESSION
    assert connection_gone(exc) is gone
    assert connection_gone(exc, closed=True) is True  # a closed connection wins over any code
    expected = "dead" if gone else "permanent" if code[:2] in {"22", "54"} else "transient"
    assert classify(exc).fault == expected
    for step in ("session", "head", "attempt", "mark", "give_up"):
        action = classify_step(step, exc, connection_closed=False).action  # type: ignore[arg-type]
        assert (action == "reconnect") is gone
    words = database_error(exc)
    if gone:
        assert words.startswith("the database connection was lost (")
        assert f"SQLSTATE {code}" in words
    else:
        assert "connection was lost" not in words


@pytest.mark.parametrize(
    ("exc", "gone"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.OperationalError("consuming input failed: EOF"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg.InterfaceError("cursor already closed"), True),
        # a pool's own errors: no connection was handed out, none was lost
        (psycopg_pool.PoolTimeout("couldn't get a connection after 10 sec"), False),
        (psycopg_pool.TooManyRequests("the pool has already 10 requests waiting"), False),
        (psycopg_pool.PoolClosed("the pool is closed"), False),
        # psycopg's own refusals before any server: the session is fine
        (psycopg.ProgrammingError("query parameters mismatch"), False),
        (psycopg.DataError("cannot dump"), False),
        # not a database error at all
        (TimeoutError(), False),
        (OSError("connection reset"), False),
        (RuntimeError("else"), False),
    ],
    ids=lambda v: type(v).__name__ + (f"-{v}"[:30] if isinstance(v, BaseException) else ""),
)
def test_errors_without_a_sqlstate(exc: BaseException, gone: bool) -> None:
    assert connection_gone(exc) is gone
    assert classify(exc).fault == ("dead" if gone else "transient")


def test_the_cli_says_lost_not_database_error_for_an_idle_timeout() -> None:
    assert database_error(errors.IdleInTransactionSessionTimeout("terminating")).startswith(
        "the database connection was lost (IdleInTransactionSessionTimeout, SQLSTATE 25P03)"
    )
    assert database_error(
        psycopg.OperationalError("connection failed: Connection refused")
    ).startswith("cannot reach the database: connection failed")
    assert database_error(errors.QueryCanceled("canceling statement")).startswith(
        "the database did not finish in time"
    )
    assert database_error(errors.UndefinedTable("relation")).endswith("run `inturn migrate`")
    assert database_error(errors.UniqueViolation("duplicate key")).startswith("database error:")
