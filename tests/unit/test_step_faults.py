"""The worker loop's fault table as a table (pure): step x error x session -> action, meaning."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from inturn.worker.store.faults import classify_step
from inturn.worker.store.lockwatch import threshold_from_env

LOST = psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.mark.parametrize(
    ("step", "exc", "closed", "action", "meaning"),
    [
        # the delivered mark: retried on a live session, never a second send
        ("mark", errors.DiskFull("could not extend file"), False, "retry", "delivered"),
        ("mark", errors.LockNotAvailable("lock timeout"), False, "retry", "delivered"),
        ("mark", errors.QueryCanceled("statement timeout"), False, "retry", "delivered"),
        ("mark", errors.SerializationFailure("40001"), False, "retry", "delivered"),
        ("mark", errors.DeadlockDetected("40P01"), False, "retry", "delivered"),
        ("mark", errors.OutOfMemory("53200"), False, "retry", "delivered"),
        ("mark", errors.InsufficientPrivilege("grant"), False, "retry", "delivered"),
        ("mark", errors.UndefinedTable("42P01"), False, "retry", "delivered"),
        ("attempt", errors.UndefinedColumn("42703"), False, "retry", "sent_failed"),
        ("mark", errors.ReadOnlySqlTransaction("25006"), False, "retry", "delivered"),
        # ... and only a lost session allows a resend
        ("mark", LOST, True, "reconnect", "may_resend"),
        (
            "mark",
            psycopg.InterfaceError("the connection is closed"),
            True,
            "reconnect",
            "may_resend",
        ),
        ("mark", errors.AdminShutdown("57P01"), False, "reconnect", "may_resend"),
        ("mark", errors.CrashShutdown("57P02"), False, "reconnect", "may_resend"),
        ("mark", errors.IdleSessionTimeout("57P05"), False, "reconnect", "may_resend"),
        (
            "mark",
            errors.IdleInTransactionSessionTimeout("25P03"),
            False,
            "reconnect",
            "may_resend",
        ),
        ("mark", errors.ConnectionFailure("08006"), False, "reconnect", "may_resend"),
        # a closed connection wins over any SQLSTATE
        ("mark", errors.DiskFull("no space"), True, "reconnect", "may_resend"),
        # the head query: nothing was sent either way
        ("head", errors.QueryCanceled("statement timeout"), False, "retry", "not_sent"),
        ("head", errors.LockNotAvailable("lock timeout"), False, "retry", "not_sent"),
        ("head", LOST, True, "reconnect", "not_sent"),
        ("head", psycopg.InterfaceError("closed"), True, "reconnect", "not_sent"),
        # the failed attempt's record and the give-up: the send failed either way
        ("attempt", errors.DiskFull("no space"), False, "retry", "sent_failed"),
        ("attempt", errors.LockNotAvailable("lock timeout"), False, "retry", "sent_failed"),
        ("attempt", LOST, True, "reconnect", "sent_failed"),
        ("give_up", errors.DeadlockDetected("40P01"), False, "retry", "sent_failed"),
        ("give_up", errors.DiskFull("no space"), False, "retry", "sent_failed"),
        ("give_up", LOST, True, "reconnect", "sent_failed"),
        # setting up the session (lock, LISTEN, settings)
        ("session", errors.QueryCanceled("statement timeout"), False, "retry", "not_sent"),
        ("session", errors.AdminShutdown("57P01"), False, "reconnect", "not_sent"),
        # no inturn schema before any send: stop (the command line says to migrate)
        ("session", errors.UndefinedTable("42P01"), False, "stop", "not_sent"),
        ("head", errors.UndefinedColumn("42703"), False, "stop", "not_sent"),
        ("head", errors.InvalidSchemaName("3F000"), False, "stop", "not_sent"),
        ("session", errors.UndefinedFunction("42883"), False, "stop", "not_sent"),
        ("head", errors.UndefinedObject("42704"), False, "stop", "not_sent"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_each_step_and_error(
    step: str, exc: BaseException, closed: bool, action: str, meaning: str
) -> None:
    fault = classify_step(step, exc, connection_closed=closed)  # type: ignore[arg-type]
    assert (fault.action, fault.meaning) == (action, meaning)


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (errors.DiskFull("x"), "disk full (SQLSTATE 53100)"),
        (errors.LockNotAvailable("x"), "lock not available (lock_timeout) (SQLSTATE 55P03)"),
        (errors.QueryCanceled("x"), "statement cancelled"),
        (errors.CheckViolation("x"), "CheckViolation (SQLSTATE 23514)"),
        (LOST, "connection lost (OperationalError)"),
        (errors.AdminShutdown("x"), "connection lost (AdminShutdown, SQLSTATE 57P01)"),
    ],
)
def test_the_text_names_the_cause_without_the_message(exc: BaseException, words: str) -> None:
    assert words in classify_step("mark", exc, connection_closed=False).text


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 2.0), ("", 2.0), ("5", 5.0), ("0.25", 0.25), (" 3 ", 3.0)]
)
def test_the_lock_wait_threshold_comes_from_the_environment(
    value: str | None, seconds: float
) -> None:
    env = {} if value is None else {"INTURN_LOCK_WAIT_SECONDS": value}
    assert threshold_from_env(env) == seconds


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_lock_wait_threshold_that_is_not_seconds_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="INTURN_LOCK_WAIT_SECONDS must be a number of seconds"):
        threshold_from_env({"INTURN_LOCK_WAIT_SECONDS": value})
