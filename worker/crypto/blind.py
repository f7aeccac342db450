"""The blind index: keyed digests in place of plain hashes of identifiers.

An unkeyed SHA-256 of an MRN is reversed by hashing every MRN of the space (a few million
values: seconds). Under a secret key (HMAC-SHA-256, RFC 2104) a dump alone reveals nothing of
the identifiers; equality stays visible (two rows with one key name one patient), which is
what lets lookups and lanes work. Digests keep the width of the plain ones (128 bits, 32 hex
digits), so the columns and indexes are unchanged.

Pure; the index key comes from the master key material
(:meth:`inturn.worker.crypto.masterkeys.KeyProvider.derive`).
"""

from __future__ import annotations

import hashlib
import hmac

#: The HKDF label the index key is derived under (changing it changes every digest).
INDEX_INFO = b"inturn blind index v1"
#: What the key store keeps to tell a wrong master key from the right one.
CHECK_TEXT = b"inturn blind index check"


class BlindIndex:
    """Keyed digests under one index key (32 bytes).

    Each kind of value gets its own label, so a digest of one kind never equals one of
    another (identifiers, order keys, payloads of the duplicate window, key references).
    """

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("an index key is at least 32 bytes")
        self._key = key

    @property
    def key(self) -> bytes:
        """The index key itself (for ``keys rotate``, which wraps it again under the newest
        master key; never logged, never stored unwrapped)."""
        return self._key

    def _mac(self, label: bytes, text: bytes) -> bytes:
        return hmac.digest(self._key, label + b"\x00" + text, hashlib.sha256)

    def identifier(self, text: bytes) -> str:
        """The index key of an identifier's key text (:func:`inturn.worker.hl7.pid.key_text`):
        32 hex digits. The digest the ``patient_keys`` column holds."""
        return self._mac(b"id", text)[:16].hex()

    def order_key(self, text: bytes) -> str:
        """The stored form of an order key's text (destination, NUL, key): 32 hex digits."""
        return self._mac(b"order", text)[:16].hex()

    def payload(self, payload: bytes) -> bytes:
        """The duplicate window's digest of a whole message (32 bytes, as SHA-256 is)."""
        return self._mac(b"payload", payload)

    def ref(self, label: bytes, text: bytes) -> bytes:
        """A key reference: 16 bytes naming a patient's or a destination's key."""
        return self._mac(b"ref-" + label, text)[:16]

    def check(self) -> str:
        """A digest of a constant: equal for equal index keys, so a key store can tell whether
        it is read with the master key it was made with."""
        return self._mac(b"check", CHECK_TEXT).hex()
