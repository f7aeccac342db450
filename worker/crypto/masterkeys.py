"""Master keys: what wraps the patient keys, and where the blind index key comes from.

Shipped: :class:`FileKeyProvider`, a folder with one file per key (a Kubernetes Secret mounted
as a volume: each data key a file), the file name being the key ID. A file holds 32 bytes, raw,
or written as base64 (``openssl rand -base64 32``) or hex (64 digits). Files whose names start
with a dot are not keys (a Secret volume's ``..data`` links). The *newest* key (the greatest ID
in natural order: ``k2`` before ``k10``, dates as written ``2026-12-01``) wraps new patient
keys; older ones still unwrap what they wrapped until ``inturn keys rotate`` re-wraps it.

:class:`KeyProvider` is the seam a KMS (Vault transit, AWS or GCP KMS) fills instead: it wraps
and unwraps small keys and derives the index key; no caller sees master key bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from inturn.worker.crypto.errors import MasterKeyError, UnwrapFailed
from inturn.worker.crypto.keyfiles import check_key_file
from inturn.worker.crypto.keystore import KeyProvider

__all__ = ["FileKeyProvider", "KeyProvider", "MasterKeyError", "UnwrapFailed", "new_key_file"]

KEY_BYTES = 32
NONCE_BYTES = 12
#: A key ID: the file's name.
KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Bytes a key file may hold (32 raw, 44 base64, 64 hex, plus a newline and spaces).
MAX_FILE_BYTES = 256


def natural_order(key_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of a key ID: digit runs compare as numbers, other runs as text."""
    parts = re.split(r"(\d+)", key_id)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts if p)


def _decode(raw: bytes, name: str) -> bytes:
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return binascii.unhexlify(text)
        except binascii.Error:
            pass
    try:
        key = base64.b64decode(text, validate=True)
    except binascii.Error:
        key = b""
    if len(key) != KEY_BYTES:
        raise MasterKeyError(
            f"--payload-keys: {name} is not a key (32 bytes, raw, base64 or 64 hex digits)"
        )
    return key


class FileKeyProvider:
    """Master keys read once from the files of ``folder`` (see the module docstring).

    Raises:
        MasterKeyError: the folder is missing or holds no key, a name is not a key ID, or a
            file is not a key.
        KeyFileExposed: a key file other users may read or change
            (:func:`inturn.worker.crypto.keyfiles.check_key_file`).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        path = Path(folder)
        if not path.is_dir():
            raise MasterKeyError(f"--payload-keys: {path} is not a folder")
        keys: dict[str, bytes] = {}
        for entry in sorted(path.iterdir()):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            if not KEY_ID.fullmatch(entry.name):
                raise MasterKeyError(
                    f"--payload-keys: {entry.name!r} is not a key ID (letters, digits, . _ -)"
                )
            check_key_file(entry, "--payload-keys")
            with entry.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            keys[entry.name] = _decode(raw, entry.name)
        if not keys:
            raise MasterKeyError(f"--payload-keys: {path} holds no key file")
        self._keys = dict(sorted(keys.items(), key=lambda kv: natural_order(kv[0])))
        self._aead = {k: AESGCM(v) for k, v in self._keys.items()}
        self.folder = path

    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def newest(self) -> str:
        return next(reversed(self._keys))

    def _get(self, master_id: str) -> AESGCM:
        try:
            return self._aead[master_id]
        except KeyError:
            raise MasterKeyError(
                f"--payload-keys: master key {master_id!r} is not in {self.folder}"
            ) from None

    async def wrap(self, key: bytes, aad: bytes) -> tuple[str, bytes]:
        master_id = self.newest()
        nonce = os.urandom(NONCE_BYTES)
        return master_id, nonce + self._get(master_id).encrypt(nonce, key, aad)

    async def unwrap(self, master_id: str, wrapped: bytes, aad: bytes) -> bytes:
        aead = self._get(master_id)
        try:
            return aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], aad)
        except InvalidTag:
            raise UnwrapFailed(master_id) from None

    def derive(self, master_id: str, info: bytes) -> bytes:
        self._get(master_id)
        hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info)
        return hkdf.derive(self._keys[master_id])


def new_key_file(folder: str | os.PathLike[str], key_id: str) -> Path:
    """Write a fresh random master key (base64, mode 0600) as ``folder/key_id``.

    Raises:
        MasterKeyError: ``key_id`` is not a key ID, or the file exists already.
    """
    if not KEY_ID.fullmatch(key_id):
        raise MasterKeyError(f"--payload-keys: {key_id!r} is not a key ID")
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = path / key_id
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise MasterKeyError(f"--payload-keys: {target} exists already") from None
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64encode(os.urandom(KEY_BYTES)) + b"\n")
    return target
