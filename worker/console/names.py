"""The names the console serves under, and the check of ``Host`` and ``Origin`` against them.

A web page on another site can make a browser send requests to a console on loopback by
rebinding its own name to 127.0.0.1 (DNS rebinding): the browser then treats the console as
that site and lets the page read the answers. Such requests carry the page's name in ``Host``
(RFC 9110 §7.2), so the console answers only requests whose ``Host`` is one of its own names
(``421 Misdirected Request``, RFC 9110 §15.5.20, otherwise), in every auth mode, and checks a
state change's ``Origin`` (RFC 6454) against the same names, never against the request's own
``Host``.

A name is a host name or address, optionally with a port (``console.example.org``,
``console.example.org:8443``, ``[::1]:8080``): without a port any port matches. The default is
the loopback names (``localhost``, ``127.0.0.1``, ``::1``); ``inturn console --server-name``
(``INTURN_CONSOLE_SERVER_NAMES``, chart ``console.serverNames``) sets them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

#: The names of the loopback interface: the default of ``inturn console`` and ``inturn local``.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _split(authority: str) -> tuple[str, int | None] | None:
    """``host[:port]`` -> (lower-case host without brackets or a trailing dot, port), or None
    when it is not a host and port (RFC 3986 §3.2)."""
    if not authority or any(c in authority for c in "/?#@\\ \t") or not authority.isascii():
        return None
    try:
        parts = urlsplit("//" + authority)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    return (host, port) if host else None


@dataclass(frozen=True)
class ServerNames:
    """The console's names: ``(host, port or None for any)`` pairs.

    Raises (from :meth:`parse`):
        ValueError: a name that is not ``host[:port]``.
    """

    names: frozenset[tuple[str, int | None]]

    @classmethod
    def parse(cls, names: Iterable[str]) -> ServerNames:
        """From ``host[:port]`` texts (IPv6 addresses in brackets when a port follows; bare
        ``::1`` is read as an address). Empty: the loopback names."""
        pairs: set[tuple[str, int | None]] = set()
        for name in names:
            text = name.strip()
            if not text:
                continue
            if text.count(":") > 1 and not text.startswith("["):
                text = f"[{text}]"  # a bare IPv6 address
            split = _split(text)
            if split is None:
                raise ValueError(f"server name {name!r} is not a host name or host:port")
            pairs.add(split)
        if not pairs:
            return cls.parse(LOOPBACK_NAMES)
        return cls(frozenset(pairs))

    def serves(self, authority: str | None) -> bool:
        """Whether a ``Host`` header (``host[:port]``) names this server."""
        split = _split(authority or "")
        if split is None:
            return False
        host, port = split
        return (host, None) in self.names or (port is not None and (host, port) in self.names)

    def same_origin(self, origin: str | None) -> bool:
        """Whether an ``Origin`` header names this server (an absent Origin passes: the CSRF
        token is the defence then; browsers send Origin on cross-site posts). ``null`` and
        anything but ``http``/``https`` fail: the console's ``Referrer-Policy: same-origin``
        keeps browsers sending the real one."""
        if origin is None:
            return True
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or parts.path or parts.query:
            return False
        return self.serves(parts.netloc)

    def __str__(self) -> str:
        def show(host: str, port: int | None) -> str:
            shown = f"[{host}]" if ":" in host else host
            return shown if port is None else f"{shown}:{port}"

        return ", ".join(sorted(show(h, p) for h, p in self.names))
