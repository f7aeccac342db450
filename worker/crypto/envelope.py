"""The envelope a payload is stored in: AES-256-GCM under a fresh data key per message.

Pure: bytes and keys in, bytes out; no I/O. Source: NIST SP 800-38D (GCM), RFC 5116 (AEAD
interface, 96-bit nonces), RFC 2104 (HMAC, here the key combiner).

Layout (big-endian), version 1::

    PREFIX (4)  b"\\x00ie1": no HL7 message (or any text) starts with a NUL byte
    kind   (1)  b"P": wrapped under patient keys; b"D": under its destination's key
    count  (2)  number of key references
    refs   (16 x count)  the key references, sorted, distinct
    wrap nonce (12) + wrapped data key (32 + 16 tag)
    nonce (12) + ciphertext (len(plaintext) + 16 tag)

The data key is wrapped under one key-encryption key combined from *every* referenced key
(HMAC-SHA-256 keyed by their concatenation, over the references): without any one of them the
combination cannot be computed, so destroying one patient's key leaves the message unreadable
(n-of-n, as an XOR split of the data key would be, with one wrap instead of n). The payload
binds the header and the destination as associated data; the wrap binds them and the message
(row) ID: an envelope copied into another row, or another destination's queue, does not open,
and neither does a payload spliced under another row's wrap (its data key differs). So the
payload can be encrypted before its row ID is known (:func:`seal_body`, ingest does it before it
takes the enqueue locks) and only the 48-byte wrap made once it is (:func:`bind`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from inturn.worker.crypto.errors import EnvelopeError, Undecryptable

#: What every envelope starts with (and no plaintext payload does).
PREFIX = b"\x00ie1"

#: Wrapped under the keys of the patients the message names.
PATIENTS = b"P"
#: Wrapped under the key of the message's destination (it names no patient).
DESTINATION = b"D"

#: Bytes of a key reference (a truncated HMAC, :mod:`inturn.worker.crypto.blind`).
REF_BYTES = 16
#: Bytes of every key (AES-256).
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_WRAPPED = NONCE_BYTES + KEY_BYTES + TAG_BYTES
_HEAD = len(PREFIX) + 1 + 2
#: Most key references an envelope holds (the 2-byte count).
MAX_REFS = 0xFFFF


__all__ = ["EnvelopeError", "Undecryptable"]


@cache
def _lib() -> tuple[Any, type[Exception]]:
    """pyca ``cryptography``'s AESGCM and InvalidTag, imported on first use (about 9 MiB that a
    process without payload keys never loads)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM, InvalidTag


def is_envelope(stored: bytes) -> bool:
    """Whether ``stored`` is an envelope (by its prefix) rather than a plaintext payload."""
    return stored[: len(PREFIX)] == PREFIX


@dataclass(frozen=True)
class Header:
    """The clear part of an envelope: which keys open it.

    Attributes:
        kind: :data:`PATIENTS` or :data:`DESTINATION`.
        refs: the key references, sorted, distinct (16 bytes each).
        size: bytes of the header (where the wrapped data key starts).
    """

    kind: bytes
    refs: tuple[bytes, ...]
    size: int


def _header_bytes(kind: bytes, refs: Sequence[bytes]) -> bytes:
    return PREFIX + kind + struct.pack(">H", len(refs)) + b"".join(refs)


def _aad(header: bytes, message_id: int, destination: str) -> bytes:
    return header + struct.pack(">q", message_id) + destination.encode("utf-8", "surrogatepass")


def _body_aad(header: bytes, destination: str) -> bytes:
    return header + b"\xff" + destination.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Body:
    """A payload encrypted before its row ID is known (:func:`seal_body`): what :func:`bind`
    completes into an envelope. Holds the data key: keep it in memory only, briefly.

    Attributes:
        header: the envelope's clear header (prefix, kind, references).
        kek: the key-encryption key combined from the referenced keys.
        data_key: the fresh data key the body is encrypted under.
        destination: the destination bound in.
        body: nonce and ciphertext of the payload.
    """

    header: bytes
    kek: bytes
    data_key: bytes
    destination: str
    body: bytes


def new_key() -> bytes:
    """A fresh random 32-byte key (a data key, a patient's or a destination's key)."""
    return os.urandom(KEY_BYTES)


def combine(keys: Sequence[bytes], refs: Sequence[bytes]) -> bytes:
    """The key-encryption key of ``keys`` (in the order of ``refs``): HMAC-SHA-256 keyed by
    their concatenation, over a label and the references (RFC 2104). 32 bytes."""
    return hmac.digest(b"".join(keys), b"inturn kek v1\x00" + b"".join(refs), hashlib.sha256)


def canonical_refs(refs: Sequence[bytes]) -> tuple[bytes, ...]:
    """``refs`` sorted and without repeats (the order envelopes store and combine them in).

    Raises:
        ValueError: none given, more than :data:`MAX_REFS`, or one not :data:`REF_BYTES` long.
    """
    out = tuple(sorted(set(refs)))
    if not out or len(out) > MAX_REFS or any(len(r) != REF_BYTES for r in out):
        raise ValueError(f"an envelope needs 1 to {MAX_REFS} key references of {REF_BYTES} bytes")
    return out


def seal(
    plaintext: bytes,
    *,
    message_id: int,
    destination: str,
    kind: bytes,
    keys: Mapping[bytes, bytes],
) -> bytes:
    """Encrypt ``plaintext`` for row ``message_id`` of ``destination``.

    Args:
        kind: :data:`PATIENTS` or :data:`DESTINATION`.
        keys: key reference -> key (32 bytes) for every key the message is wrapped under.

    Returns:
        The envelope (header + 60 + len(plaintext) + 28 bytes).

    Raises:
        ValueError: no keys, a key not 32 bytes, or a reference not 16 bytes.
    """
    return bind(seal_body(plaintext, destination=destination, kind=kind, keys=keys), message_id)


def seal_body(
    plaintext: bytes, *, destination: str, kind: bytes, keys: Mapping[bytes, bytes]
) -> Body:
    """The bulk of :func:`seal`, before the row ID is known: ``plaintext`` encrypted under a
    fresh data key, bound to ``destination``.

    Raises:
        ValueError: no keys, a key not 32 bytes, or a reference not 16 bytes.
    """
    refs = canonical_refs(list(keys))
    chosen = [keys[r] for r in refs]
    if any(len(k) != KEY_BYTES for k in chosen):
        raise ValueError(f"keys are {KEY_BYTES} bytes")
    header = _header_bytes(kind, refs)
    data_key = new_key()
    nonce = os.urandom(NONCE_BYTES)
    body = _lib()[0](data_key).encrypt(nonce, plaintext, _body_aad(header, destination))
    return Body(header, combine(chosen, refs), data_key, destination, nonce + body)


def bind(body: Body, message_id: int) -> bytes:
    """The envelope of ``body`` for row ``message_id``: the data key wrapped, bound to the row
    ID and the destination (a few microseconds: ingest does it under the enqueue locks)."""
    wrap_nonce = os.urandom(NONCE_BYTES)
    aad = _aad(body.header, message_id, body.destination)
    wrapped = _lib()[0](body.kek).encrypt(wrap_nonce, body.data_key, aad)
    return b"".join((body.header, wrap_nonce, wrapped, body.body))


def header(stored: bytes) -> Header:
    """The header of envelope ``stored``.

    Raises:
        EnvelopeError: not an envelope, or cut short.
    """
    if not is_envelope(stored) or len(stored) < _HEAD:
        raise EnvelopeError("the stored payload is not a well-formed envelope")
    kind = stored[len(PREFIX) : len(PREFIX) + 1]
    (count,) = struct.unpack(">H", stored[len(PREFIX) + 1 : _HEAD])
    size = _HEAD + count * REF_BYTES
    if kind not in (PATIENTS, DESTINATION) or count == 0:
        raise EnvelopeError("the stored payload is not a well-formed envelope")
    if len(stored) < size + _WRAPPED + NONCE_BYTES + TAG_BYTES:
        raise EnvelopeError("the stored payload is a truncated envelope")
    refs = tuple(stored[_HEAD + i * REF_BYTES : _HEAD + (i + 1) * REF_BYTES] for i in range(count))
    return Header(kind, refs, size)


def open_envelope(
    stored: bytes,
    *,
    message_id: int,
    destination: str,
    keys: Mapping[bytes, bytes],
    head: Header | None = None,
) -> bytes:
    """The plaintext of envelope ``stored`` of row ``message_id`` of ``destination``.

    Args:
        keys: key reference -> key, at least every reference of the header.
        head: the header, when the caller has parsed it already.

    Raises:
        EnvelopeError: malformed.
        KeyError: a referenced key is not in ``keys``.
        Undecryptable: a key is wrong, or the envelope, row ID or destination differ from
            what it was sealed for.
    """
    h = head or header(stored)
    prefix = stored[: h.size]
    aad = _aad(prefix, message_id, destination)
    body_aad = _body_aad(prefix, destination)
    kek = combine([keys[r] for r in h.refs], h.refs)
    at = h.size
    wrap_nonce, wrapped = stored[at : at + NONCE_BYTES], stored[at + NONCE_BYTES : at + _WRAPPED]
    at += _WRAPPED
    aesgcm, invalid_tag = _lib()
    try:
        data_key = aesgcm(kek).decrypt(wrap_nonce, wrapped, aad)
        nonce, body = stored[at : at + NONCE_BYTES], stored[at + NONCE_BYTES :]
        return bytes(aesgcm(data_key).decrypt(nonce, body, body_aad))
    except invalid_tag:
        raise Undecryptable("the envelope does not open with these keys") from None
