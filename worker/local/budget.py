"""The connection budget of ``inturn local``: what it opens, counted before it opens it.

Every worker holds one session of its own (its lease, its LISTEN, its statements), so the
number of connections grows with the destinations; a server's ``max_connections`` does not.
A run that needs more than the server lets it open finds out the worst way: some workers never
get a session while ingest answers AA for their messages. So the need is counted here and held
against the server's limit (:mod:`inturn.worker.store.capacity`) when ``inturn local`` starts and
whenever the manifests add destinations:

=====================  ======  ==============================================================
part                   count   what
=====================  ======  ==============================================================
workers                1 each  one session per destination (2 behind a pooler with a
                               ``--listen-dsn``: not what ``inturn local`` does)
ingest                 pool+1  its write pool (4 in ``inturn local``) and its read pool (1)
run                    3       the ``inturn local`` lease, applying the manifests, the sweep
console                5       its write (2) and read (2) pools and its live feed (1)
keys                   3       the key store sessions with ``--encrypt`` (run, ingest, console)
spare                  10      people's commands beside it (``inturn queue ...``: each opens
                               1 to 6), a worker's lock watch, ``psql``
                               (``INTURN_LOCAL_SPARE_CONNECTIONS``)
=====================  ======  ==============================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Connections kept free for people's commands, lock watches and ``psql`` (default).
SPARE_CONNECTIONS = 10
#: The environment variable that changes :data:`SPARE_CONNECTIONS`.
SPARE_ENV = "INTURN_LOCAL_SPARE_CONNECTIONS"
#: Connections ``inturn local`` itself holds beside its workers and ingest.
RUN_CONNECTIONS = 3
#: The console's two pools and its feed.
CONSOLE_CONNECTIONS = 5
#: Key store sessions with payload encryption.
KEY_CONNECTIONS = 3


@dataclass(frozen=True)
class Budget:
    """What ``inturn local`` opens, counted (see the module table).

    Attributes:
        workers: one per destination.
        ingest: its pools' largest sizes.
        others: the run's own, the console's and the key store's.
        spare: kept free for everything else.
    """

    workers: int
    ingest: int
    others: int
    spare: int

    @property
    def fixed(self) -> int:
        """Everything but the workers."""
        return self.ingest + self.others + self.spare

    @property
    def total(self) -> int:
        """Connections the run needs at most."""
        return self.workers + self.fixed

    def with_workers(self, workers: int) -> Budget:
        """The same run with ``workers`` destinations."""
        return Budget(workers, self.ingest, self.others, self.spare)

    def describe(self) -> str:
        """One line: the total and its parts."""
        return (
            f"{self.total} connections ({self.workers} workers, ingest {self.ingest},"
            f" inturn local and console {self.others}, spare {self.spare})"
        )


def spare_from_env() -> int:
    """``INTURN_LOCAL_SPARE_CONNECTIONS`` (default :data:`SPARE_CONNECTIONS`).

    Raises:
        ValueError: not a whole number of at least 0 (the message names the variable).
    """
    raw = os.environ.get(SPARE_ENV, "").strip()
    if not raw:
        return SPARE_CONNECTIONS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{SPARE_ENV}={raw!r}: a whole number of at least 0 is expected")
    return value


def budget(
    destinations: int,
    *,
    ingest_pool: int,
    console: bool,
    encrypted: bool = False,
    spare: int | None = None,
) -> Budget:
    """The budget of a run with ``destinations`` workers, ingest's write pool of
    ``ingest_pool``, the console or not, payload encryption or not; ``spare`` None: from the
    environment (:func:`spare_from_env`)."""
    others = RUN_CONNECTIONS + (CONSOLE_CONNECTIONS if console else 0)
    others += KEY_CONNECTIONS if encrypted else 0
    return Budget(
        workers=destinations,
        ingest=ingest_pool + 1,
        others=others,
        spare=spare_from_env() if spare is None else spare,
    )


def embedded_size(need: int) -> int:
    """The ``max_connections`` ``inturn local`` gives its embedded server for a run that needs
    ``need``: that, plus a fifth (at least 20) for destinations added while it runs and the
    superuser's 3 reserved slots, rounded up to ten; never below Postgres's default 100."""
    wanted = need + max(20, need // 5) + 3
    return max(100, -(-wanted // 10) * 10)


def over_text(need: Budget, max_connections: int, usable: int, *, embedded: bool) -> str:
    """The one-line refusal of a run over budget: the numbers and the setting to change."""
    cure = (
        "restart inturn local (it raises the embedded server's max_connections to fit)"
        if embedded
        else "raise max_connections on that server (and restart it), lower"
        f" {SPARE_ENV}, or run fewer destinations"
    )
    return (
        f"inturn local needs {need.describe()}, and the server lets it open {usable}"
        f" (max_connections {max_connections} minus {max_connections - usable} reserved):"
        f" {cure}"
    )
