"""Storage faults: the one list of which database errors a retry can fix and which it cannot.

Ingest answers from this list (HL7 v2.x chapter 2: AE "send it again" only where sending it
again can work; AR where it cannot), and the store retries from it. Error classes are the
SQLSTATE classes of PostgreSQL's "Appendix A. PostgreSQL Error Codes"; the first two characters
name the class.

=================  ==========================================  ==============================
fault              what                                        answer
=================  ==========================================  ==============================
``dead``           the connection is gone                      retried at once on a fresh
                   (:func:`connection_gone`: psycopg lost the  connection; AE only if that
                   socket, class 08, a code with which the     fails as well
                   server ends a session such as 57P05 idle
                   session timeout, or a FATAL report)
``permanent``      the database refuses the message's own       AR with ERR (HTTP 400); never
                   content: class 22 (data exception: bad       retried
                   encoding, value too long, ...), 54
                   (program limit exceeded: an index row too
                   large, ...)
``transient``      everything else: the database is             AE with ERR (HTTP 503): the
                   unreachable or busy (pool timeout, 57P03     sender sends again later
                   cannot connect now, 53 insufficient
                   resources, 40 serialization failure /
                   deadlock, 55 lock not available, 57014
                   statement timeout), or misconfigured (42
                   privilege, 23 a constraint an operator
                   added: the store's own constraints cannot
                   be broken by content), or not listed here
=================  ==========================================  ==============================

An error not listed is transient on purpose: an AE asks the sender to keep the message, while a
wrong AR would make it drop a message that a later attempt could have stored.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

import psycopg

from inturn.worker.hl7.errors import ErrorCode
from inturn.worker.store import capacity

Fault = Literal["dead", "permanent", "transient"]

#: SQLSTATE classes (first two characters) whose errors are about the message's content.
PERMANENT_CLASSES: dict[str, tuple[int, str]] = {
    "22": (ErrorCode.DATA_TYPE_ERROR, "the database cannot hold a value of this message"),
    "54": (ErrorCode.VALUE_TOO_LONG, "a value of this message is too large to index"),
}
#: SQLSTATE classes whose every code means the connection itself is gone: class 08,
#: "Connection Exception" (PostgreSQL manual, Appendix A).
GONE_CLASSES = frozenset({"08"})
#: SQLSTATE codes of other classes with which the server ends the session (it reports them
#: with severity FATAL, then closes the socket): 57P01 admin shutdown (``pg_terminate_backend``,
#: a fast shutdown), 57P02 crash shutdown, 57P04 database dropped, 57P05 idle session timeout
#: (``idle_session_timeout``), 25P03 idle-in-transaction timeout
#: (``idle_in_transaction_session_timeout``), 25P04 transaction timeout
#: (``transaction_timeout``, PostgreSQL 17).
GONE_CODES = frozenset({"57P01", "57P02", "57P04", "57P05", "25P03", "25P04"})
#: Severities after which the server has ended the session, whatever the SQLSTATE
#: (PostgreSQL manual, "Message Severity Levels" and "Error and Notice Message Fields").
GONE_SEVERITIES = frozenset({"FATAL", "PANIC"})


class KeyStoreUnavailable(psycopg.OperationalError):
    """The key store (``--key-dsn``), not the queue's database, cannot be reached or lost its
    session twice in a row. A :class:`psycopg.OperationalError` (callers that report database
    errors still do), but never a sign that a *queue* connection is dead: ingest does not
    store again on a fresh queue connection for it, and says "key store" in its logs, its
    negative acknowledgement's text and ``/readyz``. Its message is one line."""


def connection_gone(exc: BaseException, *, closed: bool = False) -> bool:
    """Whether ``exc`` means the database connection it came from is gone: the one
    classification of a lost session, used by ingest's store (retry on a fresh connection),
    the pools, the worker's loop (:func:`classify_step`: reconnect and take the lock again)
    and every command's one-line error.

    Gone when any of these holds:

    * ``closed``: the caller saw ``conn.closed or conn.broken`` after the error;
    * psycopg lost the connection: :class:`psycopg.InterfaceError` (used after close), or an
      :class:`psycopg.OperationalError` with no SQLSTATE (socket closed, server restarted);
    * the SQLSTATE's class is in :data:`GONE_CLASSES` or the code in :data:`GONE_CODES`;
    * the server reported the error with severity ``FATAL`` or ``PANIC``: it ends the session
      after such a report whatever the code, so a code that a later PostgreSQL adds is gone too.

    A statement that failed while the session lives (a lock or statement timeout 55P03/57014,
    a full disk 53100, 57P03 at connect, a refused grant) is not gone, nor is a pool's own
    error (``PoolTimeout``, ``TooManyRequests``, ``PoolClosed``: no connection was handed out).

    Args:
        exc: the exception a statement, a connect or a pool raised.
        closed: the connection's own state after the error, when the caller has it.
    """
    if closed or isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, KeyStoreUnavailable):  # the key store's session, not the caller's
        return False
    if not isinstance(exc, psycopg.Error) or _pool_error(exc):
        return False
    sqlstate = exc.sqlstate
    if sqlstate is None:
        return isinstance(exc, psycopg.OperationalError)
    if sqlstate[:2] in GONE_CLASSES or sqlstate in GONE_CODES:
        return True
    return _severity(exc) in GONE_SEVERITIES


def _pool_error(exc: BaseException) -> bool:
    """Whether ``exc`` is psycopg_pool's own (they subclass ``OperationalError`` without a
    SQLSTATE). Only a process that loaded psycopg_pool can raise one; the worker, which has no
    pool, is spared loading it (about 0.5 MiB of its resident set)."""
    pool = sys.modules.get("psycopg_pool")
    return pool is not None and isinstance(
        exc, pool.PoolTimeout | pool.TooManyRequests | pool.PoolClosed
    )


def _severity(exc: psycopg.Error) -> str | None:
    """The server's untranslated severity of ``exc`` (``ERROR``, ``FATAL``, ...), or None for an
    error that did not come from a server's report (psycopg's own, or one made in a test)."""
    try:
        return exc.diag.severity_nonlocalized or exc.diag.severity
    except Exception:  # a diagnostic without a result behind it
        return None


@dataclass(frozen=True)
class Classified:
    """A storage error, classified.

    Attributes:
        fault: ``dead``, ``permanent`` or ``transient`` (see the module table).
        sqlstate: the SQLSTATE, or None.
        hl7_code: the table 0357 code for the ERR segment of the answer.
        text: a short, payload-free description for ERR-8 and logs.
    """

    fault: Fault
    sqlstate: str | None
    hl7_code: int
    text: str


def classify(exc: BaseException) -> Classified:
    """Classify an exception raised while storing a message (see the module table)."""
    sqlstate = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    name = type(exc).__name__
    if capacity.too_many(exc):  # up and full: never "connection lost" or "unreachable"
        return Classified(
            "transient", "53300", ErrorCode.APPLICATION_INTERNAL_ERROR, capacity.refused_text()
        )
    if isinstance(exc, KeyStoreUnavailable):
        cause = type(exc.__cause__).__name__ if exc.__cause__ else name
        text = f"key store unreachable ({cause})"
        return Classified("transient", None, ErrorCode.APPLICATION_INTERNAL_ERROR, text)
    if _pool_error(exc):
        return Classified(
            "transient", None, ErrorCode.APPLICATION_INTERNAL_ERROR, f"storage failed: {name}"
        )
    if connection_gone(exc):
        return Classified(
            "dead", sqlstate, ErrorCode.APPLICATION_INTERNAL_ERROR, f"connection lost ({name})"
        )
    if sqlstate is not None and sqlstate[:2] in PERMANENT_CLASSES:
        code, text = PERMANENT_CLASSES[sqlstate[:2]]
        return Classified("permanent", sqlstate, code, f"{text} (SQLSTATE {sqlstate})")
    detail = f"{name} (SQLSTATE {sqlstate})" if sqlstate else name
    return Classified(
        "transient", sqlstate, ErrorCode.APPLICATION_INTERNAL_ERROR, f"storage failed: {detail}"
    )


def refusal(exc: BaseException) -> str | None:
    """For a periodic statement of a long-running process (a lease's renewal, a purge of the
    duplicate window, a sweep): a one-line description when ``exc`` is a refusal that waiting
    can end (the database read-only or in recovery, 25006; a lock or statement timeout, 55P03
    and 57014; too many connections, 53300; cannot connect now, 57P03; the connection gone; a
    pool that timed out; a key store away): the process keeps running and tries again at its
    next turn. None for anything else (a bug, or a schema that is not there), which the caller
    lets end the process as before."""
    if capacity.too_many(exc):
        return capacity.refused_text()
    if isinstance(exc, KeyStoreUnavailable) or _pool_error(exc) or connection_gone(exc):
        return classify(exc).text
    if not isinstance(exc, psycopg.Error):
        return None
    sqlstate = exc.sqlstate or ""
    if sqlstate in SCHEMA_CODES:
        return None
    if isinstance(exc, psycopg.OperationalError) or sqlstate[:2] in REFUSAL_CLASSES:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"{type(exc).__name__} (SQLSTATE {sqlstate or '-'}): {first[:200]}"
    return None


#: SQLSTATE classes of refusals a wait can end, beside psycopg's OperationalError: 25 (invalid
#: transaction state: 25006 read-only transaction, what a maintenance window or a standby
#: answers), 40 (a serialization failure or deadlock), 42501 is not here (a missing grant
#: needs a person, and says so every time), 53 (insufficient resources), 55 (object not in
#: prerequisite state: lock not available), 57 (operator intervention: a cancelled statement,
#: cannot connect now).
REFUSAL_CLASSES = frozenset({"25", "40", "53", "55", "57"})


# --- the worker's loop -------------------------------------------------------------------------
#
# The worker holds one session, and with it the destination's lock: while that session lives,
# nobody else sends, so whatever the worker knows about the head stays true. A failed statement
# that leaves the session alive (a full disk, ``lock_timeout``, ``statement_timeout``, a
# serialization failure, a missing grant) is repeated on its own, after a backoff, and never
# turns into a second send; only a lost session ends what the worker knows.

#: A step of the worker's loop that talks to the database (see :func:`classify_step`).
Step = Literal["session", "head", "attempt", "mark", "give_up"]
#: What the loop does after a failed step: ``retry`` the step alone on the same session (it
#: still holds the lock), ``reconnect`` (the session, and the lock with it, are gone), or
#: ``stop`` (nothing was sent and nothing can be: the database has no inturn schema; the
#: process ends with the one-line error that says to run ``inturn migrate``).
StepAction = Literal["retry", "reconnect", "stop"]
#: What the failure means for the head: ``not_sent`` (nothing was sent), ``sent_failed`` (it
#: was sent and the receiver did not take it), ``delivered`` (the receiver took it),
#: ``may_resend`` (the next lock holder sends the head again if the mark did not commit: the
#: one duplicate a lost session can cost).
SendMeaning = Literal["not_sent", "sent_failed", "delivered", "may_resend"]

#: SQLSTATE codes that say the database has no inturn schema (or an old one): undefined
#: table, column, function or object (a type), invalid schema name.
SCHEMA_CODES = frozenset({"42P01", "42703", "42883", "42704", "3F000"})
#: Steps before any send, which stop on :data:`SCHEMA_CODES` instead of waiting for a fix.
BEFORE_SEND: frozenset[Step] = frozenset({"session", "head"})

#: Plain words for the SQLSTATEs a worker meets while its session lives (logs, ``/readyz``).
STATE_WORDS: dict[str, str] = {
    "53100": "disk full",
    "53200": "out of memory",
    "53300": "too many connections",
    "53400": "configuration limit exceeded",
    "55P03": "lock not available (lock_timeout)",
    "57014": "statement cancelled (statement_timeout or a cancel request)",
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "25006": "read-only transaction (a standby?)",
    "42501": "permission denied",
    "42P01": "undefined table (run inturn migrate)",
    "42703": "undefined column (run inturn migrate)",
}

#: What each step's failure means for the send, by whether the session survived it.
MEANING: dict[tuple[Step, bool], SendMeaning] = {
    ("session", True): "not_sent",
    ("session", False): "not_sent",
    ("head", True): "not_sent",
    ("head", False): "not_sent",
    ("attempt", True): "sent_failed",
    ("attempt", False): "sent_failed",
    ("mark", True): "delivered",
    ("mark", False): "may_resend",
    ("give_up", True): "sent_failed",
    ("give_up", False): "sent_failed",
}


@dataclass(frozen=True)
class StepFault:
    """A failed step of the worker's loop, classified (see :func:`classify_step`).

    Attributes:
        step: the step that failed.
        action: ``retry`` the step alone, on the same session, after a backoff; or
            ``reconnect``.
        meaning: what the failure means for the head (:data:`SendMeaning`).
        sqlstate: the SQLSTATE, or None.
        text: short and payload-free: plain words for the SQLSTATE, or the error's class.
    """

    step: Step
    action: StepAction
    meaning: SendMeaning
    sqlstate: str | None
    text: str


def classify_step(step: Step, exc: BaseException, *, connection_closed: bool) -> StepFault:
    """Classify an error raised by ``step`` of the worker's loop.

    The rule: the session decides. While it lives (whatever the error: a full disk, a lock or
    statement timeout, a refused grant), the worker still holds the destination's lock and
    knows what happened to the head, so the step alone is retried: a delivered mark is written
    again, never the message sent again. When the session is gone
    (:func:`connection_gone`, with ``connection_closed``), the lock is gone too; the worker
    reconnects and takes the lock again, and a delivered mark whose COMMIT it did not see may be
    lost: the head is then sent once more (:data:`SendMeaning` ``may_resend``). One exception:
    before any send (``session``, ``head``), a database without the inturn schema
    (:data:`SCHEMA_CODES`) is not waited for: the action is ``stop``.

    Args:
        step: ``session`` (connect, lock, LISTEN, settings), ``head`` (the head query, the
            depth gauge, the wait for NOTIFY), ``attempt`` (a failed attempt's record),
            ``mark`` (the delivered mark), ``give_up`` (the failed mark and its worklist item).
        exc: the exception the step raised.
        connection_closed: ``conn.closed or conn.broken`` after the error.
    """
    sqlstate = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    ended = connection_gone(exc, closed=connection_closed)
    if capacity.too_many(exc):
        text = capacity.refused_text()
    elif ended:
        text = f"connection lost ({type(exc).__name__}"
        text += f", SQLSTATE {sqlstate})" if sqlstate else ")"
    elif sqlstate is not None:
        text = f"{STATE_WORDS.get(sqlstate, type(exc).__name__)} (SQLSTATE {sqlstate})"
    else:
        text = type(exc).__name__
    action: StepAction = "reconnect" if ended else "retry"
    if not ended and sqlstate in SCHEMA_CODES and step in BEFORE_SEND:
        action = "stop"
    return StepFault(
        step=step,
        action=action,
        meaning=MEANING[(step, not ended)],
        sqlstate=sqlstate,
        text=text,
    )
