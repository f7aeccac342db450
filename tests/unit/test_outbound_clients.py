"""Every outbound HTTP client is made by inturn.worker.senders.outbound.client_session.

The source of the product (``worker/``, ``operator/``) is parsed and searched for a client made
any other way: a ``ClientSession(...)`` call, ``aiohttp.request(...)``, a ``RetryClient`` that
would make its own session, or a ``requests``/``httpx``/``urllib`` client. Tests and benchmarks
are clients of our own servers and are not searched.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The one module allowed to make a session.
OWNER = ROOT / "worker" / "senders" / "outbound.py"
#: Modules whose import means an HTTP client made outside the construction.
OTHER_CLIENTS = {"requests", "httpx", "urllib3", "urllib.request", "http.client"}


def sources() -> list[Path]:
    return sorted([*(ROOT / "worker").rglob("*.py"), *(ROOT / "operator").rglob("*.py")])


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def offences(path: Path, text: str) -> list[str]:
    """Each place in ``text`` that makes an outbound HTTP client other than through
    ``client_session``."""
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            last = name.rsplit(".", 1)[-1]
            if last == "ClientSession" and path != OWNER:
                found.append(f"{path.name}:{node.lineno}: {name}(...)")
            if name == "aiohttp.request":
                found.append(f"{path.name}:{node.lineno}: aiohttp.request(...)")
            if last == "RetryClient" and not any(k.arg == "client_session" for k in node.keywords):
                found.append(f"{path.name}:{node.lineno}: RetryClient without client_session")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for module in names:
                if module in OTHER_CLIENTS or module.split(".")[0] in {"requests", "httpx"}:
                    found.append(f"{path.name}:{node.lineno}: import {module}")
    return found


def test_no_outbound_client_is_made_elsewhere() -> None:
    found = [hit for path in sources() for hit in offences(path, path.read_text())]
    assert found == []


def test_the_search_finds_each_way_of_making_one() -> None:
    elsewhere = ROOT / "worker" / "elsewhere.py"
    for text in [
        "import aiohttp\nasync def f():\n    return aiohttp.ClientSession()\n",
        "from aiohttp import ClientSession\nasync def f():\n    return ClientSession(timeout=1)\n",
        "import aiohttp\nasync def f():\n    return aiohttp.request('GET', 'http://x')\n",
        "from aiohttp_retry import RetryClient\ndef f():\n    return RetryClient()\n",
        "import requests\n",
        "import httpx\n",
        "from urllib.request import urlopen\n",
    ]:
        assert offences(elsewhere, text), text
    allowed = (
        "from inturn.worker.senders.outbound import client_session\nclient_session(timeout=t)\n"
    )
    assert offences(elsewhere, allowed) == []
    assert offences(OWNER, "import aiohttp\naiohttp.ClientSession()\n") == []
