"""A destination's own worker login: a database role that works for one destination only
(issue 41; migration 0036; docs/explanation/security.md, "One login per destination").

Every worker may log in as the shared worker role, which reaches every destination's rows (the
single-tenant default, and what ``inturn local`` uses). With a login per destination, the
database itself keeps each worker to its own destination: a row policy on every table a worker
reads or writes (``roles.WORKER_SCOPED``) and a check in the worker's lock functions compare the
row's destination with the one the session's login (``session_user``, which ``SET ROLE`` cannot
change) is mapped to in ``inturn_worker_scope``. The operator makes one per Destination when it
runs with ``--worker-logins per-destination``; ``ensure_login``/``drop_login`` are what it calls.

Passwords reach the database only as SCRAM-SHA-256 verifiers (RFC 5802, RFC 7677, in the form
PostgreSQL stores, "Password Authentication"), so no statement log holds one in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.errors import Invalid
from inturn.worker.store.queries import load

Q = load("logins.sql")

#: PBKDF2 iterations of a verifier (PostgreSQL's default ``scram_iterations``).
SCRAM_ITERATIONS = 4096
#: Bytes of a verifier's salt (PostgreSQL's).
SCRAM_SALT_BYTES = 16


def scram_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` as PostgreSQL stores it in ``rolpassword``:
    ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64), RFC 5802 section 3
    with SHA-256 (RFC 7677). ``salt`` defaults to 16 random bytes.

    Only printable ASCII passwords are taken (SASLprep, RFC 4013, leaves them unchanged; the
    operator makes its passwords of base64url characters).

    Raises:
        Invalid: an empty or non-ASCII password, or fewer than 4096 iterations.
    """
    if not password or not all(32 < ord(c) < 127 for c in password):
        raise Invalid("a worker login's password is printable ASCII, without spaces")
    if iterations < SCRAM_ITERATIONS:
        raise Invalid(f"SCRAM iterations: at least {SCRAM_ITERATIONS}")
    salt = os.urandom(SCRAM_SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", hashlib.sha256)
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", hashlib.sha256)

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


async def ensure_login(
    conn: AsyncConnection[Any], destination: str, password: str | None = None
) -> str:
    """Make ``destination``'s worker login when it is missing (a member of the worker role
    ``inturn migrate --create-roles`` recorded, mapped to ``destination``) and set its password
    when ``password`` is given (as a verifier); the login's role name.

    Raises:
        Invalid: a password :func:`scram_verifier` refuses.
        psycopg.errors.InsufficientPrivilege: the role may not call it (the operator and admin
            roles may), or the tables' owner may not create roles (it needs CREATEROLE).
        psycopg.errors.ObjectNotInPrerequisiteState: ``--create-roles`` never ran here.
        psycopg.errors.InvalidParameterValue: not a ``namespace/name``.
        psycopg.errors.DuplicateObject: a role of that name exists that is not this login.
    """
    verifier = scram_verifier(password) if password is not None else None
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(Q["login"], {"destination": destination, "verifier": verifier})
        row = await cur.fetchone()
    assert row is not None
    return str(row["login"])


async def drop_login(conn: AsyncConnection[Any], destination: str) -> bool:
    """Drop ``destination``'s worker login with its mapping; False when it had none.

    Raises:
        psycopg.errors.InsufficientPrivilege: the role may not call it.
    """
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(Q["logout"], {"destination": destination})
        row = await cur.fetchone()
    return bool(row and row["dropped"])


async def scope(conn: AsyncConnection[Any]) -> str:
    """The destination this session's login works for, or ``*`` when it is not scoped."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(Q["scope"])
        row = await cur.fetchone()
    return str(row["scope"]) if row else "*"
