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

:class:`CredentialsFile` re-reads the file when it changes (a rotated or revoked token in an
updated Secret takes effect without a restart); an invalid new version is logged and the last
good one stays in force.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inturn.worker.crypto.keyfiles import KeyFileExposed, check_key_file
from inturn.worker.errors import Invalid
from inturn.worker.ingest.routing import check_channel
from inturn.worker.spec.documents import DocumentError, read_document

log = logging.getLogger("inturn.ingest.credentials")

#: Shortest plain-text token accepted in the file, in characters.
MIN_TOKEN_CHARS = 24
#: The channel wildcard.
ANY_CHANNEL = "*"

_FIELDS = {"name", "channels", "token", "tokenSha256", "clientCertificate"}
_KINDS = ("token", "tokenSha256", "clientCertificate")


class CredentialsError(Invalid):
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

    def current(self) -> Credentials:
        """These credentials (the same interface as :meth:`CredentialsFile.current`)."""
        return self

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
            CredentialsError: unreadable, invalid, or others may read it
                (:func:`inturn.worker.crypto.keyfiles.check_key_file`; the message names the
                file).
        """
        try:
            check_key_file(path, "--http-credentials")  # it may list tokens in clear
            data = read_document(path)
            return cls.from_data(data)
        except KeyFileExposed as exc:
            raise CredentialsError(str(exc)) from None
        except (OSError, DocumentError, CredentialsError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise CredentialsError(f"{path}: {detail}") from None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()  # follows the symlinks of a mounted Secret
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class CredentialsFile:
    """A credentials file that is read again when it changes.

    Args:
        path: the YAML or JSON file (usually a mounted Secret; Kubernetes replaces it by
            swapping a symlink, which changes the file's inode and time).
        interval: seconds between two looks at the file (a ``stat``; the file is read only
            when it changed).

    Raises:
        CredentialsError: the file is unreadable or invalid at start.
    """

    def __init__(self, path: str | Path, interval: float = 10.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self._stamp = _stamp(self.path)
        self._credentials = Credentials.load(self.path)
        self._checked = time.monotonic()

    def current(self) -> Credentials:
        """The credentials in force: the file's latest valid version."""
        now = time.monotonic()
        if now - self._checked < self.interval:
            return self._credentials
        self._checked = now
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return self._credentials
        self._stamp = stamp
        try:
            self._credentials = Credentials.load(self.path)
        except CredentialsError as exc:
            log.error("credentials not reloaded, the previous ones stay in force: %s", exc)
        else:
            log.info(
                "credentials reloaded from %s: %d credential(s)",
                self.path,
                len(self._credentials.entries),
            )
        return self._credentials

    @property
    def wants_certificates(self) -> bool:
        """True when some credential of the current version is a client certificate."""
        return self.current().wants_certificates


#: What ingest checks requests against: fixed credentials, or a file that may change.
CredentialSource = Credentials | CredentialsFile


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
