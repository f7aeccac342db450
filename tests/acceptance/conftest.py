"""Fixtures of the acceptance tier (tests that start whole processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.support.local import LocalProcess


@pytest.fixture
async def local_runs() -> AsyncIterator[list[LocalProcess]]:
    """Every ``inturn local`` a test starts is interrupted at the end if it still runs."""
    runs: list[LocalProcess] = []
    yield runs
    for run in runs:
        if run.proc is not None and run.proc.returncode is None:
            run.proc.kill()
            await asyncio.wait_for(run.proc.wait(), 30)
