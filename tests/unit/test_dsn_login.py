"""A destination's own worker login replaces the shared DSN's user and password (issue 41)."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from inturn.worker.store.dsn import DsnError, apply_login

SHARED = "host=db.example dbname=inturn user=inturn_worker password=shared sslmode=require"


def test_the_login_replaces_user_and_password_and_keeps_the_rest() -> None:
    got = conninfo_to_dict(
        apply_login(SHARED, {"INTURN_DB_USER": "inturn_worker_0a1b", "INTURN_DB_PASSWORD": "p"})
    )
    assert got == {
        "host": "db.example",
        "dbname": "inturn",
        "user": "inturn_worker_0a1b",
        "password": "p",
        "sslmode": "require",
    }


def test_without_the_variables_the_dsn_is_unchanged() -> None:
    assert apply_login(SHARED, {}) == SHARED
    # a user alone (certificate authentication): only the user changes
    assert conninfo_to_dict(apply_login(SHARED, {"INTURN_DB_USER": "x"}))["user"] == "x"


def test_a_password_without_a_user_is_refused() -> None:
    with pytest.raises(DsnError, match="INTURN_DB_PASSWORD is set without INTURN_DB_USER"):
        apply_login(SHARED, {"INTURN_DB_PASSWORD": "p"})
