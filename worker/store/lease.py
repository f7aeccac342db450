"""Who holds a destination: a lease row with an epoch, on the database's clock.

Fencing that does not depend on the session, so that it holds whatever sits between inturn and
Postgres (a transaction-mode pooler hands each transaction to any server connection, so a
session advisory lock there belongs to whichever backend the pooler picked). The model is
Medplum's durable queue (medplum/medplum PR #9346: acquire, heartbeat, takeover after expiry,
demotion enforced in the data layer) with a fencing token (Kleppmann, "How to do distributed
locking", 2016): every write a holder makes carries its epoch, and a takeover raises it.

Table ``inturn_lease`` (migration 0019): one row per destination, ``holder``, ``epoch`` (raised
on every acquisition, never lowered: a released lease keeps its row) and ``expires_at`` on the
database's clock (``clock_timestamp()``), with the ``ttl_seconds`` that renewals extend it by.

* :func:`acquire` takes a lease that is free, expired, or already this holder's (the epoch
  raised each time); a live lease of another holder is never taken, unless that holder was on a
  direct connection and its session is gone (migration 0025: the lease records the holder's
  backend, which holds the destination's worker session lock while it lives; a killed worker's
  socket is closed by the kernel, its backend ends, and the replacement takes over at once).
* :func:`renew` extends a lease still held; the idle worker calls it on an interval shorter than
  the lease. The statements a worker runs per message (the head query, the marks:
  :mod:`inturn.worker.store.delivery`) carry the same guard inline and renew the lease in the
  same statement once the renewal is due, so the hot path costs no extra round trip; in
  between they check holder, epoch and expiry under a share lock of the lease row, writing
  nothing to it (issue 43). A takeover (an UPDATE of the row) and a guarded statement are
  serialised on the row either way.
* :func:`release` expires it now (a clean stop), so that a successor need not wait.
* :func:`purge_gone` removes the rows of destinations that are gone, once their lease expired
  longer ago than purge's retention (``inturn purge``; migration 0030): a row outlives its
  release, not its destination. Nothing holds such a row (every guarded statement needs a live
  lease of the same holder and epoch), and a re-created destination's new holder may start at
  epoch 1 again: fencing compares holder and epoch together.

The rule, and its bound. A holder starts an attempt only while its lease is valid for longer
than the attempt's timeout; a takeover happens only after expiry, or once a direct holder's
session has ended; a statement whose guard fails changes nothing and raises :class:`LeaseLost`,
and the worker stops sending. So at most the message in flight of a lost holder is sent twice
(as with the session lock before). A holder that dies is replaced, on a direct connection, as
soon as its session ends and a standby tries (its acquire interval; a restarted worker tries at
once), and behind a pooler (no stable backend) within ``ttl_seconds`` plus the acquire interval.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from inturn.worker.errors import Invalid, Unavailable
from inturn.worker.store.queries import fetch_all, fetch_one, load

Q = load("lease.sql")


@dataclass(frozen=True)
class Lease:
    """A lease held on one destination: the fencing token every guarded statement carries.

    Attributes:
        destination: ``namespace/name``.
        holder: the holder's identity (:func:`holder_id`).
        epoch: raised on every acquisition of the destination (1, 2, ...).
    """

    destination: str
    holder: str
    epoch: int


class LeaseLost(Unavailable):
    """A guarded statement found the lease no longer this holder's (another holder took it over
    after it expired, or it was released): the statement changed nothing. The worker stops
    sending and goes back to acquiring.

    Attributes:
        lease: the lease that was lost.
    """

    def __init__(self, lease: Lease, what: str = "") -> None:
        doing = f" ({what})" if what else ""
        super().__init__(
            f"lease of {lease.destination} lost{doing}: epoch {lease.epoch} of {lease.holder}"
            " is no longer current; nothing was changed"
        )
        self.lease = lease


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a destination's lease, as :func:`holder` reads it.

    Attributes:
        destination: ``namespace/name``.
        holder: the last holder's identity.
        epoch: the current epoch.
        seconds_left: seconds until expiry on the database's clock (negative: expired).
        backend_pid: the backend a holder on a direct connection recorded (its session holds
            the destination's worker lock), or None (behind a pooler).
    """

    destination: str
    holder: str
    epoch: int
    seconds_left: float
    backend_pid: int | None = None


def holder_id(name: str = "") -> str:
    """A holder identity unique to this process and call: ``host:pid:random[:name]``.

    The host is the pod name on Kubernetes, so the lease names the pod that holds it.
    """
    suffix = f":{name}" if name else ""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}{suffix}"


def _check_ttl(ttl_seconds: float) -> float:
    ttl = float(ttl_seconds)
    if not ttl > 0:
        raise Invalid(f"a lease's ttl must be > 0 seconds, got {ttl_seconds}")
    return ttl


async def acquire(
    conn: AsyncConnection[Any],
    destination: str,
    holder: str,
    ttl_seconds: float,
    *,
    direct: bool = False,
) -> Lease | None:
    """Take the lease of ``destination`` for ``ttl_seconds``, or None when another holder's
    lease is still valid.

    A free destination gets epoch 1; an expired lease (anyone's), this holder's own, or one
    whose holder's backend is gone (a holder that recorded its backend, and whose backend no
    longer holds the destination's worker session lock) is taken with its epoch raised by one,
    so that every statement of an earlier holding matches nothing. One autocommit statement
    (pooler-safe: no session state).

    ``direct``: this connection is a session of its own (no pooler) and holds the destination's
    worker session lock (:func:`inturn.worker.store.locks.try_component_lock`); the lease then
    records this backend, so that a successor may take over as soon as this session ends. The
    statement records it only if the lock really is this backend's. Behind a pooler pass False:
    only the expiry lets a successor in.

    Raises:
        Invalid: ``ttl_seconds`` is not positive.
        psycopg.Error: the database failed.
    """
    params = {
        "destination": destination,
        "holder": holder,
        "ttl_seconds": _check_ttl(ttl_seconds),
        "direct": direct,
    }
    row = await fetch_one(conn, Q["acquire"], params, row=dict_row)
    return None if row is None else Lease(destination, holder, int(row["epoch"]))


async def renew(conn: AsyncConnection[Any], lease: Lease, ttl_seconds: float) -> float:
    """Extend ``lease`` to ``ttl_seconds`` from now; return the seconds left (database clock).

    Raises:
        LeaseLost: the lease expired or another holder took it (nothing changed).
        Invalid: ``ttl_seconds`` is not positive.
        psycopg.Error: the database failed.
    """
    params = {
        "destination": lease.destination,
        "holder": lease.holder,
        "epoch": lease.epoch,
        "ttl_seconds": _check_ttl(ttl_seconds),
    }
    row = await fetch_one(conn, Q["renew"], params, row=dict_row)
    if row is None:
        raise LeaseLost(lease, "renewing")
    return float(row["seconds_left"])


async def release(conn: AsyncConnection[Any], lease: Lease) -> None:
    """Give ``lease`` up now (it expires at once; nothing happens if it was already lost).

    Raises:
        psycopg.Error: the database failed.
    """
    await conn.execute(
        Q["release"],
        {"destination": lease.destination, "holder": lease.holder, "epoch": lease.epoch},
    )


async def holder(conn: AsyncConnection[Any], destination: str) -> LeaseInfo | None:
    """Who holds (or last held) ``destination``'s lease, or None when nobody ever did."""
    row = await fetch_one(conn, Q["holder"], {"destination": destination}, row=dict_row)
    if row is None:
        return None
    return LeaseInfo(
        destination=str(row["destination"]),
        holder=str(row["holder"]),
        epoch=int(row["epoch"]),
        seconds_left=float(row["seconds_left"]),
        backend_pid=None if row["backend_pid"] is None else int(row["backend_pid"]),
    )


#: Most lease rows :func:`purge_gone` removes per call (the function's own bound).
PURGE_BATCH_MAX = 5000


async def purge_gone(
    conn: AsyncConnection[Any], expired_seconds: float, *, batch: int = PURGE_BATCH_MAX
) -> list[str]:
    """Remove the lease rows of destinations that are gone (no registry row, or one marked
    deleted) whose lease expired more than ``expired_seconds`` ago, repeating batches of at most
    ``batch`` rows until none is left; the singletons' rows (``inturn:purge``...) are kept.
    Returns the destinations whose rows went, sorted. Who removes a destination (the operator's
    delete handler, ``inturn local`` when a manifest goes) need not know of leases, and a
    destination deleted before this existed is tidied too.

    Raises:
        Invalid: ``expired_seconds`` negative, or ``batch`` outside 1..5000.
        psycopg.Error: the database failed (the purge role may call the function).
    """
    if not expired_seconds >= 0:
        raise Invalid(f"expired_seconds must be >= 0, got {expired_seconds}")
    if not 1 <= batch <= PURGE_BATCH_MAX:
        raise Invalid(f"batch must be 1..{PURGE_BATCH_MAX}, got {batch}")
    gone: list[str] = []
    while True:
        rows = await fetch_all(
            conn,
            Q["purge_gone"],
            {"expired_seconds": float(expired_seconds), "batch": batch},
            row=dict_row,
        )
        gone.extend(str(r["destination"]) for r in rows)
        if len(rows) < batch:
            return sorted(gone)


async def purge_gone_count(conn: AsyncConnection[Any], expired_seconds: float) -> int:
    """How many lease rows :func:`purge_gone` would remove, removing nothing.

    Raises:
        Invalid: ``expired_seconds`` negative.
    """
    if not expired_seconds >= 0:
        raise Invalid(f"expired_seconds must be >= 0, got {expired_seconds}")
    rows = await fetch_all(
        conn, Q["purge_gone_count"], {"expired_seconds": float(expired_seconds)}, row=dict_row
    )
    return int(rows[0]["n"]) if rows else 0
