"""A bounded cache of unwrapped keys, least recently used out first (pure)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

#: Default most keys a process keeps unwrapped (``--payload-key-cache``): 32 bytes each plus
#: the dictionary's overhead, about 1 MiB at this size.
DEFAULT_CACHE_KEYS = 4096


class KeyCache:
    """Key reference (bytes) -> key (bytes), at most ``capacity`` entries, each with the
    wrapped bytes it was unwrapped from (its tag): after an erasure, a key made again under the
    same reference has other wrapped bytes, and a seal that confirmed the stored key asks for
    the key of those bytes (:meth:`get` with ``tag``).

    Raises:
        ValueError: ``capacity`` below 1.
    """

    def __init__(self, capacity: int = DEFAULT_CACHE_KEYS) -> None:
        if capacity < 1:
            raise ValueError("the key cache holds at least one key")
        self.capacity = capacity
        self._keys: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, ref: bytes, tag: bytes | None = None) -> bytes | None:
        """The cached key of ``ref`` (refreshing its place), or None; with ``tag``, None
        also when the key cached was unwrapped from other bytes."""
        entry = self._keys.get(ref)
        if entry is None or (tag is not None and entry[1] != tag):
            self.misses += 1
            return None
        self._keys.move_to_end(ref)
        self.hits += 1
        return entry[0]

    def holds(self, ref: bytes, tag: bytes | None = None) -> bool:
        """Whether ``ref``'s key is cached (unwrapped from ``tag``, when given); counts
        neither a hit nor a miss and moves nothing."""
        entry = self._keys.get(ref)
        return entry is not None and (tag is None or entry[1] == tag)

    def put(self, ref: bytes, key: bytes, tag: bytes = b"") -> None:
        """Remember ``key`` (unwrapped from ``tag``), dropping the least recently used one
        past the capacity."""
        self._keys[ref] = (key, tag)
        self._keys.move_to_end(ref)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def drop(self, refs: Iterable[bytes]) -> None:
        """Forget the keys of ``refs``: erased keys."""
        for ref in refs:
            self._keys.pop(ref, None)

    def __len__(self) -> int:
        return len(self._keys)
