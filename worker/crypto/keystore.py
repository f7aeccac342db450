"""The seams: where wrapped patient and destination keys live (``KeyStore``) and what wraps
them (``KeyProvider``).

The shipped implementation is a second Postgres database
(:class:`inturn.worker.store.keystore.PgKeyStore`); Vault or a cloud KMS with a key table can
fill the same protocol. A key store never sees an unwrapped key: it keeps what
:meth:`inturn.worker.crypto.masterkeys.KeyProvider.wrap` returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
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


class KeyHold(Protocol):
    """Keys kept live while a message sealed under them commits (:meth:`KeyStore.hold`)."""

    async def lock(self, refs: Sequence[bytes]) -> Mapping[bytes, StoredKey]:
        """The stored keys of ``refs`` (a missing one is absent), each kept from erasure until
        the hold ends: an erasure's destruction of one waits for it."""
        ...


class KeyStore(Protocol):
    """Wrapped keys by reference, settings, erasure and rotation (all coroutines)."""

    def hold(self) -> AbstractAsyncContextManager[KeyHold]:
        """A hold on keys for one seal: keys :meth:`KeyHold.lock` returns stay in the store
        (an :meth:`erase` waits) until the block ends, which the caller ends after the
        message sealed under them committed (or was rolled back)."""
        ...

    async def setting(self, name: str, default: str) -> str:
        """The value of setting ``name``, recording ``default`` first when there is none
        (whoever records first wins; every caller gets the recorded value)."""
        ...

    async def replace_setting(self, name: str, expected: str, value: str) -> bool:
        """Set ``name`` to ``value`` if it still holds ``expected`` (compare and set: two
        rotations at once do not undo each other); whether it was set."""
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
        that it was done (who, why, how many). Waits for the holds on them (:meth:`hold`):
        once it returns, no message sealed under one of them commits any more. Returns the
        number destroyed (0 when an earlier run destroyed them)."""
        ...

    async def not_under(self, master_id: str, *, after: bytes, limit: int) -> list[StoredKey]:
        """Up to ``limit`` keys wrapped under another master key than ``master_id``, by
        reference after ``after`` (b'' for the first batch)."""
        ...

    async def rewrap(self, old: StoredKey, master_id: str, wrapped: bytes) -> bool:
        """Replace ``old``'s wrap by ``wrapped`` under ``master_id``, if it is still ``old``'s
        (False: erased or re-wrapped meanwhile)."""
        ...

    async def settings(self, names: Sequence[str]) -> Mapping[str, str]:
        """The recorded values of ``names`` (absent ones left out)."""
        ...

    async def begin_index_rotation(self, old: str, new: str, check: str, generation: int) -> bool:
        """Make ``new`` the current (wrapped) index key and ``old`` the previous one, if ``old``
        is still current (compare and set); start the rotation's ``dual`` phase."""
        ...

    async def set_lookups(self, ref: bytes, lookups: Sequence[str], generation: int) -> bool:
        """Replace a key's erasure lookups by ones computed under index ``generation``."""
        ...

    async def unreached(self, settled: str, generation: int) -> int:
        """Patient keys made before ``settled`` whose lookups are under an older generation."""
        ...

    async def end_index_rotation(self) -> bool:
        """Destroy the previous index key and the rotation's state."""
        ...

    async def masters(self) -> Mapping[str, int]:
        """How many keys each master key wraps."""
        ...


class KeyProvider(Protocol):
    """What wraps patient keys (a folder of master keys, or a KMS).

    ``wrap`` and ``unwrap`` are coroutines so that a KMS can call out; ``aad`` binds a wrapped
    key to what it is the key of (its reference), so wrapped keys cannot be swapped.
    """

    def ids(self) -> tuple[str, ...]:
        """The master key IDs available, oldest first (natural order)."""
        ...

    def newest(self) -> str:
        """The ID new wraps use."""
        ...

    async def wrap(self, key: bytes, aad: bytes) -> tuple[str, bytes]:
        """``key`` wrapped under the newest master key: (master key ID, wrapped bytes)."""
        ...

    async def unwrap(self, master_id: str, wrapped: bytes, aad: bytes) -> bytes:
        """The key ``wrapped`` holds.

        Raises:
            MasterKeyError: ``master_id`` is not available here.
            UnwrapFailed: it does not unwrap (another key under that ID, or changed bytes).
        """
        ...

    def derive(self, master_id: str, info: bytes) -> bytes:
        """32 bytes derived from master key ``master_id`` for the purpose ``info`` (the blind
        index key). Raises :class:`MasterKeyError` when that key is not available."""
        ...
