"""A real network partition between a worker and Postgres, with namespaces of our own.

Three places joined by three veth pairs, all addresses in 10.218.x.0/30 links that exist only
on this machine, inside namespaces this module makes and deletes:

* namespace ``pg``: a Postgres of its own (:class:`pgcluster.Cluster`) listening on
  ``PG_FOR_HOST`` (reached from the host, where the test and a second worker run) and
  ``PG_FOR_NODE`` (reached from the ``node`` namespace);
* namespace ``node``: worker A, as a process of its own (``inturn worker``); it reaches the
  host (the test's receiver, and the test reaching its probes) at ``HOST_FOR_NODE`` and is
  reached at ``NODE_FOR_HOST``;
* the host: the test.

:meth:`Partition.cut` adds an nftables table in ``node`` that drops every packet to and from
``PG_FOR_NODE``: no RST, no ICMP, exactly what a lost node or a split network looks like to
Postgres. Needs root, ``ip`` and ``nft``: :func:`missing` says why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request

import psycopg

from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig

#: Third octet of the first link: per process, so that a run killed before its cleanup (its links
#: and namespaces left behind) never shares addresses with the next one.
_BASE = 20 + 3 * (os.getpid() % 70)
PG_FOR_HOST, HOST_FOR_PG = f"10.218.{_BASE}.1", f"10.218.{_BASE}.2"
PG_FOR_NODE, NODE_FOR_PG = f"10.218.{_BASE + 1}.1", f"10.218.{_BASE + 1}.2"
NODE_FOR_HOST, HOST_FOR_NODE = f"10.218.{_BASE + 2}.1", f"10.218.{_BASE + 2}.2"
#: The destination the partition tests (and ``bench/partition.py``) split from its database.
DEST = "ward/split"
#: The port of the node's worker's health endpoints.
NODE_HTTP_PORT = 18080


def missing() -> str | None:
    """Why a partition cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no {tool} (apt-get install iproute2 nftables)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _in(netns: str, *args: str, check: bool = True) -> None:
    subprocess.run(
        ["ip", "netns", "exec", netns, *args], check=check, capture_output=True, timeout=30
    )


class Partition:
    """The namespaces and links above; :meth:`close` deletes them (and everything in them)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.pg = f"i18pg{tag}"
        self.node = f"i18nd{tag}"
        self._links: list[str] = []
        for netns in (self.pg, self.node):
            _ip("netns", "add", netns)
            _in(netns, "ip", "link", "set", "lo", "up")
        self._pair(f"hp{tag}", HOST_FOR_PG, f"ph{tag}", self.pg, PG_FOR_HOST)
        self._pair(f"hn{tag}", HOST_FOR_NODE, f"nh{tag}", self.node, NODE_FOR_HOST)
        # the node-pg link: both ends inside namespaces
        a, b = f"np{tag}", f"pn{tag}"
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        _ip("link", "set", a, "netns", self.node)
        _ip("link", "set", b, "netns", self.pg)
        _in(self.node, "ip", "addr", "add", f"{NODE_FOR_PG}/30", "dev", a)
        _in(self.pg, "ip", "addr", "add", f"{PG_FOR_NODE}/30", "dev", b)
        _in(self.node, "ip", "link", "set", a, "up")
        _in(self.pg, "ip", "link", "set", b, "up")

    def _pair(self, host_end: str, host_addr: str, ns_end: str, netns: str, ns_addr: str) -> None:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        self._links.append(host_end)
        _ip("link", "set", ns_end, "netns", netns)
        _ip("addr", "add", f"{host_addr}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _in(netns, "ip", "addr", "add", f"{ns_addr}/30", "dev", ns_end)
        _in(netns, "ip", "link", "set", ns_end, "up")

    def cut(self) -> None:
        """Drop everything between the node and Postgres, both ways, silently."""
        rules = (
            "table inet partition {\n"
            "  chain input { type filter hook input priority 0; policy accept;"
            f" ip saddr {PG_FOR_NODE} drop; }}\n"
            "  chain output { type filter hook output priority 0; policy accept;"
            f" ip daddr {PG_FOR_NODE} drop; }}\n"
            "}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", self.node, "nft", "-f", "-"],
            input=rules,
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )

    def heal(self) -> None:
        """Remove the drop rules."""
        _in(self.node, "nft", "delete", "table", "inet", "partition", check=False)

    def close(self) -> None:
        for netns in (self.node, self.pg):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)


def message(n: int) -> bytes:
    """A tiny ADT^A01 whose MSH-10 is ``S<n>`` (three digits)."""
    return f"MSH|^~\\&|A|B|C|D|2026||ADT^A01|S{n:03d}|P|2.5\rPID|1||{n}\r".encode()


def config(port: int) -> WorkerConfig:
    """The worker configuration of :data:`DEST` for the host's receiver on ``port``, as the node
    reaches it (``HOST_FOR_NODE``)."""
    return WorkerConfig(
        destination=DEST,
        channel="adt",
        sender=MllpSenderConfig(HOST_FOR_NODE, port),
        retry=RetryPolicy(max_attempts=0, backoff_seconds=1, max_backoff_seconds=1),
        idle_seconds=5,
    )


def probe(path: str) -> int:
    """The HTTP status of the node's worker's ``path`` (``/readyz``, ...); 0 when unreachable."""
    try:
        with urllib.request.urlopen(f"http://{NODE_FOR_HOST}:{NODE_HTTP_PORT}{path}", timeout=3):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def sessions_from_node(host_dsn: str) -> int:
    """How many sessions of the server at ``host_dsn`` come from the node."""
    with psycopg.connect(host_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE client_addr = %s", (NODE_FOR_PG,)
        ).fetchone()
    return int(row[0]) if row else 0
