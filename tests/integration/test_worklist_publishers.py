"""The built-in publishers against real peers: Postgres LISTEN, an HTTP server, a NATS server."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any
from urllib.parse import urlparse

import nats
import pytest
from aiohttp import web
from psycopg import AsyncConnection

from inturn.worker import worklist
from inturn.worker.worklist.publishers import from_env
from inturn.worker.worklist.publishers.nats import NatsPublisher
from inturn.worker.worklist.publishers.notify import NotifyPublisher
from inturn.worker.worklist.publishers.webhook import (
    SIGNATURE_HEADER,
    WebhookError,
    WebhookPublisher,
    sign,
)

pytestmark = pytest.mark.store

NATS_URL = os.environ.get("INTURN_TEST_NATS_URL", "nats://127.0.0.1:4222")


def nats_reachable() -> bool:
    url = urlparse(NATS_URL)
    try:
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 4222), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def nats_url() -> str:
    """The NATS server; skipped with the reason where there is none, unless CI requires it."""
    if not nats_reachable():
        reason = f"no NATS server at {NATS_URL} (set INTURN_TEST_NATS_URL)"
        if os.environ.get("INTURN_REQUIRE_NATS"):
            pytest.fail(f"INTURN_REQUIRE_NATS is set but there is {reason}")
        pytest.skip(reason)
    return NATS_URL


async def placed(conn: AsyncConnection[Any], key: str = "41") -> worklist.Placement:
    return await worklist.place(
        conn,
        queue="delivery-failed",
        record_kind="delivery",
        record_key=key,
        reason="gave-up",
        details={"destination": "hospital/lab"},
        placed_by="worker",
    )


async def test_nats_message_is_read_back_from_a_subscription(
    conn: AsyncConnection[Any], nats_url: str
) -> None:
    reader = await nats.connect(nats_url)
    publisher = NatsPublisher(nats_url, subject_prefix="inturn-test.worklist")
    try:
        sub = await reader.subscribe("inturn-test.worklist.>")
        await reader.flush()
        placement = await placed(conn)
        assert await worklist.announce([placement], [publisher]) == 0
        msg = await sub.next_msg(timeout=10)
    finally:
        await publisher.close()
        await reader.close()
    assert msg.subject == "inturn-test.worklist.delivery-failed"
    body = json.loads(msg.data)
    assert (body["id"], body["queue"], body["recordKey"], body["state"]) == (
        placement.item_id,
        "delivery-failed",
        "41",
        "pending",
    )


async def test_notify_reaches_a_listener(conn: AsyncConnection[Any], fresh_db: str) -> None:
    listener = await AsyncConnection.connect(fresh_db, autocommit=True)
    publisher = NotifyPublisher(fresh_db, "inturn_worklist_test")
    try:
        await listener.execute("LISTEN inturn_worklist_test")
        placement = await placed(conn)
        assert await worklist.announce([placement], [publisher]) == 0
        gen = listener.notifies(timeout=10, stop_after=1)
        got = [n async for n in gen]
    finally:
        await publisher.close()
        await listener.close()
    assert len(got) == 1
    body = json.loads(got[0].payload)
    assert (body["id"], body["reason"], body["recordKind"]) == (
        placement.item_id,
        "gave-up",
        "delivery",
    )
    assert "details" not in body


class Receiver:
    """A real HTTP server on a free port answering from a script of statuses."""

    def __init__(self, statuses: list[int], delay: float = 0.0) -> None:
        self.statuses = statuses
        self.delay = delay
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append((dict(request.headers), body))
        if self.delay and len(self.requests) == 1:
            await asyncio.sleep(self.delay)
        status = self.statuses[min(len(self.requests), len(self.statuses)) - 1]
        return web.Response(status=status)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def test_webhook_retries_server_errors_and_signs(conn: AsyncConnection[Any]) -> None:
    placement = await placed(conn)
    async with Receiver([503, 500, 200]) as receiver:
        publisher = WebhookPublisher(
            receiver.url, secret=b"s3cret", attempts=3, backoff_seconds=0.01
        )
        try:
            assert await worklist.announce([placement], [publisher]) == 0
        finally:
            await publisher.close()
    assert len(receiver.requests) == 3
    headers, body = receiver.requests[-1]
    assert headers[SIGNATURE_HEADER] == sign(b"s3cret", body)
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["id"] == placement.item_id


async def test_webhook_gives_up_after_its_attempts(conn: AsyncConnection[Any]) -> None:
    placement = await placed(conn)
    async with Receiver([500]) as receiver:
        publisher = WebhookPublisher(receiver.url, attempts=2, backoff_seconds=0.01)
        try:
            with pytest.raises(WebhookError, match="HTTP 500"):
                await publisher.publish(placement.item)
            assert await worklist.announce([placement], [publisher]) == 1
        finally:
            await publisher.close()
    assert len(receiver.requests) == 4
    assert SIGNATURE_HEADER not in receiver.requests[0][0]
    # The placement is untouched by the failed announcement.
    stored = await worklist.get(conn, placement.item_id)
    assert stored is not None and stored.state == "pending"


async def test_webhook_does_not_retry_a_client_error(conn: AsyncConnection[Any]) -> None:
    placement = await placed(conn)
    async with Receiver([404]) as receiver:
        publisher = WebhookPublisher(receiver.url, attempts=3, backoff_seconds=0.01)
        try:
            with pytest.raises(WebhookError, match="HTTP 404"):
                await publisher.publish(placement.item)
        finally:
            await publisher.close()
    assert len(receiver.requests) == 1


async def test_webhook_timeout_is_retried(conn: AsyncConnection[Any]) -> None:
    placement = await placed(conn)
    async with Receiver([200], delay=1.0) as receiver:
        publisher = WebhookPublisher(
            receiver.url, timeout_seconds=0.2, attempts=2, backoff_seconds=0.01
        )
        try:
            await publisher.publish(placement.item)
        finally:
            await publisher.close()
    assert len(receiver.requests) == 2


def test_publishers_from_the_environment() -> None:
    assert from_env({}, "dbname=x") == []
    chosen = from_env(
        {
            "INTURN_WORKLIST_NOTIFY": "inturn_worklist",
            "INTURN_WORKLIST_WEBHOOK_URL": "https://example.invalid/hook",
            "INTURN_WORKLIST_WEBHOOK_ATTEMPTS": "5",
            "INTURN_WORKLIST_NATS_URL": "nats://a:4222, nats://b:4222",
        },
        "dbname=x",
    )
    assert [p.name for p in chosen] == ["notify", "webhook", "nats"]
    with pytest.raises(ValueError, match="INTURN_WORKLIST_WEBHOOK_TIMEOUT"):
        from_env(
            {"INTURN_WORKLIST_WEBHOOK_URL": "http://h/", "INTURN_WORKLIST_WEBHOOK_TIMEOUT": "x"},
            "dbname=x",
        )
    with pytest.raises(ValueError, match="INTURN_WORKLIST_NOTIFY"):
        from_env({"INTURN_WORKLIST_NOTIFY": "Bad Name"}, "dbname=x")
    with pytest.raises(ValueError, match="INTURN_WORKLIST_WEBHOOK_URL"):
        from_env({"INTURN_WORKLIST_WEBHOOK_URL": "ftp://h/"}, "dbname=x")
