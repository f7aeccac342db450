"""One memory budget for the message bytes an ingest process holds, whoever sends them.

Every byte of a message that ingest holds is counted against one budget, from the moment it is
read off a socket until the message's answer is written: frames being read (MLLP), bodies being
read (HTTP), and messages being prepared and stored. Each open MLLP connection also holds
:data:`CONNECTION_BYTES` for the reads in flight. The budget is derived from the memory the
process may use (:func:`budget_for`), so that no combination of peers (20 senders of 12 MiB at
once, 24 connections that stop in the middle of a frame) can push ingest past its limit: the
kernel would kill it, and every sender on every channel would lose its answer.

Who gets room when there is not enough (:class:`MemoryBudget`):

* A reader that needs more room than is free waits; meanwhile it reads nothing from its peer,
  so TCP's flow control holds the peer back.
* Room is granted oldest frame first (the age of a hold is when its frame began), so a frame
  that started earlier is never starved by later ones.
* When the oldest waiting frame cannot get its room, waiting frames that began after it give
  theirs up (they are *evicted*): each drops what it held and is answered AE "busy" at its end,
  and its sender sends it again later. Without this rule, 20 half-read frames could each wait
  for room that only the others hold, for ever.
* A wait ends after ``wait_seconds`` at most: the frame is then evicted too.

Frames that stall are bounded separately (the listener's frame deadline), so room held by a
peer that stopped sending comes back within that deadline.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from pathlib import Path

#: Bytes counted for each open MLLP connection: its stream buffer (the listener's reader limit
#: is 16 KiB, paused at twice that) and one read in flight.
CONNECTION_BYTES = 64 * 1024

#: Resident memory of an ingest process before it holds any message (the interpreter, asyncio,
#: aiohttp, psycopg with libpq, prometheus-client, the pools' connections), with room to spare;
#: measured at 55 MiB resident.
BASE_BYTES = 96 * 1024 * 1024

#: How many times the process's memory grows per byte of message held, at the worst moment:
#: the frame, its payload copy, the terminators' and identifier scan's working copies, the
#: statement's parameters and libpq's send buffer. Under the limit for two 16 MiB messages
#: (225 MiB), 20 senders of 12 MiB at once and 24 stalled 15 MiB frames peaked at most at 160
#: and 182 MiB (``tests/integration/test_ingest_memory.py``).
COPIES = 4

#: Default memory an ingest process may use when neither ``--memory-limit`` nor a cgroup says.
DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024

#: Default seconds a frame waits for room before it is answered AE "busy".
DEFAULT_WAIT_SECONDS = 10.0


class Busy(Exception):
    """No room was made for a message within the wait, or its room was given to an older one:
    nothing of it is kept, and the answer is AE "busy" (the sender sends it again)."""


def cgroup_memory_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of this process's cgroup in bytes, or None when there is none.

    Reads cgroup v2's ``memory.max`` of the process's own group, else cgroup v1's
    ``memory.limit_in_bytes`` (values of 2**60 and more mean no limit).
    """
    candidates: list[Path] = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if hierarchy == "0" and controllers == "":
                candidates += [root / rel / "memory.max", root / "unified" / rel / "memory.max"]
            elif "memory" in controllers.split(","):
                candidates.append(root / "memory" / rel / "memory.limit_in_bytes")
    except (OSError, ValueError):
        return None
    candidates += [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text == "max":
            continue
        try:
            value = int(text)
        except ValueError:
            continue
        if value < 2**60:
            return value
    return None


def memory_limit(configured: int | None) -> int:
    """The memory the process may use: ``configured`` (``--memory-limit``), else its cgroup's
    limit, else :data:`DEFAULT_MEMORY_LIMIT`."""
    if configured is not None:
        return configured
    return cgroup_memory_limit() or DEFAULT_MEMORY_LIMIT


def budget_for(limit: int) -> int:
    """The message budget of a process that may use ``limit`` bytes:
    ``(limit - BASE_BYTES) / COPIES`` (0 when ``limit`` is below the base)."""
    return max(0, (limit - BASE_BYTES) // COPIES)


def limit_for(max_message_bytes: int, concurrent_messages: int) -> int:
    """The memory limit that lets ``concurrent_messages`` messages of ``max_message_bytes``
    be held at once, each with its connection's :data:`CONNECTION_BYTES`, in whole MiB:
    ``BASE_BYTES + COPIES * N * (max_message_bytes + 64 KiB)`` rounded up to a MiB, which is
    ``96 MiB + 4 x N x S + ceil(N / 4) MiB`` for ``S`` in whole MiB (the chart's formula; see
    the sizing guide)."""
    exact = BASE_BYTES + COPIES * concurrent_messages * (max_message_bytes + CONNECTION_BYTES)
    mib = 1024 * 1024
    return -(-exact // mib) * mib


@dataclass(eq=False)
class Hold:
    """The room one reader (an MLLP connection, an HTTP request) holds in a budget.

    Attributes:
        held: bytes held now.
        evicted: the room was taken back for an older frame (or the wait ran out); the reader
            must drop its frame and answer AE "busy". Cleared by :meth:`trim` to 0.
    """

    budget: MemoryBudget
    held: int = 0
    evicted: bool = False
    age: int = 0
    priority: bool = False
    _want: int = 0
    _future: asyncio.Future[None] | None = field(default=None, repr=False)

    async def grow(self, size: int, wait_seconds: float | None = None) -> None:
        """Hold ``size`` more bytes, waiting for room (oldest frame first).

        Raises:
            Busy: this hold was evicted, before or while it waited, or the wait ran out.
            ValueError: ``size`` is negative or can never fit the budget.
        """
        await self.budget._grow(self, size, wait_seconds)

    def trim(self, size: int) -> None:
        """Give back everything above ``size`` bytes (never grows the hold). At 0 the hold
        forgets its frame: its next :meth:`grow` starts a new one, and clears ``evicted``."""
        self.budget._trim(self, max(0, size))

    def release(self) -> None:
        """Give back everything held (the reader is done)."""
        self.trim(0)


class MemoryBudget:
    """A count of bytes that readers may hold at once (see the module docstring).

    Args:
        capacity: bytes; at least as much as one largest message, or nothing could be taken.
        wait_seconds: default longest wait for room.

    Raises:
        ValueError: ``capacity`` is not positive.
    """

    def __init__(self, capacity: int, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        if capacity <= 0:
            raise ValueError("the memory budget must be positive")
        self.capacity = capacity
        self.wait_seconds = wait_seconds
        self.used = 0
        self.peak = 0
        self.evictions = 0
        self._ages = itertools.count(1)
        self._waiting: list[Hold] = []

    def hold(self, priority: bool = False) -> Hold:
        """A new, empty hold. A ``priority`` hold (a connection's own few bytes) is served
        before every frame, as if older than all of them: a new connection is admitted by
        taking room from waiting frames (which are answered busy) rather than waiting behind
        them and being closed unanswered."""
        return Hold(self, age=-1 if priority else 0, priority=priority)

    @property
    def free(self) -> int:
        """Bytes not held by anyone."""
        return self.capacity - self.used

    def _take(self, hold: Hold, size: int) -> None:
        if hold.age == 0 and not hold.priority:
            hold.age = next(self._ages)
        hold.held += size
        self.used += size
        self.peak = max(self.peak, self.used)

    async def _grow(self, hold: Hold, size: int, wait_seconds: float | None) -> None:
        if size < 0 or size > self.capacity:
            raise ValueError(f"cannot hold {size} bytes in a budget of {self.capacity}")
        if hold.evicted:
            raise Busy("the memory budget gave this message's room to an older one")
        if size == 0:
            return
        if not self._waiting and self.used + size <= self.capacity:
            self._take(hold, size)
            return
        if hold.age == 0 and not hold.priority:
            hold.age = next(self._ages)  # a new frame queues behind the frames already begun
        hold._want = size
        hold._future = asyncio.get_running_loop().create_future()
        self._waiting.append(hold)
        self._rebalance()
        limit = self.wait_seconds if wait_seconds is None else wait_seconds
        try:
            async with asyncio.timeout(limit):
                await hold._future
        except TimeoutError:
            self._evict(hold)
            raise Busy(f"no room for the message within {limit:g} s") from None
        finally:
            if hold in self._waiting:
                self._waiting.remove(hold)
                self._rebalance()
            hold._future = None

    def _trim(self, hold: Hold, size: int) -> None:
        if hold.held > size:
            self.used -= hold.held - size
            hold.held = size
        if size == 0:
            hold.evicted = False
            hold.age = -1 if hold.priority else 0
        self._rebalance()

    def _evict(self, hold: Hold) -> None:
        self.used -= hold.held
        hold.held = 0
        hold.evicted = True
        hold.age = -1 if hold.priority else 0
        self.evictions += 1
        if hold in self._waiting:
            self._waiting.remove(hold)
        future = hold._future
        if future is not None and not future.done():
            future.set_exception(Busy("the memory budget gave this message's room to an older one"))

    def _rebalance(self) -> None:
        """Grant waiting holds, oldest frame first; when the oldest cannot fit, evict the
        youngest waiting holds that began after it until it does (or none is left)."""
        while self._waiting:
            oldest = min(self._waiting, key=lambda h: h.age)
            if self.used + oldest._want <= self.capacity:
                self._waiting.remove(oldest)
                self._take(oldest, oldest._want)
                assert oldest._future is not None
                if not oldest._future.done():
                    oldest._future.set_result(None)
                continue
            victims = [h for h in self._waiting if h.age > oldest.age and h.held > 0]
            if not victims:
                return
            self._evict(max(victims, key=lambda h: h.age))
