"""Fixtures of the console tests: a console served on a free port against the test database,
and a client per role."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from inturn.worker.console.server import ConsoleServer, start_console
from tests.support.console import AUTH, TOKENS, Client


@pytest.fixture
async def console(fresh_db: str) -> AsyncIterator[ConsoleServer]:
    """The console on a free port of 127.0.0.1, refreshing its overview every half second."""
    server = await start_console(
        fresh_db, host="127.0.0.1", port=0, auth=AUTH, stuck_after=3, refresh_seconds=0.5
    )
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def clients(console: ConsoleServer) -> AsyncIterator[dict[str | None, Client]]:
    """``{role: Client}`` for each role and ``None`` (no credential)."""
    async with aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{console.port}"
        yield {role: Client(session, base, role) for role in (None, *TOKENS)}
