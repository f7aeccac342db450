"""``[HOST:]PORT`` as every command and configuration writes an address. Pure."""

from __future__ import annotations


def parse_address(value: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """Parse ``[HOST:]PORT`` (``[::1]:2575`` for IPv6) into ``(host, port)``.

    Raises:
        ValueError: no valid port (0-65535).
    """
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host = default_host
    host = host.strip("[]") or default_host
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{value!r}: the port must be a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{value!r}: the port must be between 0 and 65535")
    return host, port
