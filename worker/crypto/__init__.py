"""Payloads encrypted at rest, under a key per patient (issue 31).

Pure cores and seams, no database and no network:

* :mod:`~inturn.worker.crypto.envelope`: the AES-256-GCM envelope (a fresh data key per
  message, wrapped under a combination of every key it names; row ID and destination bound);
* :mod:`~inturn.worker.crypto.blind`: HMAC-SHA-256 digests for ``patient_keys``, order keys
  and the duplicate window (a blind index);
* :mod:`~inturn.worker.crypto.masterkeys`: master keys from a folder, the ``KeyProvider`` seam;
* :mod:`~inturn.worker.crypto.keystore`: the ``KeyStore`` seam (wrapped keys by reference);
* :mod:`~inturn.worker.crypto.codec`: ``PayloadCodec``, the one object that seals and opens.

The store keeps and returns payloads as stored; only the codec sees keys. pyca
``cryptography`` is imported only once a payload is sealed or opened or master keys are read
(:class:`~inturn.worker.crypto.masterkeys.FileKeyProvider`), so a process without keys does not
carry it.
"""

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.envelope import is_envelope
from inturn.worker.crypto.errors import (
    MasterKeyError,
    PayloadErased,
    PayloadKeysMissing,
    PayloadUnreadable,
)
from inturn.worker.crypto.keystore import KeyProvider

__all__ = [
    "KeyProvider",
    "MasterKeyError",
    "PayloadCodec",
    "PayloadErased",
    "PayloadKeysMissing",
    "PayloadUnreadable",
    "is_envelope",
]
