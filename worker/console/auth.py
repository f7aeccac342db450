"""Who is asking: identities, roles, and the two ways to prove one.

* A bearer token (``Authorization: Bearer <token>``) listed in the console's auth file, which
  the chart mounts from a Secret. Tokens may be listed in clear or as their SHA-256; either way
  only digests are kept in memory and a presented token is compared with each in constant time.
* A trusted proxy in front (oauth2-proxy style) that has already authenticated the user and
  passes the name in a header (``X-Forwarded-User`` by default) and the groups in another
  (``X-Forwarded-Groups``, comma-separated). The headers are believed only when the TCP peer is
  one of the configured proxy addresses; from anywhere else they are ignored.

Roles: ``viewer`` (overview and listings), ``operator`` (actions on queues and worklists),
``privacy`` (reading payloads, erasure). Any role implies ``viewer``.

The auth file (YAML, checked against :data:`AUTH_FILE_SCHEMA`)::

    tokens:
      - {name: oncall-bot, roles: [operator], sha256: "<hex of the token>"}
      - {name: dpo, roles: [privacy], token: "<the token itself>"}
    proxy:
      trustedAddresses: ["10.0.0.0/8"]
      userHeader: X-Forwarded-User
      groupsHeader: X-Forwarded-Groups
      groupRoles: {oncall: [operator], privacy-office: [privacy]}
      defaultRoles: [viewer]
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from inturn.worker.crypto.keyfiles import KeyFileExposed, check_key_file
from inturn.worker.errors import Invalid
from inturn.worker.spec.documents import DocumentError, read_document

ROLES = ("viewer", "operator", "privacy")

#: What a user name from a token or a proxy header may look like (it lands in the audit).
NAME_PATTERN = re.compile(r"^[\w.@+:/ -]{1,200}$")

AUTH_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "tokens": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "roles"],
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN.pattern},
                    "roles": {"type": "array", "items": {"enum": list(ROLES)}, "minItems": 1},
                    "token": {"type": "string", "minLength": 16},
                    "sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
                },
                "oneOf": [{"required": ["token"]}, {"required": ["sha256"]}],
            },
        },
        "proxy": {
            "type": "object",
            "additionalProperties": False,
            "required": ["trustedAddresses"],
            "properties": {
                "trustedAddresses": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "userHeader": {"type": "string", "minLength": 1},
                "groupsHeader": {"type": "string", "minLength": 1},
                "groupRoles": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"enum": list(ROLES)}},
                },
                "defaultRoles": {"type": "array", "items": {"enum": list(ROLES)}},
            },
        },
    },
}


class AuthConfigError(Invalid):
    """The auth file is unreadable or invalid (the message names the field)."""


@dataclass(frozen=True)
class Identity:
    """An authenticated caller: the name recorded as ``who``, and the roles it holds."""

    name: str
    roles: frozenset[str]

    def can(self, role: str) -> bool:
        """Whether this identity holds ``role`` (every role implies ``viewer``)."""
        return role in self.roles or (role == "viewer" and bool(self.roles))


@dataclass(frozen=True)
class Proxy:
    """A trusted authenticating proxy: where it connects from and which headers it sets."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    group_roles: Mapping[str, frozenset[str]] = field(default_factory=dict)
    default_roles: frozenset[str] = frozenset({"viewer"})

    def trusts(self, peer: str | None) -> bool:
        """Whether ``peer`` (an IP address text) is one of the proxy's addresses."""
        if not peer:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


@dataclass(frozen=True)
class AuthConfig:
    """Token digests (SHA-256 bytes -> identity), an optional trusted proxy, and, for
    ``inturn local`` only, an identity given to every caller on the loopback interface."""

    tokens: tuple[tuple[bytes, Identity], ...] = ()
    proxy: Proxy | None = None
    loopback: Identity | None = None

    def authenticate(self, headers: Mapping[str, str], peer: str | None) -> Identity | None:
        """Return the caller's identity, or None (the caller gets 401 and nothing else).

        A bearer token is tried first; then the proxy headers, only from a trusted peer.
        ``headers`` may be a multi-dict (aiohttp's): a request carrying an identity header
        (``Authorization``, the proxy's user or groups header) more than once is refused,
        since which copy a proxy added and which the client sent cannot be told apart.
        """
        if len(_values(headers, "Authorization")) > 1:
            return None
        authorization = headers.get("Authorization", "")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return self._by_token(token.strip())
        if self.proxy is not None and self.proxy.trusts(peer):
            return self._by_proxy(headers, self.proxy)
        if self.loopback is not None and _is_loopback(peer):
            return self.loopback
        return None

    def _by_token(self, token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).digest()
        found: Identity | None = None
        for known, identity in self.tokens:
            if hmac.compare_digest(known, digest):
                found = identity
        return found

    @staticmethod
    def _by_proxy(headers: Mapping[str, str], proxy: Proxy) -> Identity | None:
        names = _values(headers, proxy.user_header)
        groups = _values(headers, proxy.groups_header)
        if len(names) != 1 or len(groups) > 1:
            return None  # a proxy that appends rather than replaces would let the client choose
        name = names[0].strip()
        if not NAME_PATTERN.match(name):
            return None
        roles = set(proxy.default_roles)
        for group in (groups or [""])[0].split(","):
            roles |= proxy.group_roles.get(group.strip(), frozenset())
        if not roles:
            return None
        return Identity(name=name, roles=frozenset(roles))


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of header ``name``: all of a multi-dict's (``getall``), else the one value."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, []))
    value = headers.get(name)
    return [] if value is None else [value]


def _is_loopback(peer: str | None) -> bool:
    try:
        return peer is not None and ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


def parse_auth(doc: Any) -> AuthConfig:
    """Build an :class:`AuthConfig` from the auth file's parsed YAML.

    Raises:
        AuthConfigError: the document does not match :data:`AUTH_FILE_SCHEMA` or an address
            is not a network.
    """
    if doc is None:
        doc = {}
    try:
        jsonschema.validate(doc, AUTH_FILE_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise AuthConfigError(f"auth file: {where}: {exc.message}") from None
    tokens = []
    for entry in doc.get("tokens", []):
        digest = (
            bytes.fromhex(entry["sha256"])
            if "sha256" in entry
            else hashlib.sha256(entry["token"].encode()).digest()
        )
        tokens.append((digest, Identity(entry["name"], frozenset(entry["roles"]))))
    proxy = None
    if "proxy" in doc:
        p = doc["proxy"]
        try:
            networks = tuple(ipaddress.ip_network(a, strict=False) for a in p["trustedAddresses"])
        except ValueError as exc:
            raise AuthConfigError(f"auth file: proxy/trustedAddresses: {exc}") from None
        proxy = Proxy(
            networks=networks,
            user_header=p.get("userHeader", "X-Forwarded-User"),
            groups_header=p.get("groupsHeader", "X-Forwarded-Groups"),
            group_roles={g: frozenset(r) for g, r in p.get("groupRoles", {}).items()},
            default_roles=frozenset(p.get("defaultRoles", ["viewer"])),
        )
    return AuthConfig(tokens=tuple(tokens), proxy=proxy)


def load_auth(path: Path) -> AuthConfig:
    """Read and check the auth file at ``path``.

    Raises:
        AuthConfigError: unreadable, not YAML, invalid, or others may read it (it may list
            tokens in clear: :func:`inturn.worker.crypto.keyfiles.check_key_file`).
    """
    try:
        check_key_file(path, "--auth-file")
        doc = read_document(path)
    except KeyFileExposed as exc:
        raise AuthConfigError(str(exc)) from None
    except (OSError, DocumentError) as exc:
        raise AuthConfigError(f"auth file {path}: {exc}") from None
    return parse_auth(doc)
