"""Ports the tests and benchmarks listen on: each xdist worker draws from a range of its own.

A port the kernel hands to ``bind((host, 0))`` is free only until that socket closes. A test that
passes such a port to a process, or to a listener it starts later, races every other xdist worker
doing the same, and every outgoing connection, whose source port comes from the same ephemeral
range (loop pass 4 of c173ca1: a benchmark's ingest could not bind the ``--ops`` port it was
given, ``AddressInUse``). So :func:`free_port` never asks the kernel for one: it draws, in turn,
from a slice of the ports below the kernel's ephemeral range that belongs to this xdist worker
alone (``PYTEST_XDIST_WORKER``), and skips a port it cannot bind now (a service of the machine, or
a listener of this worker's still open). A process a test starts that picks its own ports (a
benchmark's ``--tiny`` run) draws from the upper part of its parent's slice, which the parent
itself never uses. Two whole runs of the suite at once on one machine share slices; their starts
within a slice differ at random and a taken port is skipped, which makes a clash unlikely, not
impossible.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import socket
from collections.abc import Iterator
from pathlib import Path

#: The lowest port drawn from (above the well-known services a machine may run below it).
LOWEST = 10_000
#: How many slices the range is cut into: xdist workers gw0 to gw14, and one for a run without
#: xdist (the serial part of ``make test``, a benchmark run by hand).
SLICES = 16
#: The environment variable (one per xdist worker, suffixed with its name) naming the process
#: that owns the slice's own part; it starts with ``INTURN_TEST_`` so the suite keeps it.
OWNER_ENV = "INTURN_TEST_PORTS_OWNER"
#: The share of a slice left to the processes a test starts (the rest is the test process's own).
CHILDREN_SHARE = 0.25


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _slice_index() -> int:
    """This xdist worker's slice (``gwN`` takes N modulo the others; no xdist, the last)."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(match.group(1)) % (SLICES - 1) if match else SLICES - 1


def draw_range(ephemeral_low: int, index: int, owner: bool) -> range:
    """The ports that one process draws from.

    ``ephemeral_low`` is the kernel's first ephemeral port; ``index`` the slice (0 to
    :data:`SLICES` - 1); ``owner`` whether the process owns the slice (else one it started).
    The result is empty when the kernel leaves fewer than :data:`SLICES` x 64 ports below its
    ephemeral range.
    """
    size = (min(ephemeral_low, 65_536) - LOWEST) // SLICES
    if size < 64:
        return range(0)
    start = LOWEST + index * size
    children = int(size * CHILDREN_SHARE)
    split = start + size - children
    return range(start, split) if owner else range(split, start + size)


def _cycle(ports: range) -> Iterator[int]:
    """Every port of ``ports`` in turn from a random one, round and round."""
    first = random.randrange(len(ports))
    return itertools.cycle([*ports[first:], *ports[:first]])


def _owns_its_slice() -> bool:
    """Whether this process draws from its slice's own part: the first of its xdist worker (or of
    a run without xdist) to import this module does, and says so in its environment, which the
    processes it starts inherit and so know they are not it."""
    key = f"{OWNER_ENV}_{os.environ.get('PYTEST_XDIST_WORKER') or 'main'}"
    owner = os.environ.setdefault(key, str(os.getpid()))
    return owner == str(os.getpid())


_RANGE = draw_range(ephemeral_low(), _slice_index(), _owns_its_slice())
_TURN = _cycle(_RANGE) if _RANGE else None


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP socket can bind ``host:port`` now (no listener, no TIME_WAIT there)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of this process's own range that nothing holds on ``host`` now.

    Raises :class:`OSError` if none of the range can be bound. Where the kernel leaves too few
    ports below its ephemeral range, it falls back to one the kernel picks (``bind`` to 0).
    """
    if _TURN is None:
        with socket.socket() as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    for _ in range(len(_RANGE)):
        port = next(_TURN)
        if bindable(port, host):
            return port
    raise OSError(f"no free port in {_RANGE.start}..{_RANGE.stop - 1}")
