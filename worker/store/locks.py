"""Every Postgres advisory lock inturn takes, each key defined once.

A key is a text hashed by the server (``hashtextextended(key, 0)``) into the bigint advisory lock
key. The components' locks are taken through functions of migration 0011, each granted only to
the roles that take that lock (see :mod:`inturn.worker.store.roles`), so another component's
role cannot take a worker's lock and stop its destination; their keys live in those functions:

* worker (``inturn_worker_lock``, session lock, try only, one per destination): only its holder
  sends; losing the connection releases it;
* enqueue (``inturn_enqueue_lock``, transaction lock, one per destination): enqueues commit in
  id order;
* purge and sweep (``inturn_purge_lease``, ``inturn_sweep_lease``: lease rows of migration
  0019, :func:`take_singleton`): one purge, one sweep at a time, pooler-safe (a session lock
  behind a transaction-mode pooler belongs to whichever backend ran it, and outlives the run).
  Their session locks of migration 0011 are kept for older versions only.

The owner's locks take a key of this module through ``sql/locks.sql``:

* migrate (session lock): two pods migrating at once apply each migration once;
* roles (transaction lock): two ``migrate --create-roles`` runs do not race on CREATE ROLE;
* local (a lease row, :func:`take_singleton`, renewed while it runs): one ``inturn local`` per
  database, since each one owns the destination registry of its database and retires the
  destinations it has no manifest for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.store.queries import fetch_one, load

Q = load("locks.sql")

#: The migration run's key.
MIGRATE = "inturn:migrate"
#: The key of creating the component roles and setting their grants.
ROLES = "inturn:roles"
#: The key held by the one ``inturn local`` that owns a database's destination registry.
LOCAL = "inturn:local"


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


#: The session locks a component takes through its function: name -> (take, release) queries.
_COMPONENT_LOCKS = {
    "worker": ("worker_lock", "worker_unlock"),
    "purge": ("purge_lock", "purge_unlock"),
    "sweep": ("sweep_lock", "sweep_unlock"),
}


async def try_component_lock(
    conn: AsyncConnection[Any], name: str, destination: str | None = None
) -> bool:
    """Take a component's session lock if free: ``worker`` (of ``destination``, a
    ``namespace/name``), ``purge`` or ``sweep``; True when this session now holds it.

    Raises:
        KeyError: an unknown lock name.
        psycopg.errors.InsufficientPrivilege: the connected role may not take this lock.
        psycopg.Error: the database failed.
    """
    take, _ = _COMPONENT_LOCKS[name]
    row = await fetch_one(conn, Q[take], {"destination": destination}, row=dict_row)
    return bool(row and row["locked"])


async def release_component_lock(
    conn: AsyncConnection[Any], name: str, destination: str | None = None
) -> None:
    """Release a lock taken with :func:`try_component_lock` (nothing if it was not held)."""
    _, release = _COMPONENT_LOCKS[name]
    await conn.execute(Q[release], {"destination": destination})


#: Seconds a purge or sweep singleton lasts unless taken again (each batch or rule takes it
#: again); a run that died holds it no longer than this.
SINGLETON_TTL_SECONDS = 120.0


@dataclass(frozen=True)
class Singleton:
    """A purge or sweep singleton held: its name, holder and epoch."""

    name: str
    holder: str
    epoch: int


async def take_singleton(
    conn: AsyncConnection[Any],
    name: str,
    holder: str,
    ttl_seconds: float = SINGLETON_TTL_SECONDS,
) -> Singleton | None:
    """Take (or take again, renewed) the ``purge``, ``sweep`` or ``local`` singleton for
    ``holder``; None when another holder's is live (and its session is not gone). One statement,
    no session state.

    Raises:
        KeyError: not ``purge``, ``sweep`` or ``local``.
        psycopg.errors.InsufficientPrivilege: the connected role may not take it.
    """
    query = {"purge": "purge_lease", "sweep": "sweep_lease", "local": "local_lease"}[name]
    params = {"holder": holder, "ttl_seconds": float(ttl_seconds)}
    row = await fetch_one(conn, Q[query], params, row=dict_row)
    if row is None or row["epoch"] is None:
        return None
    return Singleton(name, holder, int(row["epoch"]))


async def release_singleton(conn: AsyncConnection[Any], held: Singleton) -> None:
    """Give a singleton up now (nothing if another holder has it)."""
    query = {"purge": "purge_release", "sweep": "sweep_release", "local": "local_release"}[
        held.name
    ]
    await conn.execute(Q[query], {"holder": held.holder, "epoch": held.epoch})
