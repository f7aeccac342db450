"""Who may post messages over HTTP, and to which channels: bearer tokens and client certificates.

The credentials file (YAML or JSON, usually a mounted Secret) lists named credentials, each
naming the channels it may post to (``"*"``: every channel)::

    credentials:
      - name: lab-system            # shown in logs, never the token
        channels: [lab]
        tokenSha256: 5e884898da28047151d0e56f8dc62927...  # hex SHA-256 of the token (preferred)
      - name: ris
        channels: [adt, orders]
        token: "a long random string of at least 24 characters"
      - name: pacs
        channels: ["*"]
        clientCertificate: pacs.hospital.example  # a verified certificate's CN or SAN value

A token is sent as ``Authorization: Bearer <token>`` (RFC 6750 section 2.1). Only SHA-256
digests of tokens are kept in memory; a presented token is hashed and compared with every
stored digest with :func:`hmac.compare_digest` (constant time, and no early exit), so neither
the comparison nor the position of the matching credential shows in the response time. Tokens
are random strings, so an unsalted digest is enough to make the file useless to a reader.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inturn.worker.ingest.routing import check_channel

#: Shortest plain-text token accepted in the file, in characters.
MIN_TOKEN_CHARS = 24
#: The channel wildcard.
ANY_CHANNEL = "*"

_FIELDS = {"name", "channels", "token", "tokenSha256", "clientCertificate"}
_KINDS = ("token", "tokenSha256", "clientCertificate")


class CredentialsError(ValueError):
    """The credentials file is unreadable or invalid; the message names the entry and field."""


def token_digest(token: str) -> bytes:
    """SHA-256 of a token's UTF-8 bytes (32 bytes)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def new_token() -> tuple[str, str]:
    """A fresh random token (32 bytes, URL-safe base64) and the hex SHA-256 to put in the file."""
    token = secrets.token_urlsafe(32)
    return token, token_digest(token).hex()


@dataclass(frozen=True)
class Credential:
    """One sender's credential.

    Attributes:
        name: a label for logs (never secret).
        channels: channel names it may post to; ``"*"`` allows every channel.
        token_sha256: SHA-256 of its bearer token (32 bytes), or None.
        subject: the client-certificate CN or SAN value it stands for, or None.
    """

    name: str
    channels: frozenset[str]
    token_sha256: bytes | None = None
    subject: str | None = None

    def allows(self, channel: str) -> bool:
        """Whether this credential may post to ``channel``."""
        return ANY_CHANNEL in self.channels or channel in self.channels


def parse_bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive), or
    None when the header is absent or uses another scheme."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Credentials:
    """The set of credentials ingest checks HTTP message requests against.

    Args:
        credentials: the entries (names must be distinct).
    """

    def __init__(self, credentials: Iterable[Credential]) -> None:
        self.entries = tuple(credentials)
        names = [c.name for c in self.entries]
        if len(set(names)) != len(names):
            raise CredentialsError("credential names must be distinct")
        self._tokens = [c for c in self.entries if c.token_sha256 is not None]
        self._subjects = [c for c in self.entries if c.subject is not None]

    @property
    def wants_certificates(self) -> bool:
        """True when some credential is a client certificate."""
        return bool(self._subjects)

    def authenticate(
        self, authorization: str | None, certificate_names: Iterable[str] = ()
    ) -> tuple[Credential, ...]:
        """The credentials the request proves: its bearer token's, and its certificate's.

        Args:
            authorization: the ``Authorization`` header, or None.
            certificate_names: CN and SAN values of the verified client certificate (empty
                without one).

        Returns:
            The matching credentials; empty means unauthenticated. A request that sends an
            ``Authorization`` header that does not match proves nothing, whatever certificate
            it also shows (a wrong token is a wrong credential, not an absent one).
        """
        if authorization is not None:
            token = parse_bearer(authorization)
            if token is None:
                return ()
            digest = token_digest(token)
            matched: Credential | None = None
            for credential in self._tokens:  # every digest is compared: no early exit
                assert credential.token_sha256 is not None
                if hmac.compare_digest(digest, credential.token_sha256):
                    matched = credential
            if matched is None:
                return ()
            found = [matched]
        else:
            found = []
        names = set(certificate_names)
        found.extend(c for c in self._subjects if c.subject in names)
        return tuple(found)

    @classmethod
    def from_data(cls, data: Any) -> Credentials:
        """Credentials from the parsed file (``{"credentials": [...]}``).

        Raises:
            CredentialsError: the message names the entry and the field at fault.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("credentials"), list):
            raise CredentialsError("expected a mapping with a list 'credentials'")
        return cls(_entry(i, raw) for i, raw in enumerate(data["credentials"]))

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        """Read a credentials file (YAML or JSON).

        Raises:
            CredentialsError: unreadable or invalid (the message names the file).
        """
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            return cls.from_data(data)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, CredentialsError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise CredentialsError(f"{path}: {detail}") from None


def _entry(index: int, raw: Any) -> Credential:
    where = f"credentials[{index}]"
    if not isinstance(raw, Mapping):
        raise CredentialsError(f"{where}: expected a mapping")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise CredentialsError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CredentialsError(f"{where}.name: required, a non-empty string")
    where = f"credentials[{index}] ({name})"
    channels = raw.get("channels")
    if not isinstance(channels, list) or not channels:
        raise CredentialsError(f"{where}.channels: required, a non-empty list")
    for channel in channels:
        if channel != ANY_CHANNEL:
            try:
                check_channel(str(channel))
            except ValueError as exc:
                raise CredentialsError(f"{where}.channels: {exc}") from None
    kinds = [k for k in _KINDS if raw.get(k) is not None]
    if len(kinds) != 1:
        raise CredentialsError(f"{where}: exactly one of token, tokenSha256, clientCertificate")
    value = raw[kinds[0]]
    if not isinstance(value, str) or not value.strip():
        raise CredentialsError(f"{where}.{kinds[0]}: a non-empty string")
    allowed = frozenset(str(c) for c in channels)
    if kinds[0] == "token":
        if len(value) < MIN_TOKEN_CHARS:
            raise CredentialsError(f"{where}.token: at least {MIN_TOKEN_CHARS} characters")
        return Credential(name, allowed, token_sha256=token_digest(value))
    if kinds[0] == "tokenSha256":
        try:
            digest = bytes.fromhex(value.strip())
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise CredentialsError(f"{where}.tokenSha256: 64 hexadecimal digits")
        return Credential(name, allowed, token_sha256=digest)
    return Credential(name, allowed, subject=value.strip())
