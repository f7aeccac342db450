"""Unauthenticated or operator-facing ports listen on this machine only unless told otherwise:
``inturn console --listen`` without a host, the operator's ``--metrics`` port and its liveness
endpoint default to 127.0.0.1; the chart passes 0.0.0.0 to each (a pod's Service, Prometheus
and the kubelet reach its IP). Bound addresses are read from /proc/net/tcp."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from inturn.operator import cli as operator_cli
from inturn.operator.metrics import serve
from inturn.worker.cli.console import console_command
from tests.support.helm_chart import find, render
from tests.support.sockets import PROC_NET_TCP, listening_on

INTURN = Path(sys.executable).with_name("inturn")

pytestmark = pytest.mark.skipif(not PROC_NET_TCP.exists(), reason="reads /proc/net/tcp")


async def serving(args: list[str], tmp_path: Path) -> tuple[str, int, set[str]]:
    """Start ``inturn console ARGS``; the host and port its log says it serves on, and the
    addresses the kernel says it listens on; then stop it."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n  - name: t\n    roles: [viewer]\n    token: token-0123456789abcdef\n"
    )
    auth.chmod(0o600)  # a key file: others may not read it
    proc = await asyncio.create_subprocess_exec(
        str(INTURN), "console", "--auth-file", str(auth), *args,
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, "the console exited before serving"
                found = re.search(r"console serving on http://([\d.]+):(\d+)/", line)
                if found:
                    break
        host, port = found.group(1), int(found.group(2))
        return host, port, listening_on(port)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_the_console_listens_on_loopback_unless_a_host_is_given(
    fresh_db: str, tmp_path: Path
) -> None:
    alone = await serving(["--dsn", fresh_db, "--listen", "0"], tmp_path)
    assert alone[0] == "127.0.0.1" and alone[2] == {"127.0.0.1"}
    everywhere = await serving(["--dsn", fresh_db, "--listen", "0.0.0.0:0"], tmp_path)
    assert everywhere[0] == "0.0.0.0" and everywhere[2] == {"0.0.0.0"}


def test_the_consoles_default_address_is_this_machine() -> None:
    [listen] = [p for p in console_command.params if p.name == "listen"]
    assert listen.default == "127.0.0.1:8080"


def test_the_operators_metrics_listen_on_loopback_unless_a_host_is_given() -> None:
    alone = serve("0")
    assert listening_on(alone) == {"127.0.0.1"}
    everywhere = serve("0.0.0.0:0")
    assert listening_on(everywhere) == {"0.0.0.0"}


def test_the_operators_liveness_defaults_to_this_machine() -> None:
    params = {p.name: p for p in operator_cli.operator_command.params}
    liveness = urlsplit(str(params["liveness"].default))
    assert (liveness.hostname, liveness.port, liveness.path) == ("127.0.0.1", 8080, "/healthz")
    assert params["metrics"].default == ""  # off unless asked for


def test_the_chart_passes_every_interface_to_what_a_pod_must_expose() -> None:
    """The defaults are safe only because the chart says 0.0.0.0 for each: its probes and
    Prometheus reach the pod's IP."""
    objs = render(files=["console"])
    operator = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]
    console = find(objs, "Deployment", "inturn-console")["spec"]["template"]["spec"]
    [operator_args] = [c["args"] for c in operator["containers"]]
    [console_args] = [c["args"] for c in console["containers"]]
    assert "--liveness=http://0.0.0.0:8080/healthz" in operator_args
    assert "--metrics=0.0.0.0:9090" in operator_args
    assert "--listen=0.0.0.0:8080" in console_args
