"""Building the payload codec a process runs with, from its options (issue 31).

Every process that stores or reads payloads (ingest, the worker, the console, ``inturn queue
payload``, erasure, ``inturn local``) takes ``--payload-keys DIR`` (``INTURN_PAYLOAD_KEYS``)
and ``--key-dsn`` (``INTURN_KEY_DSN``); without them it stores plaintext and refuses every
envelope it meets with one line naming ``--payload-keys``.
"""

from __future__ import annotations

from inturn.worker.crypto.cache import DEFAULT_CACHE_KEYS
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.errors import MasterKeyError
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.store.keystore import PgKeyStore

#: The environment variables of the two options.
PAYLOAD_KEYS_ENV = "INTURN_PAYLOAD_KEYS"
KEY_DSN_ENV = "INTURN_KEY_DSN"


async def open_codec(
    payload_keys: str | None,
    key_dsn: str | None,
    *,
    cache_keys: int = DEFAULT_CACHE_KEYS,
    max_identifiers: int = MAX_INDEXED_IDENTIFIERS,
    dual_index: bool = False,
    application_name: str = "inturn-keys",
) -> PayloadCodec:
    """The codec of ``--payload-keys`` and ``--key-dsn``: plaintext without keys, started
    (blind index key derived and checked) with them.

    Raises:
        MasterKeyError: keys without a key store, a key store without keys, a folder that is
            not one of keys, or keys that differ from the key store's.
        psycopg.Error: the key store cannot be reached or has no schema.
    """
    if not payload_keys:
        if key_dsn:
            raise MasterKeyError("--key-dsn is given without --payload-keys (the master keys)")
        return PayloadCodec(max_identifiers=max_identifiers)
    if not key_dsn:
        raise MasterKeyError(
            "--payload-keys needs --key-dsn (INTURN_KEY_DSN): the key store's database"
        )
    from inturn.worker.crypto.masterkeys import FileKeyProvider  # cryptography: only with keys

    codec = PayloadCodec(
        FileKeyProvider(payload_keys),
        PgKeyStore(key_dsn, application_name=application_name),
        cache_keys=cache_keys,
        max_identifiers=max_identifiers,
        dual_index=dual_index,
    )
    await codec.start()
    return codec


async def close_codec(codec: PayloadCodec) -> None:
    """Close the codec's key store connection, if it has one."""
    if isinstance(codec.store, PgKeyStore):
        await codec.store.close()
