"""The one writer of the audit trail (``inturn_audit``): every decision a person or a robot
takes (skip, drain, erase, retry-now, resend, remove, view-payload, suspend, resume, worklist
clears, the sweeper's expiries, lookups by patient) is recorded through :func:`record`, in the
transaction of the change it records. Its reads are :mod:`inturn.worker.store.reads`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store.queries import load

Q = load("queue.sql")


async def record(
    conn: AsyncConnection[Any],
    *,
    who: str,
    action: str,
    destination: str | None = None,
    ids: Sequence[int] = (),
    why: str | None = None,
) -> None:
    """Add one entry to the audit trail in the caller's transaction (never a payload).

    The one writer of the audit trail: every decision (skip, drain, erase, retry-now, resend,
    remove, view-payload, suspend, resume, worklist clears, the sweeper's expiries) goes
    through here.
    """
    await conn.execute(
        Q["audit"],
        {"who": who, "action": action, "destination": destination, "ids": list(ids), "why": why},
    )
