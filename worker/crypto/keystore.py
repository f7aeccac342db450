"""The key store seam: where wrapped patient and destination keys live.

The shipped implementation is a second Postgres database
(:class:`inturn.worker.store.keystore.PgKeyStore`); Vault or a cloud KMS with a key table can
fill the same protocol. A key store never sees an unwrapped key: it keeps what
:meth:`inturn.worker.crypto.masterkeys.KeyProvider.wrap` returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StoredKey:
    """A key as the key store holds it.

    Attributes:
        ref: its reference (16 bytes; what envelopes name).
        master_id: the master key that wraps it.
        wrapped: the wrapped bytes.
    """

    ref: bytes
    master_id: str
    wrapped: bytes


@dataclass(frozen=True)
class NewKey:
    """A key to create when no key has its reference yet.

    Attributes:
        lookups: the blind index keys that find it for erasure (a patient's identifier alone
            and with each assigning authority; empty for a destination's key).
    """

    ref: bytes
    master_id: str
    wrapped: bytes
    lookups: tuple[str, ...]


class KeyStore(Protocol):
    """Wrapped keys by reference, settings, erasure and rotation (all coroutines)."""

    async def setting(self, name: str, default: str) -> str:
        """The value of setting ``name``, recording ``default`` first when there is none
        (whoever records first wins; every caller gets the recorded value)."""
        ...

    async def fetch(self, refs: Sequence[bytes]) -> Mapping[bytes, StoredKey]:
        """The stored keys of ``refs`` (a missing one is absent: never made, or erased)."""
        ...

    async def create(self, keys: Sequence[NewKey]) -> Mapping[bytes, StoredKey]:
        """Store each key whose reference has none yet; return the stored key of every
        reference given (another process's, when it stored one first)."""
        ...

    async def erase(self, lookups: Sequence[str], *, actor: str, reason: str) -> int:
        """Destroy every key found by any of ``lookups`` and record, without identifiers,
        that it was done (who, why, how many). Returns the number destroyed (0 when an earlier
        run destroyed them)."""
        ...

    async def not_under(self, master_id: str, *, after: bytes, limit: int) -> list[StoredKey]:
        """Up to ``limit`` keys wrapped under another master key than ``master_id``, by
        reference after ``after`` (b'' for the first batch)."""
        ...

    async def rewrap(self, old: StoredKey, master_id: str, wrapped: bytes) -> bool:
        """Replace ``old``'s wrap by ``wrapped`` under ``master_id``, if it is still ``old``'s
        (False: erased or re-wrapped meanwhile)."""
        ...

    async def masters(self) -> Mapping[str, int]:
        """How many keys each master key wraps."""
        ...
