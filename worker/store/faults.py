"""Storage faults: the one list of which database errors a retry can fix and which it cannot.

Ingest answers from this list (HL7 v2.x chapter 2: AE "send it again" only where sending it
again can work; AR where it cannot), and the store retries from it. Error classes are the
SQLSTATE classes of PostgreSQL's "Appendix A. PostgreSQL Error Codes"; the first two characters
name the class.

=================  ==========================================  ==============================
fault              what                                        answer
=================  ==========================================  ==============================
``dead``           the connection is gone: no SQLSTATE (socket  retried at once on a fresh
                   closed, server restarted), class 08          connection; AE only if that
                   (connection exception), 57P01 admin          fails as well
                   shutdown, 57P02 crash shutdown,
                   ``psycopg.InterfaceError``
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

from dataclasses import dataclass
from typing import Literal

import psycopg
import psycopg_pool

from inturn.worker.hl7.errors import ErrorCode

Fault = Literal["dead", "permanent", "transient"]

#: SQLSTATE classes (first two characters) whose errors are about the message's content.
PERMANENT_CLASSES: dict[str, tuple[int, str]] = {
    "22": (ErrorCode.DATA_TYPE_ERROR, "the database cannot hold a value of this message"),
    "54": (ErrorCode.VALUE_TOO_LONG, "a value of this message is too large to index"),
}
#: SQLSTATE codes and classes that mean the connection itself is gone.
DEAD_CLASSES = frozenset({"08"})
DEAD_CODES = frozenset({"57P01", "57P02"})


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
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.TooManyRequests):
        return Classified(
            "transient", None, ErrorCode.APPLICATION_INTERNAL_ERROR, f"storage failed: {name}"
        )
    if isinstance(exc, psycopg.InterfaceError) or (
        isinstance(exc, psycopg.OperationalError)
        and (sqlstate is None or sqlstate[:2] in DEAD_CLASSES or sqlstate in DEAD_CODES)
    ):
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
