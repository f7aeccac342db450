"""What a process listens on, read from the kernel (imported as ``tests.support.sockets``)."""

from __future__ import annotations

import socket
from pathlib import Path

PROC_NET_TCP = Path("/proc/net/tcp")


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses a socket LISTENs on at ``port`` (from /proc/net/tcp; empty where
    there is no such file: callers skip first)."""
    found = set()
    if not PROC_NET_TCP.exists():
        return found
    for line in PROC_NET_TCP.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found
