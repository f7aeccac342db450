"""A bounded cache of unwrapped keys, least recently used out first (pure)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

#: Default most keys a process keeps unwrapped (``--payload-key-cache``): 32 bytes each plus
#: the dictionary's overhead, about 1 MiB at this size.
DEFAULT_CACHE_KEYS = 4096


class KeyCache:
    """Key reference (bytes) -> key (bytes), at most ``capacity`` entries.

    Raises:
        ValueError: ``capacity`` below 1.
    """

    def __init__(self, capacity: int = DEFAULT_CACHE_KEYS) -> None:
        if capacity < 1:
            raise ValueError("the key cache holds at least one key")
        self.capacity = capacity
        self._keys: OrderedDict[bytes, bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, ref: bytes) -> bytes | None:
        """The cached key of ``ref`` (refreshing its place), or None."""
        key = self._keys.get(ref)
        if key is None:
            self.misses += 1
            return None
        self._keys.move_to_end(ref)
        self.hits += 1
        return key

    def put(self, ref: bytes, key: bytes) -> None:
        """Remember ``key``, dropping the least recently used one past the capacity."""
        self._keys[ref] = key
        self._keys.move_to_end(ref)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def drop(self, refs: Iterable[bytes]) -> None:
        """Forget the keys of ``refs``: erased keys."""
        for ref in refs:
            self._keys.pop(ref, None)

    def __len__(self) -> int:
        return len(self._keys)
