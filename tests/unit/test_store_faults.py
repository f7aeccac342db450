"""The one list of storage faults: a test per class (inturn.worker.store.faults)."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest
from psycopg import errors

from inturn.worker.store.faults import classify


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        # dead: the connection is gone (a Postgres restart, a killed backend)
        (psycopg.OperationalError("server closed the connection unexpectedly"), "dead"),
        (psycopg.InterfaceError("the connection is closed"), "dead"),
        (errors.AdminShutdown("terminating connection due to administrator command"), "dead"),
        (errors.CrashShutdown("crash"), "dead"),
        (errors.ConnectionFailure("08006"), "dead"),
        # permanent: the message's own content is refused
        (errors.ProgramLimitExceeded("index row size 3016 exceeds btree maximum"), "permanent"),
        (errors.StringDataRightTruncation("value too long"), "permanent"),
        (errors.CharacterNotInRepertoire("invalid byte sequence"), "permanent"),
        (errors.InvalidParameterValue("22023"), "permanent"),
        # transient: unreachable, busy, misconfigured, or unknown
        (psycopg_pool.PoolTimeout("couldn't get a connection after 10 sec"), "transient"),
        (errors.CannotConnectNow("the database system is starting up"), "transient"),
        (errors.TooManyConnections("too many clients"), "transient"),
        (errors.DiskFull("no space"), "transient"),
        (errors.SerializationFailure("40001"), "transient"),
        (errors.DeadlockDetected("40P01"), "transient"),
        (errors.LockNotAvailable("55P03"), "transient"),
        (errors.QueryCanceled("statement timeout"), "transient"),
        (errors.InsufficientPrivilege("permission denied"), "transient"),
        (errors.CheckViolation("a constraint an operator added"), "transient"),
        (errors.UniqueViolation("duplicate key"), "transient"),
        (TimeoutError(), "transient"),
        (RuntimeError("something else"), "transient"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v,
)
def test_each_class(exc: BaseException, fault: str) -> None:
    classified = classify(exc)
    assert classified.fault == fault
    assert "SQLSTATE" not in classified.text or classified.sqlstate in classified.text


def test_permanent_faults_name_a_table_0357_code() -> None:
    assert classify(errors.ProgramLimitExceeded("x")).hl7_code == 104
    assert classify(errors.CharacterNotInRepertoire("x")).hl7_code == 102
    assert classify(TimeoutError()).hl7_code == 207
