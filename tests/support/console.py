"""Helpers of the console tests: three identities (one per role), registering and enqueueing,
a real worker (:mod:`tests.support.pipeline`'s), and an HTTP client acting as one role."""

from __future__ import annotations

from typing import Any

import aiohttp
from psycopg import AsyncConnection

from inturn.worker.console.auth import AuthConfig, parse_auth
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support import db
from tests.support.pipeline import worker as run_worker
from tests.support.pipeline import worker_config

#: One bearer token per role; the name is what the audit records.
TOKENS = {
    "viewer": ("vera", "viewer-token-0123456789"),
    "operator": ("otto", "operator-token-0123456789"),
    "privacy": ("pia", "privacy-token-0123456789"),
}
AUTH: AuthConfig = parse_auth(
    {
        "tokens": [
            {"name": name, "roles": [role], "token": token}
            for role, (name, token) in TOKENS.items()
        ]
    }
)


def message(n: int, control: str | None = None) -> bytes:
    """A small ADT^A01 with MSH-10 ``MSG0000n`` (or ``control``)."""
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261129120000||ADT^A01|{control or f'MSG{n:05d}'}|P|2.5\r"
        f"PID|1||P{n}^^^HOSP^MR||DOE^JOHN\r"
    ).encode()


async def register(
    dsn: str,
    destination: str,
    channel: str = "adt",
    sender: str = "",
    stuck_after_seconds: int = 3,
) -> None:
    """Register ``destination`` as the operator would (stuck after 3 s, like the test console's
    default, so that an outage shows within a test)."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await db.register(
            conn, destination, channel, sender=sender, stuck_after_seconds=stuck_after_seconds
        )


async def enqueue(dsn: str, destination: str, numbers: list[int]) -> list[int]:
    """Enqueue messages ``numbers`` for ``destination``; their ids."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await queue.enqueue(
            conn,
            [NewItem(destination, "adt", f"MSG{n:05d}", "ADT^A01", message(n)) for n in numbers],
        )


def worker(dsn: str, destination: str, port: int) -> Any:
    """A real worker for ``destination`` sending over MLLP to ``127.0.0.1:port``, backing off
    one second between attempts (an async context manager)."""
    cfg = worker_config(destination, MllpSenderConfig("127.0.0.1", port))
    return run_worker(cfg, dsn)


class Client:
    """An HTTP client of the console acting as one role (or as nobody)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, role: str | None) -> None:
        self.session = session
        self.base = base
        self.headers = {"Authorization": f"Bearer {TOKENS[role][1]}"} if role else {}

    async def get(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.get(self.base + path, headers=self.headers, **kwargs) as r:
            return r.status, await _body(r)

    async def csrf(self) -> str:
        status, me = await self.get("/api/v1/me")
        assert status == 200, me
        return str(me["csrfToken"])

    async def post(self, path: str, body: Any = None, *, csrf: bool = True) -> tuple[int, Any]:
        headers = dict(self.headers)
        if csrf:
            headers["X-CSRF-Token"] = await self.csrf()
        async with self.session.post(self.base + path, json=body, headers=headers) as r:
            return r.status, await _body(r)

    async def form(self, path: str, fields: dict[str, str]) -> tuple[int, str, str]:
        """Post ``fields`` to ``path`` as the console's HTML forms do (``csrf_token`` added):
        the status, the URL answered (after redirects) and the page's text."""
        data = {"csrf_token": await self.csrf(), **fields}
        async with self.session.post(self.base + path, data=data, headers=self.headers) as r:
            return r.status, str(r.url), await r.text()


async def _body(r: aiohttp.ClientResponse) -> Any:
    if r.content_type == "application/json":
        return await r.json()
    return await r.text()


async def place_work(dsn: str, items: list[tuple[str, str, str, str]]) -> list[int]:
    """Place worklist items ``(queue, record_kind, record_key, reason)`` as the sweeper would;
    their ids."""
    from inturn.worker import worklist

    ids = []
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        for queue_name, kind, key, reason in items:
            placed = await worklist.place(
                conn,
                queue=queue_name,
                record_kind=kind,
                record_key=key,
                reason=reason,
                details={"attempts": 3},
                placed_by="sweeper",
            )
            ids.append(placed.item_id)
    return ids
