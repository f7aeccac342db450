"""The console in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

Every page is photographed into ``build/screenshots/`` (or ``$INTURN_SCREENSHOTS``) so that a
person can look at what the console shows. No browser is downloaded: Playwright drives the
system's ``/usr/bin/chromium``; the tests are skipped, saying so, where it is missing (``.ci/run``
installs it).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from inturn.worker.console.server import ConsoleServer
from inturn.worker.testing import MllpReceiver
from tests.support.console import TOKENS, enqueue, message, place_work, register, worker
from tests.support.pipeline import until

CHROMIUM = os.environ.get("INTURN_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(
    os.environ.get("INTURN_SCREENSHOTS")
    or Path(__file__).resolve().parents[2] / "build" / "screenshots"
)
DEST = "ward/lab"

#: slow (left out by make test-fast): a long run of whole parts
pytestmark = [
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None,
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)",
    ),
    pytest.mark.acceptance,  # a browser
    pytest.mark.slow,
]

playwright_api = pytest.importorskip("playwright.async_api")


class PoisonReceiver(MllpReceiver):
    """A receiver that rejects (AE) one message, by MSH-10, and accepts everything else."""

    poison = "MSG00001"

    def answer(self, payload: bytes) -> bytes:
        if payload.split(b"|")[9].decode() == self.poison:
            saved, self.ack_code = self.ack_code, "AE"
            try:
                return super().answer(payload)
            finally:
                self.ack_code = saved
        return super().answer(payload)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A headless Chromium (the system's), closed after the test."""
    async with playwright_api.async_playwright() as p:
        chromium = await p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def page_as(browser: Any, role: str) -> Any:
    """A new page whose every request carries ``role``'s bearer token."""
    context = await browser.new_context(
        extra_http_headers={"Authorization": f"Bearer {TOKENS[role][1]}"},
        viewport={"width": 1280, "height": 800},
    )
    return await context.new_page()


async def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def row_state(page: Any) -> str | None:
    row = page.locator(f'tr[data-destination="{DEST}"]')
    if await row.count() == 0:
        return None
    return str(await row.get_attribute("data-state"))


async def test_overview_shows_a_destination_stuck_in_an_outage_and_recovering(
    fresh_db: str, console: ConsoleServer, browser: Any
) -> None:
    await register(fresh_db, DEST, sender="mllp://127.0.0.1")
    await register(fresh_db, "ward/pharmacy", sender="http://pharmacy.example/hl7")
    rx = MllpReceiver()
    await rx.start()
    await rx.stop()  # the receiver is down; its port is kept
    page = await page_as(browser, "viewer")
    refused: list[str] = []  # what the Content-Security-Policy blocked, if anything
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    await page.goto(f"http://127.0.0.1:{console.port}/")
    async with worker(fresh_db, DEST, rx.port):
        await enqueue(fresh_db, DEST, [1, 2, 3])

        async def stuck() -> bool:  # the page is never reloaded: events replace the table
            return await row_state(page) == "stuck"

        await until(stuck, timeout=30)
        row = page.locator(f'tr[data-destination="{DEST}"]')
        assert "stuck" in str(await row.get_attribute("class"))
        assert await row.locator("td.pending").inner_text() == "3"
        first = page.locator("table.overview tbody tr").first
        assert await first.get_attribute("data-destination") == DEST  # worst first
        await shot(page, "overview-stuck")
        await rx.start()  # the receiver comes back

        async def recovered() -> bool:
            return await row_state(page) == "idle"

        await until(recovered, timeout=30)
        await shot(page, "overview-recovered")
    assert refused == []
    assert len(rx.received) >= 3
    await rx.stop()


async def test_operator_skips_the_head_and_the_next_is_delivered(
    fresh_db: str, console: ConsoleServer, browser: Any
) -> None:
    await register(fresh_db, DEST)
    base = f"http://127.0.0.1:{console.port}"
    async with PoisonReceiver() as rx, worker(fresh_db, DEST, rx.port):
        head, second = await enqueue(fresh_db, DEST, [1, 2])
        await rx.wait_for(2)  # the head was tried (and refused) at least twice
        page = await page_as(browser, "operator")
        await page.goto(f"{base}/destinations/{DEST}")
        await shot(page, "destination")
        await page.click(f'a[href="/items/{head}"]')
        assert await page.locator("#last-error").inner_text() != ""
        await shot(page, "item-failing")
        await page.fill("#skip-why", "receiver refuses it; agreed with the lab")
        await page.click("#skip")
        assert await page.locator("#item-state").inner_text() == "skipped"

        async def delivered() -> bool:
            return any(m == message(2) for m in rx.received)

        await until(delivered)
        await page.goto(f"{base}/items/{second}")

        async def second_delivered() -> bool:
            await page.reload()
            return await page.locator("#item-state").inner_text() == "delivered"

        await until(second_delivered)
        await shot(page, "item-delivered")
        await page.goto(f"{base}/audit")
        entry = page.locator('tr[data-action="skip"]')
        assert "otto" in await entry.inner_text()
    assert [m for m in rx.received if m == message(2)] == [message(2)]


async def test_a_viewer_cannot_act(fresh_db: str, console: ConsoleServer, browser: Any) -> None:
    await register(fresh_db, DEST)
    [item] = await enqueue(fresh_db, DEST, [1])
    base = f"http://127.0.0.1:{console.port}"
    page = await page_as(browser, "viewer")
    await page.goto(f"{base}/items/{item}")
    # Every page has the search box (a form that changes nothing); no other form is offered.
    assert await page.locator("form:not([role=search]) button").count() == 0
    assert await page.locator("#find button").count() == 1
    assert await page.locator("#find-patient-form").count() == 0  # the privacy role's alone
    assert await page.locator("#item-actions").count() == 0
    await shot(page, "item-viewer")
    await page.goto(f"{base}/destinations/{DEST}")
    assert await page.locator("#destination-actions").count() == 0
    # Forging the form post from the page itself (with the viewer's own CSRF token) is refused.
    token = await page.get_attribute("body", "hx-headers")
    csrf = str(token).split('"')[3]
    response = await page.request.post(
        f"{base}/items/{item}/skip", form={"csrf_token": csrf, "why": "I am only a viewer"}
    )
    assert response.status == 403
    await page.goto(f"{base}/items/{item}")
    assert await page.locator("#item-state").inner_text() == "pending"


async def test_a_payload_viewing_appears_in_the_audit(
    fresh_db: str, console: ConsoleServer, browser: Any
) -> None:
    await register(fresh_db, DEST)
    [item] = await enqueue(fresh_db, DEST, [5])
    base = f"http://127.0.0.1:{console.port}"
    page = await page_as(browser, "privacy")
    await page.goto(f"{base}/items/{item}")
    assert await page.locator("#segments").count() == 0
    await page.fill("#payload-why", "patient asked for a copy, ticket 4711")
    await page.click("#show-payload")
    segments = page.locator("#segments li")
    assert await segments.count() == 2
    assert await segments.nth(1).inner_text() == "PID|1||P5^^^HOSP^MR||DOE^JOHN"
    assert "/payload" in page.url and "DOE" not in page.url
    await shot(page, "item-payload")
    await page.goto(f"{base}/audit")
    entry = page.locator('tr[data-action="view-payload"]')
    assert await entry.count() == 1
    text = await entry.inner_text()
    assert "pia" in text and str(item) in text and "ticket 4711" in text
    assert "DOE" not in await page.content()
    await shot(page, "audit")


async def test_worklists_page_counts_and_a_clear_with_a_note(
    fresh_db: str, console: ConsoleServer, browser: Any
) -> None:
    await register(fresh_db, DEST)
    [item] = await enqueue(fresh_db, DEST, [1])
    await place_work(
        fresh_db,
        [
            ("delivery-failed", "delivery", str(item), "failed"),
            ("destinations", "destination", DEST, "destination-stuck"),
            ("destinations", "destination", "ward/pharmacy", "orphaned-queue"),
        ],
    )
    page = await page_as(browser, "operator")
    await page.goto(f"http://127.0.0.1:{console.port}/worklists")
    assert await page.locator("#counts tbody tr").count() == 3
    await shot(page, "worklists")
    await page.click('#counts tr[data-reason="destination-stuck"] a >> nth=1')
    rows = page.locator("#worklist tbody tr")
    assert await rows.count() == 1
    await rows.first.locator('input[name="note"]').fill("receiver back; backlog gone")
    await rows.first.locator("button").click()
    assert await page.locator("#done").inner_text() == "clear: done."
    assert await page.locator("#worklist tbody tr[data-state]").count() == 0
    await page.goto(f"http://127.0.0.1:{console.port}/worklists?state=cleared")
    text = await page.locator("#worklist").inner_text()
    assert "otto" in text and "receiver back; backlog gone" in text
    await shot(page, "worklists-cleared")


def fill_hour(history: Any, now: float) -> None:
    """An hour of snapshots as the console would have taken them, one per 30 s, before the
    test's own: ward/pharmacy draining a backlog, ward/radiology flapping, ward/lab stuck since
    25 minutes ago (its real snapshots follow)."""
    for k in range(118):
        at = now - 3600 + 30 * k
        left = max(0, 300 - 3 * max(0, k - 5))
        history.add("ward/pharmacy", at, left, 40.0 * left / 300 * 60 if left else 0.0)
        up = (k // 6) % 2 == 0
        history.add("ward/radiology", at, 4 if up else 0, 45.0 if up else 0.0)
        stuck_for = at - (now - 1500)
        history.add("ward/lab", at, 0 if stuck_for < 0 else 1 + stuck_for // 60, max(stuck_for, 0))


def fill_day(history: Any, now: float) -> None:
    """A day of ward/lab: quiet in the morning, a backlog at noon that drained."""
    for k in range(276):
        at = now - 86400 + 300 * k
        hump = max(0.0, 1 - abs(k - 150) / 30)
        history.add("ward/lab", at, round(80 * hump), 600 * hump)


async def test_trends_show_draining_stuck_and_flapping_at_a_glance(
    fresh_db: str, console: ConsoleServer, browser: Any
) -> None:
    # the past first: the console's own snapshots of these destinations (from their
    # registration on) come after it, as they would have
    history = console.console.feed.history
    now = time.time()
    fill_day(history, now)
    fill_hour(history, now)
    for name in (DEST, "ward/pharmacy", "ward/radiology"):
        await register(fresh_db, name, sender="mllp://127.0.0.1", stuck_after_seconds=900)
    rx = MllpReceiver()
    await rx.start()
    await rx.stop()  # down: every attempt fails and is recorded
    page = await page_as(browser, "viewer")
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    async with worker(fresh_db, DEST, rx.port):
        await enqueue(fresh_db, DEST, [1, 2])

        async def attempted() -> bool:
            async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
                cur = await conn.execute("SELECT count(*) FROM inturn_attempt")
                row = await cur.fetchone()
                return bool(row and row[0] >= 3)

        await until(attempted, timeout=30)
        await page.goto(f"http://127.0.0.1:{console.port}/")
        for name, said in (
            (DEST, "pending max "),
            ("ward/pharmacy", "pending max 300"),
            ("ward/radiology", "pending max 4"),
        ):
            svg = page.locator(f'tr[data-destination="{name}"] td.trend svg')
            assert await svg.get_attribute("aria-label") == f"{name}, last hour"
            assert said in (await svg.locator("title").text_content() or "")
            assert await svg.locator("polygon.pending").count() >= 1
        # radiology flaps: its age line comes back to 0 again and again
        line = page.locator('tr[data-destination="ward/radiology"] svg polyline.age')
        heights = [p.split(",")[1] for p in str(await line.first.get_attribute("points")).split()]
        assert len(set(heights)) == 2 and heights.count(max(heights, key=float)) > 10
        assert await page.locator("td.trend svg script").count() == 0
        await shot(page, "overview-trends")
        # the container, which stays while each event replaces the table inside it
        await page.locator("#overview").screenshot(path=str(SHOTS / "overview-trends-table.png"))

        await page.goto(f"http://127.0.0.1:{console.port}/destinations/{DEST}")
        day = page.locator("#day-trend svg")
        assert await day.get_attribute("aria-label") == f"{DEST}, last day"
        assert await day.locator("line.mark-retry").count() >= 3
        assert await day.locator("text").count() >= 8  # hour labels and scales
        assert "pending max 80" in (await day.locator("title").text_content() or "")
        await shot(page, "destination-day-trend")
        await day.screenshot(path=str(SHOTS / "destination-day-trend-chart.png"))
    assert refused == []
