"""Who may connect to an MLLP listener: allowed source networks and client-certificate subjects.

Pure logic, no sockets. An MLLP channel may restrict its peers in two independent ways, as
interface engines do with their allowed-hosts lists:

* ``networks``: the peer's IP address must lie in one of these networks (CIDR, RFC 4632;
  IPv4-mapped IPv6 addresses such as ``::ffff:10.0.0.1`` count as their IPv4 address);
* ``subjects``: the peer must have presented a client certificate, verified against the
  listener's client CA, whose subject common name (CN) or one of whose subjectAltName entries
  (DNS, URI, email, IP address; RFC 5280 section 4.2.1.6) equals one of these names.

An empty list does not restrict; when both are set, a peer must satisfy both.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: subjectAltName kinds whose values count as a certificate's names.
SAN_KINDS = frozenset({"DNS", "URI", "email", "IP Address"})


def parse_network(text: str) -> IPNetwork:
    """Parse ``10.1.0.0/16``, ``2001:db8::/32`` or a single address (a /32 or /128).

    Raises:
        ValueError: not an address or network; or host bits set (``10.1.2.3/16``).
    """
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a network in CIDR notation ({exc})") from None


def certificate_names(peercert: Mapping[str, Any] | None) -> frozenset[str]:
    """The names a verified peer certificate carries: its subject CNs and subjectAltName values.

    Args:
        peercert: :meth:`ssl.SSLSocket.getpeercert` of a verified peer (a dict with
            ``subject`` as a tuple of RDNs of ``(key, value)`` pairs, ``subjectAltName`` as
            ``(kind, value)`` pairs), or None / ``{}`` when no certificate was presented.
    """
    if not peercert:
        return frozenset()
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(str(value))
    for kind, value in peercert.get("subjectAltName", ()):
        if kind in SAN_KINDS:
            names.add(str(value).strip())
    return frozenset(names)


def peer_address(peername: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address of an asyncio ``peername`` (``(host, port[, ...])``); None if not IP.

    IPv4-mapped IPv6 addresses are returned as IPv4, so IPv4 networks match them.
    """
    if not isinstance(peername, tuple) or not peername:
        return None
    try:
        address = ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class AllowList:
    """Who may connect to one MLLP channel (see the module docstring).

    Attributes:
        networks: allowed source networks; empty = any source address.
        subjects: allowed certificate CNs / SAN values; empty = no certificate required by
            this list (the listener's own TLS settings still apply).
    """

    networks: tuple[IPNetwork, ...] = ()
    subjects: frozenset[str] = field(default_factory=frozenset)

    @property
    def restricts(self) -> bool:
        """True when the list refuses anyone at all."""
        return bool(self.networks or self.subjects)

    def network_refusal(self, peername: Any) -> str | None:
        """None when the peer's address is allowed, else the refusal reason ``"network"``."""
        if not self.networks:
            return None
        address = peer_address(peername)
        if address is not None and any(address in net for net in self.networks):
            return None
        return "network"

    def subject_refusal(self, names: Iterable[str]) -> str | None:
        """None when one of the certificate ``names`` is allowed, else ``"subject"``."""
        if not self.subjects:
            return None
        return None if self.subjects.intersection(names) else "subject"

    @classmethod
    def build(cls, networks: Iterable[str] = (), subjects: Iterable[str] = ()) -> AllowList:
        """An allow-list from texts.

        Raises:
            ValueError: a network is not valid CIDR, or a subject is empty.
        """
        names = [s.strip() for s in subjects]
        if any(not n for n in names):
            raise ValueError("an allowed subject must not be empty")
        return cls(tuple(parse_network(n) for n in networks), frozenset(names))
