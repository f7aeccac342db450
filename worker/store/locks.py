"""Every Postgres advisory lock inturn takes, each key defined here once.

A key is a text hashed by the server (``hashtextextended(key, 0)``) into the bigint advisory lock
key; the statements that take and release locks are in ``sql/locks.sql`` and take the text as
the ``key`` parameter (``enqueue_lock`` and ingest's ``store`` take :data:`ENQUEUE_PREFIX`).

* worker (session lock, one per destination): only its holder sends; losing the connection
  releases it;
* enqueue (transaction lock, one per destination): enqueues commit in id order;
* purge (session lock, try only): one purge at a time;
* migrate (session lock): two pods migrating at once apply each migration once;
* roles (transaction lock): two ``migrate --create-roles`` runs do not race on CREATE ROLE;
* local (session lock, try only): one ``inturn local`` per database, since each one owns the
  destination registry of its database and retires the destinations it has no manifest for.
* sweep (session lock, try only): ``inturn sweep`` runs never overlap.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store.queries import fetch_one, load

Q = load("locks.sql")

#: Prefix of a destination's enqueue lock key (``inturn:enqueue:<namespace>/<name>``).
ENQUEUE_PREFIX = "inturn:enqueue:"
#: The purge singleton's key.
PURGE = "inturn:purge"
#: The migration run's key.
MIGRATE = "inturn:migrate"
#: The key of creating the component roles and setting their grants.
ROLES = "inturn:roles"
#: The key held by the one ``inturn local`` that owns a database's destination registry.
LOCAL = "inturn:local"
#: The sweeper singleton's key.
SWEEP = "inturn:sweep"


def worker_key(destination: str) -> str:
    """The key of the worker lock of ``destination`` (``namespace/name``)."""
    return f"inturn:worker:{destination}"


def enqueue_key(destination: str) -> str:
    """The key of the enqueue lock of ``destination`` (``namespace/name``)."""
    return ENQUEUE_PREFIX + destination


async def try_lock(conn: AsyncConnection[Any], key: str) -> bool:
    """Take the session lock ``key`` if free; True when this session now holds it.

    Raises:
        psycopg.Error: the database failed.
    """
    row = await fetch_one(conn, Q["try_lock"], {"key": key}, row=dict_row)
    return bool(row and row["locked"])


async def unlock(conn: AsyncConnection[Any], key: str) -> None:
    """Release the session lock ``key`` taken by this session (nothing if it was not held)."""
    await conn.execute(Q["unlock"], {"key": key})
