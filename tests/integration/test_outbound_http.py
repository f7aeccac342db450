"""No outbound HTTP client follows a redirect (issue 27, item 3).

A real HTTP server answers each redirect status with a ``Location`` on a second real server;
the HTTP sender, the webhook publisher, ``inturn send``'s client and a bare session of
:func:`inturn.worker.senders.outbound.client_session` each get the 3xx as the answer, and the
second server is never asked anything (neither the body nor a signed header reaches it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web

from inturn.worker.cli.send import ReportFn, send_http
from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.http import HttpSender, HttpSenderConfig
from inturn.worker.senders.outbound import RedirectRefused, client_session, read_bounded
from inturn.worker.store.worklist_model import WorklistItem
from inturn.worker.worklist.publishers.webhook import (
    SIGNATURE_HEADER,
    WebhookError,
    WebhookPublisher,
)

REDIRECTS = [301, 302, 303, 307, 308]
MSG = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|R1|P|2.5.1\rPID|1||42\r"


class Site:
    """A real HTTP server on a free port: ``/redirect/<status>`` answers ``status`` with a
    Location on ``target``; ``/big`` answers 5 MiB; everything else is counted and answered 200."""

    def __init__(self, target: str = "") -> None:
        self.target = target
        self.hits: list[tuple[str, dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path.startswith("/redirect/"):
            status = int(request.path.rsplit("/", 1)[1])
            return web.Response(status=status, headers={"Location": self.target + "/stolen"})
        if request.path == "/big":
            return web.Response(status=200, body=b"x" * (5 * 1024 * 1024))
        self.hits.append((request.path, dict(request.headers), body))
        return web.Response(status=200)

    async def start(self) -> Site:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest_asyncio.fixture
async def sites() -> AsyncIterator[tuple[Site, Site]]:
    elsewhere = await Site().start()
    origin = await Site(target=elsewhere.url).start()
    try:
        yield origin, elsewhere
    finally:
        await origin.stop()
        await elsewhere.stop()


@pytest.mark.parametrize("status", REDIRECTS)
async def test_the_http_sender_reports_a_redirect_and_goes_nowhere(
    sites: tuple[Site, Site], status: int
) -> None:
    origin, elsewhere = sites
    sender = HttpSender(
        HttpSenderConfig(f"{origin.url}/redirect/{status}", headers={"Authorization": "Bearer t"})
    )
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(MSG)
    finally:
        await sender.close()
    assert info.value.outcome == "http"
    assert info.value.detail.startswith(f"HTTP {status}")
    assert elsewhere.hits == []


def item() -> WorklistItem:
    from datetime import UTC, datetime

    return WorklistItem(
        id=7,
        queue="delivery-failed",
        reason="gave-up",
        record_kind="delivery",
        record_key="12",
        details={},
        placed_at=datetime(2026, 1, 1, tzinfo=UTC),
        placed_by="worker",
        state="pending",
        cleared_at=None,
        cleared_by=None,
        note=None,
    )


@pytest.mark.parametrize("status", REDIRECTS)
async def test_the_webhook_never_reposts_its_signed_body_elsewhere(
    sites: tuple[Site, Site], status: int
) -> None:
    origin, elsewhere = sites
    publisher = WebhookPublisher(
        f"{origin.url}/redirect/{status}", secret=b"k", attempts=2, backoff_seconds=0.01
    )
    try:
        with pytest.raises(WebhookError, match=f"HTTP {status}"):
            await publisher.publish(item())
    finally:
        await publisher.close()
    assert elsewhere.hits == []  # neither the body nor its signature went anywhere else
    assert len(origin.hits) == 0 and SIGNATURE_HEADER


@pytest.mark.parametrize("status", REDIRECTS)
async def test_inturn_send_does_not_follow_with_its_token(
    sites: tuple[Site, Site], status: int
) -> None:
    from inturn.worker.cli.send import Outgoing

    origin, elsewhere = sites
    report = ReportFn()
    answers = await send_http(
        [Outgoing("m.hl7", MSG)], f"{origin.url}/redirect/{status}", "tok", None, 5.0, report
    )
    assert [a.accepted for a in answers] == [False]
    assert (answers[0].detail or "").startswith(f"HTTP {status}")
    assert elsewhere.hits == []


@pytest.mark.parametrize("status", REDIRECTS)
@pytest.mark.parametrize("method", ["GET", "POST", "PUT"])
async def test_a_session_refuses_a_redirect_even_when_a_call_forgets(
    sites: tuple[Site, Site], status: int, method: str
) -> None:
    import aiohttp

    origin, elsewhere = sites
    async with client_session(timeout=aiohttp.ClientTimeout(total=5)) as session:
        with pytest.raises(RedirectRefused, match=f"HTTP {status}"):
            async with session.request(method, f"{origin.url}/redirect/{status}", data=b"x"):
                pass
        # and once told, the 3xx is just the answer
        async with session.request(
            method, f"{origin.url}/redirect/{status}", allow_redirects=False
        ) as response:
            assert response.status == status
    assert elsewhere.hits == []


@pytest.mark.parametrize("limit", [0, 1, 65536, 1024 * 1024])
async def test_a_response_body_is_read_up_to_its_bound(
    sites: tuple[Site, Site], limit: int
) -> None:
    import aiohttp

    origin, _ = sites
    async with (
        client_session(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"{origin.url}/big", allow_redirects=False) as response,
    ):
        body, whole = await read_bounded(response, limit)
    assert (len(body), whole) == (limit, False)
    async with (
        client_session(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"{origin.url}/small", allow_redirects=False) as response,
    ):
        assert await read_bounded(response, limit + 1) == (b"", True)
