"""The errors of payload encryption (no cryptography library imported: a process without
keys loads none of it).

Every message is one line; those a process stops for name ``--payload-keys``.
"""

from __future__ import annotations

from inturn.worker.errors import Conflict, Invalid


class MasterKeyError(Invalid):
    """The master keys cannot be used: a missing or empty folder, a file that is no key, a key
    ID the key store needs and the folder lacks, or a key that differs from the one used.
    The message is one line and names ``--payload-keys``."""

    kind = "payload_keys"


class UnwrapFailed(Exception):
    """A wrapped key does not unwrap under the master key it names (a different key behind
    the same ID, or the wrapped bytes were changed)."""


class EnvelopeError(Invalid):
    """The stored bytes start like an envelope but are not a well-formed one."""

    kind = "invalid_envelope"


class Undecryptable(Exception):
    """A key is not the one the envelope was sealed with, or the envelope, its row ID or its
    destination was changed (the GCM tag does not verify)."""


class PayloadKeysMissing(Invalid):
    """An envelope was met by a process started without ``--payload-keys``: it must stop
    rather than pass ciphertext on."""

    kind = "payload_keys"


class PayloadUnreadable(Invalid):
    """An envelope does not open: a key it names was erased, or the master keys given are
    not the ones it was sealed with, or the row was changed."""

    kind = "payload_unreadable"


class PayloadErased(PayloadUnreadable, Conflict):
    """A key the envelope names is no longer in the key store (erased by patient): the row
    exists, its payload is gone for good."""

    kind = "payload_erased"


#: What a process stops for when it meets a payload it cannot open (never sending it).
REFUSALS = (PayloadKeysMissing, PayloadUnreadable, EnvelopeError, MasterKeyError)
