"""What a sender would refuse at send time, said when the configuration is read.

Pure checks (no I/O) on the values of a sender's configuration that the transport libraries
refuse with an exception of their own when the first message goes out: a host that the IDNA
codec cannot encode (``a..b``, a 64-character label) or that holds a NUL, a TLS server name the
``ssl`` module refuses, a header with a control character (aiohttp: "Forbidden control character
detected in headers") or a name that is not an HTTP token, a URL whose port is out of range.
Each sender kind's :meth:`~inturn.worker.senders.kind.SenderKind.problems` calls them on its
node, for the manifest's validation (operator, ``inturn local``, ``inturn worker``) and again
in its :meth:`~inturn.worker.senders.kind.SenderKind.build`: one function decides both, so a
configuration that validates is one the sender can use.

Each function returns one line without the value (it may be a credential), or None.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

#: A host name's labels once IDNA-encoded: letters, digits, hyphen, underscore (seen in
#: service names); 1-63 each (RFC 1035 section 2.3.4).
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
#: Most characters of a host name (RFC 1035 section 2.3.4, without the final dot).
MAX_HOST = 253
#: Control characters: forbidden in a header value but HTAB (RFC 9110 section 5.5), and in
#: anything else we send or resolve.
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: An HTTP field name: a token (RFC 9110 section 5.1 and 5.6.2).
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
#: Schema pattern of a header value: no control character but HTAB (RFC 9110 section 5.5).
HEADER_VALUE_PATTERN = r"^[^\x00-\x08\x0a-\x1f\x7f]*$"
#: Schema pattern of a host or server name: no whitespace, no control character, no slash.
HOST_PATTERN = r"^[^\s\x00-\x1f\x7f/]*$"
#: Header names the HTTP sender sets itself (message framing and the connection): configured,
#: they would contradict the request it writes (RFC 9112 section 6, RFC 9110 section 7.6.1).
FRAMING_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)


def field(name: str, problem: str | None) -> list[str]:
    """``[f"{name}: {problem}"]``, or ``[]`` without a problem."""
    return [] if problem is None else [f"{name}: {problem}"]


def text_problem(value: object) -> str | None:
    """Why ``value`` cannot be sent as a name or path (a control character), or None."""
    if value is None:
        return None
    if not isinstance(value, str) or CONTROL.search(value):
        return "must not contain control characters"
    return None


def host_problem(host: object) -> str | None:
    """Why ``host`` cannot be resolved as given (None when it can be tried): an IP address, or
    a name that IDNA-encodes to labels of 1-63 letters, digits, hyphens or underscores, at most
    253 characters, optionally with a final dot."""
    if not isinstance(host, str) or not host:
        return "must be a host name or an IP address"
    if CONTROL.search(host) or any(c.isspace() for c in host):
        return "must not contain whitespace or control characters"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
        return "is not a valid host name (empty or over-long label, or a character IDNA refuses)"
    if len(ascii_name) > MAX_HOST or not all(_LABEL.match(p) for p in ascii_name.split(".")):
        return (
            "is not a valid host name (labels of 1-63 letters, digits, '-' or '_',"
            f" {MAX_HOST} characters at most)"
        )
    return None


def server_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a TLS server name (SNI and the name verified): as a host, and
    not starting with a dot (the ``ssl`` module's own refusal)."""
    if isinstance(name, str) and name.startswith("."):
        return "must not start with a dot"
    return host_problem(name)


def url_problem(url: object) -> str | None:
    """Why ``url`` cannot be requested (None when it can): http or https, a valid host
    (:func:`host_problem`, an IPv6 address in brackets), a port from 1 to 65535 if given, no
    whitespace or control characters."""
    if not isinstance(url, str):
        return "must be a URL"
    if CONTROL.search(url) or any(c.isspace() for c in url):
        return "must not contain whitespace or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({str(exc).split(':')[0]})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if parts.hostname is None:
        return "must name a host"
    if port is not None and not 1 <= port <= 65535:
        return "must have a port from 1 to 65535"
    if parts.netloc.endswith(":"):
        return "must have a port after ':'"
    problem = host_problem(parts.hostname)
    return None if problem is None else f"host {problem}"


def header_problems(headers: object, where: str = "headers") -> list[str]:
    """Lines saying which of ``headers`` (name -> value) cannot be sent: a name that is not an
    HTTP token or that the sender sets itself (:data:`FRAMING_HEADERS`), a value with a control
    character. Values are never repeated (they may be credentials)."""
    if not isinstance(headers, Mapping):
        return [f"{where}: must be a mapping of names to values"]
    problems = []
    for name, value in headers.items():
        shown = name if isinstance(name, str) and HEADER_NAME.match(name) else None
        label = f"{where}.{shown}" if shown else f"{where}: a header name"
        if shown is None:
            problems.append(
                f"{label} is not an HTTP field name (letters, digits and !#$%&'*+-.^_`|~ only)"
            )
            continue
        if name.lower() in FRAMING_HEADERS:
            problems.append(f"{label}: is set by the sender itself and cannot be configured")
        if not isinstance(value, str) or CONTROL.search(value):
            problems.append(f"{label}: the value must not contain control characters (CR, LF, ...)")
    return problems
