"""The one object that seals and opens payloads (shared interface 3 of the round-4 plan).

A :class:`PayloadCodec` without keys passes plaintext through and refuses envelopes with one
line naming ``--payload-keys``; with a :class:`~inturn.worker.crypto.masterkeys.KeyProvider`
and a :class:`~inturn.worker.crypto.keystore.KeyStore` it seals every payload under the keys
of the patients it names (or its destination's key when it names none) and opens envelopes,
keeping a bounded cache of unwrapped keys (one key store read and one unwrap per miss).

Which keys a message is wrapped under: one per distinct patient identifier in PID-2, PID-3,
PID-4 and MRG-1 (:func:`inturn.worker.hl7.pid.patient_identifiers`, the identifiers erasure
reads), at most ``max_identifiers`` (ingest's ``--max-indexed-identifiers``), each identified
by its ID and its set of assigning authorities. Erasing ``--patient-id X [--authority A]``
destroys exactly the keys of the identifiers that request matches
(:meth:`inturn.worker.hl7.pid.PatientId.matches`), found through their blind index keys.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from inturn.worker.crypto import envelope
from inturn.worker.crypto.blind import INDEX_INFO, BlindIndex
from inturn.worker.crypto.cache import DEFAULT_CACHE_KEYS, KeyCache
from inturn.worker.crypto.errors import (
    MasterKeyError,
    PayloadErased,
    PayloadKeysMissing,
    PayloadUnreadable,
    UnwrapFailed,
)
from inturn.worker.crypto.keystore import KeyHold, KeyProvider, KeyStore, NewKey, StoredKey
from inturn.worker.hl7.pid import (
    CAPPED_KEY,
    MAX_INDEXED_IDENTIFIERS,
    Digest,
    PatientId,
    index_keys,
    lookup_key,
    patient_identifiers,
    patient_lookups,
    plain_digest,
)

#: Key store settings: the master key the blind index key derives from, and its check value.
INDEX_MASTER = "index_master"
INDEX_CHECK = "index_check"
#: The blind index key itself, wrapped under a master key (``<master id>:<base64>``), so that
#: every master key can be retired (``keys rotate`` re-wraps it with the patient keys); a key
#: store made before it holds only INDEX_MASTER and gets this at the first start with that key.
INDEX_WRAPPED = "index_wrapped"
#: The blind index key's rotation (``inturn keys rotate-index``): the previous index key,
#: wrapped like the current one, while something still needs it; the phase (``dual``: rows and
#: keys get both forms; ``single``: the current form alone, the previous one still searched;
#: ``retired``: kept only to find what could not be re-indexed); the current generation (1 for
#: the first key); when the rotation began and when every process had taken the new key.
INDEX_PREVIOUS = "index_previous"
INDEX_ROTATION = "index_rotation"
INDEX_GENERATION = "index_generation"
INDEX_ROTATION_STARTED = "index_rotation_started"
INDEX_ROTATION_SETTLED = "index_rotation_settled"
#: Associated data of the index key's wrap (no patient key's reference starts like it).
_INDEX_WRAP_AAD = b"inturn blind index key v1"
#: Label of a patient key's wrap (with its reference as associated data).
_WRAP_LABEL = b"inturn key v1\x00"
#: The key store hold of the seal in progress in this task (PayloadCodec.sealing).
_HOLD: ContextVar[KeyHold | None] = ContextVar("inturn_key_hold", default=None)
#: Most times :meth:`PayloadCodec.ensure` makes a key that an erasure destroys meanwhile.
_ATTEMPTS = 3


@dataclass(frozen=True)
class Keying:
    """Which keys one message is sealed under.

    Attributes:
        kind: :data:`~inturn.worker.crypto.envelope.PATIENTS` or ``DESTINATION``.
        refs: the key references, sorted.
        lookups: per reference, the blind index keys that find it for erasure.
    """

    kind: bytes
    refs: tuple[bytes, ...]
    lookups: tuple[tuple[str, ...], ...]


def _patient_text(patient: PatientId) -> bytes:
    text = patient.id + "\x00" + "\x1f".join(sorted(patient.authorities))
    return text.encode("utf-8", "surrogatepass")


class PayloadCodec:
    """Seals and opens payloads; computes the index digests.

    Args:
        provider: the master keys (None: encryption off, plaintext passes).
        store: the key store (required with ``provider``).
        cache_keys: most unwrapped keys kept (:data:`DEFAULT_CACHE_KEYS`).
        max_identifiers: most patient identifiers a message is wrapped under.
        dual_index: also write the plain (unkeyed) index digests beside the blind ones, while
            pending rows indexed the old way remain (see ``inturn keys encrypt-existing``).

    Call :meth:`start` once before use when keys are given.

    Raises:
        ValueError: a provider without a store.
    """

    def __init__(
        self,
        provider: KeyProvider | None = None,
        store: KeyStore | None = None,
        *,
        cache_keys: int = DEFAULT_CACHE_KEYS,
        max_identifiers: int = MAX_INDEXED_IDENTIFIERS,
        dual_index: bool = False,
    ) -> None:
        if provider is not None and store is None:
            raise ValueError("payload keys need a key store")
        self.provider = provider
        self.store = store
        self.cache = KeyCache(cache_keys)
        self.max_identifiers = max_identifiers
        self.dual_index = dual_index
        self.index: BlindIndex | None = None
        #: The previous blind index key while a rotation needs it (searched, and written too
        #: in the ``dual`` phase), its phase and the current key's generation.
        self.previous: BlindIndex | None = None
        self.rotation = ""
        self.generation = 1
        self.unwraps = 0

    @property
    def enabled(self) -> bool:
        """Whether this codec seals (it has master keys)."""
        return self.provider is not None

    async def start(self) -> None:
        """Derive the blind index key from the master key the key store names (recording the
        newest one on first use) and check it against the key store's check value.

        Raises:
            MasterKeyError: the folder lacks that master key, or it is a different key.
        """
        if self.provider is None or self.store is None:
            return
        key, master = await self._index_key()
        index = BlindIndex(key)
        check = await self.store.setting(INDEX_CHECK, index.check())
        if check != index.check():
            raise MasterKeyError(
                f"--payload-keys: master key {master!r} is not the one the key store was made"
                " with (a wrong key file under that name)"
            )
        self.index = index
        await self._load_rotation()

    async def _load_rotation(self) -> None:
        """Read the rotation's state: the previous index key (unwrapped), phase, generation."""
        assert self.provider is not None and self.store is not None
        found = await self.store.settings([INDEX_PREVIOUS, INDEX_ROTATION, INDEX_GENERATION])
        self.rotation = found.get(INDEX_ROTATION, "")
        self.generation = int(found.get(INDEX_GENERATION) or 1)
        wrapped = found.get(INDEX_PREVIOUS, "")
        self.previous = None
        if wrapped:
            master, _, text = wrapped.partition(":")
            try:
                key = await self.provider.unwrap(master, base64.b64decode(text), _INDEX_WRAP_AAD)
            except UnwrapFailed:
                raise MasterKeyError(
                    f"--payload-keys: master key {master!r} does not unwrap the previous blind"
                    " index key (a wrong key file under that name)"
                ) from None
            self.previous = BlindIndex(key)

    async def refresh_index(self) -> bool:
        """Take the key store's current blind index key and rotation state when they changed
        (``inturn keys rotate-index`` ran): one key store read. Long-running processes call it
        on their periodic key store check. True when something changed.

        Raises:
            MasterKeyError: the folder cannot unwrap the new key.
            KeyStoreUnavailable: the key store could not be reached.
        """
        if self.provider is None or self.store is None or self.index is None:
            return False
        found = await self.store.settings([INDEX_CHECK, INDEX_ROTATION])
        if (
            found.get(INDEX_CHECK, "") == self.index.check()
            and found.get(INDEX_ROTATION, "") == self.rotation
        ):
            return False
        key, _ = await self._index_key()
        self.index = BlindIndex(key)
        await self._load_rotation()
        return True

    def _dual(self) -> BlindIndex | None:
        """The previous index while rows and keys get both forms (the ``dual`` phase)."""
        return self.previous if self.rotation == "dual" else None

    async def _index_key(self) -> tuple[bytes, str]:
        """The blind index key and the master key it is read with: unwrapped from the key
        store's INDEX_WRAPPED; else (a key store made before it, or a new one) derived from
        the master key INDEX_MASTER names, then recorded wrapped under the newest master key,
        so that the master key it was derived from can be retired after ``keys rotate``.

        Raises:
            MasterKeyError: the folder lacks the master key needed, or it is another key.
        """
        assert self.provider is not None and self.store is not None
        stored = await self.store.setting(INDEX_WRAPPED, "")
        if stored:
            master, _, text = stored.partition(":")
            try:
                key = await self.provider.unwrap(master, base64.b64decode(text), _INDEX_WRAP_AAD)
            except UnwrapFailed:
                raise MasterKeyError(
                    f"--payload-keys: master key {master!r} does not unwrap the blind index key"
                    " (a wrong key file under that name)"
                ) from None
            return key, master
        master = await self.store.setting(INDEX_MASTER, self.provider.newest())
        key = self.provider.derive(master, INDEX_INFO)
        wrapped = await self._wrap_index(key)
        await self.store.replace_setting(INDEX_WRAPPED, "", wrapped)
        return key, master

    async def _wrap_index(self, key: bytes) -> str:
        assert self.provider is not None
        master, wrapped = await self.provider.wrap(key, _INDEX_WRAP_AAD)
        return f"{master}:{base64.b64encode(wrapped).decode()}"

    def _index(self) -> BlindIndex:
        if self.index is None:
            raise RuntimeError("PayloadCodec.start() was not awaited")
        return self.index

    # The index -------------------------------------------------------------------------

    @property
    def digest(self) -> Digest:
        """The digest ``patient_keys`` hold: the blind index's with keys, plain SHA without."""
        return self._index().identifier if self.enabled else plain_digest

    def index_keys(self, plaintext: bytes, limit: int | None = None) -> list[str]:
        """A message's ``patient_keys`` (sorted): blind, plus plain ones in dual mode."""
        cap = self.max_identifiers if limit is None else limit
        keys = index_keys(plaintext, cap, self.digest)
        if self.enabled and self.dual_index:
            keys = sorted({*keys, *index_keys(plaintext, cap)})
        previous = self._dual() if self.enabled else None
        if previous is not None:
            keys = sorted({*keys, *index_keys(plaintext, cap, previous.identifier)})
        return keys

    def index_and_keying(self, plaintext: bytes, limit: int) -> tuple[list[str], Keying | None]:
        """:meth:`index_keys` and the patients' :meth:`keying` of one message from one reading
        of its identifiers (ingest's work per message). The keying is None when the message
        names nobody (it is then sealed under each destination's key) or without keys."""
        found = patient_identifiers(plaintext, limit + 1)
        kept = found[:limit]
        keys: set[str] = set()
        previous = self._dual() if self.enabled else None
        for patient in kept:
            keys.update(patient_lookups(patient, self.digest))
            if self.enabled and self.dual_index:
                keys.update(patient_lookups(patient))
            if previous is not None:
                keys.update(patient_lookups(patient, previous.identifier))
        if len(found) > limit:
            keys.add(CAPPED_KEY)
        if not self.enabled or not kept:
            return sorted(keys), None
        return sorted(keys), self._patients_keying(kept[: self.max_identifiers])

    def _patients_keying(self, patients: Sequence[PatientId]) -> Keying:
        index = self._index()
        found: dict[bytes, tuple[str, ...]] = {}
        for patient in patients:
            ref = index.ref(b"patient", _patient_text(patient))
            found[ref] = self._key_lookups(patient)
        refs = tuple(sorted(found))
        return Keying(envelope.PATIENTS, refs, tuple(found[r] for r in refs))

    def _key_lookups(self, patient: PatientId) -> tuple[str, ...]:
        """The erasure lookups a patient's key is stored with: the current index's forms, and
        the previous index's too in a rotation's ``dual`` phase."""
        lookups = patient_lookups(patient, self._index().identifier)
        previous = self._dual()
        if previous is not None:
            lookups = [*lookups, *patient_lookups(patient, previous.identifier)]
        return tuple(sorted(set(lookups)))

    def reindexed_keys(self, plaintext: bytes, stored: bytes) -> dict[bytes, tuple[str, ...]]:
        """For ``inturn keys rotate-index``: the patient keys the envelope ``stored`` (of
        ``plaintext``) is sealed under, by reference, each with its erasure lookups computed
        anew (:meth:`_key_lookups`). A key is matched to its patient by the reference the
        current or the previous index gives that patient; a destination's key has none."""
        if not self.enabled or not envelope.is_envelope(stored):
            return {}
        refs = set(envelope.header(stored).refs)
        out: dict[bytes, tuple[str, ...]] = {}
        indexes = [i for i in (self._index(), self.previous) if i is not None]
        for patient in patient_identifiers(plaintext, self.max_identifiers):
            text = _patient_text(patient)
            for index in indexes:
                ref = index.ref(b"patient", text)
                if ref in refs:
                    out[ref] = self._key_lookups(patient)
        return out

    def destination_keying(self, destination: str) -> Keying:
        """The keying of a message that names nobody: its destination's key."""
        ref = self._index().ref(b"destination", destination.encode("utf-8", "surrogatepass"))
        return Keying(envelope.DESTINATION, (ref,), ((),))

    def lookup_keys(self, ident: str, authority: str | None = None) -> list[str]:
        """The keys to search ``patient_keys`` for: the plain one, and the blind one with keys
        (rows indexed before the keys were given hold the plain form until re-keyed)."""
        keys = [lookup_key(ident, authority)]
        if self.enabled:
            keys.append(lookup_key(ident, authority, self.digest))
            if self.previous is not None:  # rows not re-indexed yet by a rotation
                keys.append(lookup_key(ident, authority, self.previous.identifier))
        return keys

    def order_digest(self, destination: str, key: str) -> str:
        """The stored form of an order key (``spec.replies``): blind with keys, plain without."""
        text = f"{destination}\x00{key.strip()}".encode("utf-8", "surrogatepass")
        return self._index().order_key(text) if self.enabled else plain_digest(text)

    def order_digests(self) -> list[Callable[[str, str], str]]:
        """Every stored form a reply's keys are looked for under: the blind one with keys, and
        the plain one (orders delivered before the keys were given)."""
        plain = PayloadCodec().order_digest
        if not self.enabled:
            return [plain]
        previous = self.previous
        if previous is None:
            return [self.order_digest, plain]

        def before(destination: str, key: str) -> str:  # orders delivered before a rotation
            text = f"{destination}\x00{key.strip()}".encode("utf-8", "surrogatepass")
            return previous.order_key(text)

        return [self.order_digest, before, plain]

    def window_digest(self, payload: bytes) -> bytes:
        """The duplicate window's digest of a message: keyed with keys, SHA-256 without."""
        if self.enabled:
            return self._index().payload(payload)
        return hashlib.sha256(payload).digest()

    # Keys ------------------------------------------------------------------------------

    def keying(self, plaintext: bytes, destination: str) -> Keying:
        """The keys ``plaintext`` is sealed under when stored for ``destination``."""
        patients = patient_identifiers(plaintext, self.max_identifiers)
        if patients:
            return self._patients_keying(patients)
        return self.destination_keying(destination)

    def keyings(self, plaintext: bytes, destinations: Sequence[str]) -> list[Keying]:
        """:meth:`keying` of one message for each of ``destinations`` (the message read once)."""
        first = self.keying(plaintext, destinations[0])
        if first.kind == envelope.PATIENTS:
            return [first] * len(destinations)
        return [first, *(self.keying(plaintext, d) for d in destinations[1:])]

    async def _unwrap(self, stored: StoredKey) -> bytes:
        assert self.provider is not None
        key = await self.provider.unwrap(stored.master_id, stored.wrapped, _WRAP_LABEL + stored.ref)
        self.unwraps += 1
        self.cache.put(stored.ref, key, stored.wrapped)
        return key

    async def _keys(
        self, refs: Sequence[bytes], *, item_id: int | None = None
    ) -> dict[bytes, bytes]:
        """Unwrapped keys of ``refs`` from the cache, the rest from the key store.

        Raises:
            PayloadErased: a reference has no key (erased).
            PayloadUnreadable: a key does not unwrap under its master key.
        """
        assert self.store is not None
        out: dict[bytes, bytes] = {}
        missing: list[bytes] = []
        for ref in refs:
            key = self.cache.get(ref)
            if key is None:
                missing.append(ref)
            else:
                out[ref] = key
        if missing:
            stored = await self.store.fetch(missing)
            for ref in missing:
                if ref not in stored:
                    what = "a message" if item_id is None else f"item {item_id}"
                    raise PayloadErased(
                        f"{what} does not decrypt: a key it is sealed under was erased"
                    )
                try:
                    out[ref] = await self._unwrap(stored[ref])
                except UnwrapFailed:
                    raise PayloadUnreadable(
                        f"master key {stored[ref].master_id!r} does not unwrap the keys of the"
                        " key store (a wrong key file in --payload-keys)"
                    ) from None
        return out

    @asynccontextmanager
    async def sealing(self) -> AsyncIterator[None]:
        """The scope of one seal's commit: every key :meth:`ensure` (so :meth:`seal_bodies`,
        :meth:`seal_many`) uses inside the block is confirmed in the key store and held there
        (:meth:`~inturn.worker.crypto.keystore.KeyStore.hold`) until the block ends. Enter it
        around the queue transaction that stores the sealed rows, so that it ends after their
        COMMIT: an erasure's destruction of those keys then waits for that commit, and finds
        the rows it sealed when it looks for the patient's rows afterwards
        (:func:`inturn.worker.operations.privacy.erase_data_subject`). Nested or without keys:
        nothing more."""
        if self.store is None or not self.enabled or _HOLD.get() is not None:
            yield
            return
        async with self.store.hold() as hold:
            token = _HOLD.set(hold)
            try:
                yield
            finally:
                _HOLD.reset(token)

    def lock_ahead(
        self, keyings: Sequence[Keying]
    ) -> asyncio.Task[Mapping[bytes, StoredKey]] | None:
        """Inside :meth:`sealing`, when every key of ``keyings`` is in the cache: start the
        hold's lock of them (its round trip to the key store) and return its task, so that the
        caller can do other work meanwhile (ingest draws its log ids in the queue's database)
        and then pass what it found to :meth:`ensure` (``confirmed``) once :meth:`confirms`
        it. None outside :meth:`sealing`, without keys, or when a key is not cached (it may
        have to be made: the caller then calls :meth:`ensure` first, as usual)."""
        hold = _HOLD.get()
        if hold is None or not self.enabled:
            return None
        refs = sorted({r for k in keyings for r in k.refs})
        if not all(self.cache.holds(r) for r in refs):
            return None
        return asyncio.ensure_future(hold.lock(refs))

    def confirms(self, keyings: Sequence[Keying], stored: Mapping[bytes, StoredKey]) -> bool:
        """Whether ``stored`` (a :meth:`lock_ahead` task's result) holds every key of
        ``keyings`` as cached here (the same wrapped bytes): :meth:`ensure` given it then
        neither makes a key nor reaches the key store or the master keys."""
        for keying in keyings:
            for ref in keying.refs:
                found = stored.get(ref)
                if found is None or not self.cache.holds(ref, found.wrapped):
                    return False
        return True

    async def ensure(
        self,
        keyings: Sequence[Keying],
        confirmed: Mapping[bytes, StoredKey] | None = None,
    ) -> dict[bytes, bytes]:
        """The keys of every reference of ``keyings``, creating those that do not exist yet.

        A cached key is used only once the key store confirmed it in this call (the same
        wrapped bytes): one key store read per call, a hold's ``lock`` inside :meth:`sealing`
        (the key then stays live until the sealed rows commit), a plain read outside it (an
        erasure may then still destroy a key between this read and the caller's commit). New
        keys are written (durably) before they are used, then held. A key erased again between
        its creation and its hold is made again, at most :data:`_ATTEMPTS` times.
        ``confirmed``: what this hold's lock already returned for these references
        (:meth:`lock_ahead`); the read is then not made again.

        Raises:
            KeyStoreUnavailable: the key store could not be reached.
            PayloadUnreadable: a stored key does not unwrap (a wrong key file).
            RuntimeError: the keys were erased as fast as they were made.
        """
        assert self.provider is not None and self.store is not None
        lookups: dict[bytes, tuple[str, ...]] = {}
        for k in keyings:
            lookups.update(zip(k.refs, k.lookups, strict=True))
        hold = _HOLD.get()
        confirm = self.store.fetch if hold is None else hold.lock
        stored = dict(await confirm(list(lookups)) if confirmed is None else confirmed)
        fresh: dict[bytes, tuple[bytes, bytes]] = {}
        for _ in range(_ATTEMPTS):
            absent = [ref for ref in lookups if ref not in stored]
            if not absent:
                break
            new: list[NewKey] = []
            for ref in absent:
                key = envelope.new_key()
                master_id, wrapped = await self.provider.wrap(key, _WRAP_LABEL + ref)
                fresh[ref] = (key, wrapped)
                new.append(NewKey(ref, master_id, wrapped, lookups[ref]))
            made = await self.store.create(new)
            stored.update(made if hold is None else await hold.lock(list(made)))
        else:
            raise RuntimeError("the patient's keys were erased as fast as they were made")
        out: dict[bytes, bytes] = {}
        for ref in lookups:
            s = stored[ref]
            if ref in fresh and s.wrapped == fresh[ref][1]:
                out[ref] = fresh[ref][0]
                self.cache.put(ref, out[ref], s.wrapped)
                continue
            cached = self.cache.get(ref, s.wrapped)
            if cached is not None:
                out[ref] = cached
                continue
            try:
                out[ref] = await self._unwrap(s)
            except UnwrapFailed:
                raise PayloadUnreadable(
                    f"master key {s.master_id!r} does not unwrap the keys of the key store"
                    " (a wrong key file in --payload-keys)"
                ) from None
        return out

    # Payloads --------------------------------------------------------------------------

    async def seal_many(self, rows: Sequence[tuple[int, str, bytes]]) -> list[bytes]:
        """Seal each ``(row id, destination, plaintext)``; plaintext as is without keys."""
        if not self.enabled:
            return [p for _, _, p in rows]
        bodies = await self.seal_bodies([(d, p) for _, d, p in rows])
        return [envelope.bind(b, i) for b, (i, _, _) in zip(bodies, rows, strict=True)]

    async def seal_bodies(
        self,
        rows: Sequence[tuple[str, bytes]],
        keyings: Sequence[Keying | None] | None = None,
        confirmed: Mapping[bytes, StoredKey] | None = None,
    ) -> list[envelope.Body]:
        """Encrypt each ``(destination, plaintext)`` before its row ID is known (the keys
        made or fetched as needed); :func:`inturn.worker.crypto.envelope.bind` then finishes
        each for its row. ``keyings``: each row's :meth:`keying` when already known;
        ``confirmed``: as :meth:`ensure`'s."""
        chosen = [
            k if k is not None else self.keying(p, d)
            for (d, p), k in zip(rows, keyings or [None] * len(rows), strict=True)
        ]
        keys = await self.ensure(chosen, confirmed)
        return [
            envelope.seal_body(p, destination=d, kind=k.kind, keys={r: keys[r] for r in k.refs})
            for (d, p), k in zip(rows, chosen, strict=True)
        ]

    async def seal(self, item_id: int, destination: str, plaintext: bytes) -> bytes:
        """The stored form of ``plaintext`` for row ``item_id`` of ``destination``."""
        return (await self.seal_many([(item_id, destination, plaintext)]))[0]

    async def open(self, item_id: int, destination: str, stored: bytes) -> bytes:
        """The plaintext of a stored payload: a plaintext row unchanged, an envelope opened.

        Raises:
            PayloadKeysMissing: an envelope, and this process has no payload keys.
            PayloadErased: a key the envelope names was erased.
            PayloadUnreadable: a key is wrong, or the envelope does not belong to this row.
            EnvelopeError: the envelope is malformed.
        """
        if not envelope.is_envelope(stored):
            return stored
        if not self.enabled:
            raise PayloadKeysMissing(
                f"item {item_id} is encrypted and this process has no payload keys:"
                " give --payload-keys DIR (or INTURN_PAYLOAD_KEYS)"
            )
        head = envelope.header(stored)
        keys = await self._keys(head.refs, item_id=item_id)
        try:
            return envelope.open_envelope(
                stored, message_id=item_id, destination=destination, keys=keys, head=head
            )
        except envelope.Undecryptable:
            pass
        # A cached key may be one an erasure destroyed while this process held it, made again
        # under the same reference for a message stored since: forget the cached keys of this
        # envelope and read them from the key store once more (only on a failure: an opened
        # envelope costs nothing extra).
        self.cache.drop(head.refs)
        keys = await self._keys(head.refs, item_id=item_id)
        try:
            return envelope.open_envelope(
                stored, message_id=item_id, destination=destination, keys=keys, head=head
            )
        except envelope.Undecryptable:
            raise PayloadUnreadable(
                f"item {item_id} does not decrypt: its envelope does not belong to this row"
                " or its keys differ (check --payload-keys)"
            ) from None

    # Erasure and rotation ---------------------------------------------------------------

    def erasure_lookups(self, ident: str, authority: str | None = None) -> list[str]:
        """The blind index keys whose patient keys an erasure of ``ident`` (assigned by
        ``authority``, when given) destroys."""
        found = [lookup_key(ident, authority, self._index().identifier)]
        if self.previous is not None:  # keys a rotation has not re-indexed (or could not)
            found.append(lookup_key(ident, authority, self.previous.identifier))
        return found

    async def erase_patient(
        self, ident: str, authority: str | None = None, *, actor: str, reason: str
    ) -> int:
        """Destroy the keys of every identifier an erasure of ``ident`` (``authority``)
        matches; every message sealed under one of them can no longer be read, wherever a
        copy of it lies (a restored dump included). Records the erasure in the key store
        without identifiers. Running it again destroys nothing more and returns 0.

        Raises:
            ValueError: ``ident`` is empty.
        """
        if not ident.strip():
            raise ValueError("the patient ID is empty")
        assert self.store is not None
        lookups = self.erasure_lookups(ident, authority)
        return await self.store.erase(lookups, actor=actor, reason=reason)

    async def rotate(self, *, batch: int = 500) -> int:
        """Re-wrap every key not under the newest master key under it, ``batch`` at a time
        (payloads untouched). Resumable: what is done stays done. Returns how many keys were
        re-wrapped by this call.

        Raises:
            MasterKeyError: a key is wrapped under a master key the folder no longer has.
            PayloadUnreadable: a key does not unwrap under its master key.
        """
        assert self.provider is not None and self.store is not None
        newest = self.provider.newest()
        done, after = 0, b""
        done += await self._rotate_index(newest)
        while True:
            keys = await self.store.not_under(newest, after=after, limit=batch)
            if not keys:
                return done
            for old in keys:
                aad = _WRAP_LABEL + old.ref
                try:
                    key = await self.provider.unwrap(old.master_id, old.wrapped, aad)
                except UnwrapFailed:
                    raise PayloadUnreadable(
                        f"master key {old.master_id!r} does not unwrap the keys of the key"
                        " store (a wrong key file in --payload-keys)"
                    ) from None
                master_id, wrapped = await self.provider.wrap(key, aad)
                done += await self.store.rewrap(old, master_id, wrapped)
            after = keys[-1].ref

    async def _rotate_index(self, newest: str) -> int:
        """Re-wrap the blind index key under ``newest``, and the previous one while a rotation
        of it keeps it (``inturn keys rotate-index``): how many were re-wrapped (0 to 2).
        Compare and set: a rotation moving either meanwhile wins, the next run re-wraps."""
        assert self.store is not None
        done = 0
        stored = await self.store.setting(INDEX_WRAPPED, "")
        if stored.partition(":")[0] != newest:
            key = self._index().key
            wrapped = await self._wrap_index(key)
            done += await self.store.replace_setting(INDEX_WRAPPED, stored, wrapped)
        previous = (await self.store.settings([INDEX_PREVIOUS])).get(INDEX_PREVIOUS, "")
        if previous and self.previous is not None and previous.partition(":")[0] != newest:
            wrapped = await self._wrap_index(self.previous.key)
            done += await self.store.replace_setting(INDEX_PREVIOUS, previous, wrapped)
        return done

    async def begin_index_rotation(self) -> bool:
        """Start a rotation of the blind index key (``inturn keys rotate-index``): a new random
        key becomes the current one, wrapped under the newest master key, and the current one
        the previous; the ``dual`` phase begins. False when a rotation is already under way or
        another run started one first (:attr:`rotation` then says its phase). The current key
        re-wrapped meanwhile (``inturn keys rotate`` at the same moment: the same key under
        another master key) is read again and the start tried again, at most three times.

        Raises:
            MasterKeyError: the folder cannot wrap or unwrap the keys involved.
            RuntimeError: the current key was re-wrapped under it three times in a row.
        """
        assert self.provider is not None and self.store is not None
        for _ in range(3):
            if self.rotation:
                return False
            old = await self.store.setting(INDEX_WRAPPED, "")
            key = os.urandom(32)
            began = await self.store.begin_index_rotation(
                old, await self._wrap_index(key), BlindIndex(key).check(), self.generation + 1
            )
            await self.refresh_index()
            if began:
                return True
        if self.rotation:
            return False
        raise RuntimeError("the blind index key kept changing while its rotation began")

    async def set_rotation_phase(self, phase: str) -> bool:
        """Move the rotation from its current phase to ``phase`` (compare and set)."""
        assert self.store is not None
        moved = await self.store.replace_setting(INDEX_ROTATION, self.rotation, phase)
        await self.refresh_index()
        return moved

    async def end_index_rotation(self) -> None:
        """Destroy the previous index key: nothing needs it any more."""
        assert self.store is not None
        await self.store.end_index_rotation()
        self.previous = None
        self.rotation = ""

    async def status(self) -> dict[str, object]:
        """Which master keys are in use: ``{"newest", "index_master", "index_previous_master"
        (the master key wrapping the previous blind index key a rotation keeps, "" when none),
        "index_generation",
        "index_rotation" (the phase of a blind index key rotation, "" when none), "folder": [ids],
        "wrapping": {id: keys}, "missing": [ids the key store needs that the folder lacks]}``."""
        assert self.provider is not None and self.store is not None
        wrapping = dict(await self.store.masters())
        wrapped = await self.store.setting(INDEX_WRAPPED, "")
        index_master = wrapped.partition(":")[0] or await self.store.setting(
            INDEX_MASTER, self.provider.newest()
        )
        previous = (await self.store.settings([INDEX_PREVIOUS])).get(INDEX_PREVIOUS, "")
        previous_master = previous.partition(":")[0]
        needed = set(wrapping) | {index_master} | ({previous_master} - {""})
        return {
            "newest": self.provider.newest(),
            "index_master": index_master,
            "index_previous_master": previous_master,
            "index_generation": self.generation,
            "index_rotation": self.rotation,
            "folder": list(self.provider.ids()),
            "wrapping": wrapping,
            "missing": sorted(needed - set(self.provider.ids())),
        }
