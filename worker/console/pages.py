"""The console's pages: server-rendered HTML (Jinja2) with htmx for the live overview.

Pages read through :mod:`.operations`, like the API; their forms post to the same operations
and are answered with a redirect back (Post/Redirect/Get), whose ``done`` query parameter is
only ever an action name. The overview's table is replaced in place by server-sent events
(``/events``), one event per changed snapshot of the :class:`~.feed.Feed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp_sse import sse_response
from markupsafe import Markup

from inturn.worker.console import operations as ops
from inturn.worker.console import trends
from inturn.worker.console.api import destination, int_param, item_id
from inturn.worker.console.context import console, csrf_token, identity
from inturn.worker.console.feed import Snapshot
from inturn.worker.console.operations import ConsoleError
from inturn.worker.console.overview import FeedOverviewRow, OverviewRow
from inturn.worker.store.model import STATES
from inturn.worker.text.display import printable
from inturn.worker.text.durations import format_age
from inturn.worker.worklist.describe import sentence

#: Actions a ``done`` parameter may name (anything else is ignored).
DONE = frozenset(ops.ITEM_ACTIONS) | frozenset(ops.DESTINATION_ACTIONS) | {"clear"}


def _instant(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def live(value: str | datetime, mode: str = "since") -> Markup:
    """A ``<time>`` that ``static/live.js`` keeps current: the age of ``value`` (``since``) or
    the time left until it (``until``), rendered right for the moment the page is made, with
    the instant itself (UTC) as its tooltip, so an age always says what it counts from."""
    at = _instant(value)
    seconds = (at - datetime.now(UTC)).total_seconds()
    if mode == "since":
        text = format_age(-seconds)
    else:
        text = "now" if seconds <= 0 else "in " + format_age(seconds)
    stamp = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time data-live="{}" datetime="{}" title="{}">{}</time>').format(
        mode, at.isoformat(), stamp, text
    )


def install_filters(env: jinja2.Environment) -> None:
    """Template filters: ``age`` (seconds to ``3h05m``), ``visible`` (control characters
    escaped), ``when`` (an ISO time to ``YYYY-MM-DD HH:MM:SS``), ``live`` (a live age or
    countdown, see :func:`live`), ``ago`` and ``after`` (the instant ``seconds`` before or after
    a datetime), ``sentence`` (a worklist item's details as a sentence)."""
    env.filters["age"] = format_age
    env.filters["visible"] = lambda text: printable(str(text)) if text is not None else ""
    env.filters["when"] = lambda iso: (iso or "")[:19].replace("T", " ")
    env.filters["live"] = live
    env.filters["ago"] = lambda seconds, base: base - timedelta(seconds=seconds)
    env.filters["after"] = lambda seconds, base: base + timedelta(seconds=seconds)
    env.filters["sentence"] = sentence


def _base(request: web.Request, **extra: Any) -> dict[str, Any]:
    who = identity(request)
    done = request.query.get("done")
    return {
        "who": who,
        "csrf_token": csrf_token(request),
        "done": done if done in DONE else None,
        "server_time": datetime.now(UTC).isoformat(),
        **extra,
    }


def overview_table(request: web.Request, snapshot: Snapshot) -> str:
    """The overview table's HTML for ``snapshot``, rendered once per snapshot, with each
    destination's and feed's last hour drawn from the feed's history (:mod:`.trends`)."""
    template = aiohttp_jinja2.get_env(request.app).get_template("_overview_table.html")
    history = console(request).feed.history
    now = snapshot.taken_at.timestamp()

    def destination_trend(row: OverviewRow) -> Markup:
        return history.hour_picture(
            row.destination, now, label=f"{row.destination}, last hour", threshold=row.stuck_after
        )

    def feed_trend(row: FeedOverviewRow) -> Markup:
        name = trends.feed_name(row.channel, row.sender)
        return history.hour_picture(
            trends.feed_key(name),
            now,
            label=f"feed {name}, last hour",
            threshold=row.silent_after,
            area_name="",
            line_name="quiet for",
        )

    context = {
        "rows": snapshot.rows,
        "feeds": snapshot.feeds,
        "taken_at": snapshot.taken_at,
        "destination_trend": destination_trend,
        "feed_trend": feed_trend,
    }
    return snapshot.rendered("table", lambda _: template.render(context))


@aiohttp_jinja2.template("overview.html")
async def overview_page(request: web.Request) -> dict[str, Any]:
    """``GET /``: every destination, worst first, refreshed by server-sent events."""
    ops.require(identity(request), "viewer")
    table = overview_table(request, console(request).feed.snapshot)
    kept = await ops.history_line(console(request), identity(request))
    return _base(request, table=Markup(table), history=kept)


async def events(request: web.Request) -> web.StreamResponse:
    """``GET /events``: an ``overview`` event carrying the table's HTML at each new snapshot."""
    ops.require(identity(request), "viewer")
    feed = console(request).feed
    q = feed.subscribe()
    try:
        async with sse_response(request, headers={"Cache-Control": "no-store"}) as stream:
            snapshot: Snapshot | None = feed.snapshot
            while stream.is_connected():
                if snapshot is not None:
                    await stream.send(overview_table(request, snapshot), event="overview")
                # Wake now and then to notice a client that went away.
                snapshot = None
                with contextlib.suppress(TimeoutError):
                    snapshot = await asyncio.wait_for(q.get(), timeout=15)
        return stream
    finally:
        feed.unsubscribe(q)


@aiohttp_jinja2.template("destination.html")
async def destination_page(request: web.Request) -> dict[str, Any]:
    """``GET /destinations/{namespace}/{name}``: its items newest first, paged, filtered."""
    name = destination(request)
    state = request.query.get("state") or None
    limit = int_param(request, "limit", 100, blank=True) or 100
    page = await ops.list_items(
        console(request),
        identity(request),
        name,
        state=state,
        limit=limit,
        before=int_param(request, "cursor", None, blank=True),
    )
    feed = console(request).feed
    row = next((r for r in feed.snapshot.rows if r.destination == name), None)
    if row is None and not page["items"]:
        # neither registered nor holding a message: a mistyped name gets no page of buttons
        raise ConsoleError(404, "not_found", f"no destination {name}: not registered, no message")
    marks = await ops.attempt_marks(console(request), identity(request), name)
    now = time.time()
    day = trends.day_chart(
        feed.history.day(name, now),
        [trends.Mark(at.timestamp(), outcome) for at, outcome in marks],
        now=now,
        label=f"{name}, last day",
        threshold=row.stuck_after if row else None,
    )
    head = await ops.head_item(console(request), identity(request), name)
    lanes = await ops.lane_view(console(request), identity(request), name)
    return _base(
        request,
        destination=name,
        row=row,
        lanes=lanes,
        day=day,
        marks=len(marks),
        head=head,
        page=page,
        state=state,
        states=STATES,
        limit=ops.capped(limit),
    )


async def destination_post(request: web.Request) -> web.StreamResponse:
    """``POST /destinations/{namespace}/{name}/{action}`` from a form; redirects back."""
    form = await request.post()
    action = request.match_info["action"]
    name = destination(request)
    feed = console(request).feed
    version = feed.snapshot.version
    await ops.destination_action(
        console(request),
        identity(request),
        name,
        action,
        _text(form.get("why")),
        _text(form.get("confirm")),
        _text(form.get("message_type")),
    )
    await feed.newer_than(version)  # the page shows the hold (or its absence) at once
    raise web.HTTPSeeOther(f"/destinations/{name}?done={action}")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def _item_context(request: web.Request, **extra: Any) -> dict[str, Any]:
    detail = await ops.item_detail(console(request), identity(request), item_id(request))
    return _base(request, **detail, now=datetime.now(UTC), **extra)


@aiohttp_jinja2.template("item.html")
async def item_page(request: web.Request) -> dict[str, Any]:
    """``GET /items/{item_id}``: metadata, attempts, reason, last error, actions."""
    return await _item_context(request, segments=None, as_sent=None)


@aiohttp_jinja2.template("item.html")
async def payload_page(request: web.Request) -> dict[str, Any]:
    """``POST /items/{item_id}/payload``: the item page with its payload, for privacy users."""
    form = await request.post()
    shown = await ops.view_payload(
        console(request), identity(request), item_id(request), _text(form.get("why"))
    )
    return await _item_context(request, segments=shown["segments"], as_sent=shown["asSent"])


async def item_post(request: web.Request) -> web.StreamResponse:
    """``POST /items/{item_id}/{action}`` from a form; redirects to the item (or, when it is
    gone, its destination)."""
    form = await request.post()
    action = request.match_info["action"]
    number = item_id(request)
    detail = await ops.item_detail(console(request), identity(request), number)
    result = await ops.item_action(
        console(request),
        identity(request),
        number,
        action,
        _text(form.get("why")),
        include_delivered=form.get("include_delivered") == "1",
    )
    if action in ("remove", "erase"):
        raise web.HTTPSeeOther(f"/destinations/{detail['item']['destination']}?done={action}")
    target = result["changed"][-1] if action == "resend" else number
    raise web.HTTPSeeOther(f"/items/{target}?done={action}")


@aiohttp_jinja2.template("audit.html")
async def audit_page(request: web.Request) -> dict[str, Any]:
    """``GET /audit``: the audit trail, newest first, filtered by destination or item."""
    dest = request.query.get("destination") or None
    item = int_param(request, "itemId", None, blank=True)
    result = await ops.audit(
        console(request),
        identity(request),
        limit=int_param(request, "limit", 100, blank=True) or 100,
        destination=dest,
        item_id=item,
        before=int_param(request, "cursor", None, blank=True),
    )
    return _base(request, **result, destination=dest, item_id=item)


@aiohttp_jinja2.template("search.html")
async def search_page(request: web.Request) -> dict[str, Any]:
    """``GET /search?controlId=...``: the items of that control ID, every destination (the
    search box of every page); without ``controlId``, the search forms alone."""
    control_id = (request.query.get("controlId") or "").strip()
    result = None
    if control_id:
        result = await ops.search_control_id(console(request), identity(request), control_id)
    else:
        ops.require(identity(request), "viewer")
    return _base(
        request,
        control_id=control_id,
        result=result,
        by_patient=False,
        heading=f"Control ID {printable(control_id)}",
    )


@aiohttp_jinja2.template("search.html")
async def search_patient_post(request: web.Request) -> dict[str, Any]:
    """``POST /search`` from a form: a patient's items, for the privacy role; audited. The
    identifier travels in the body only, never in a URL, and is not shown back."""
    form = await request.post()
    result = await ops.search_patient(
        console(request),
        identity(request),
        _text(form.get("patientId")),
        _text(form.get("authority")) or None,
        _text(form.get("why")),
    )
    return _base(
        request, control_id="", result=result, by_patient=True, heading="A patient's messages"
    )


@aiohttp_jinja2.template("worklists.html")
async def worklists_page(request: web.Request) -> dict[str, Any]:
    """``GET /worklists``: counts by queue and reason, and the items, filtered."""
    queue = request.query.get("queue") or None
    reason = request.query.get("reason") or None
    state = request.query.get("state") or "pending"
    counts = await ops.worklist_counts(console(request), identity(request), state=state)
    page = await ops.worklist_items(
        console(request),
        identity(request),
        queue=queue,
        reason=reason,
        state=state,
        limit=int_param(request, "limit", 100, blank=True) or 100,
        cursor=int_param(request, "cursor", None, blank=True),
    )
    return _base(request, **counts, page=page, queue=queue, reason=reason)


async def worklist_clear_post(request: web.Request) -> web.StreamResponse:
    """``POST /worklists/items/{item_id}/clear`` from a form; redirects back to the list."""
    form = await request.post()
    item = await ops.worklist_clear(
        console(request), identity(request), item_id(request), _text(form.get("note"))
    )
    back = urlencode({"queue": item["queue"], "reason": item["reason"], "done": "clear"})
    raise web.HTTPSeeOther(f"/worklists?{back}")


def add_routes(router: web.UrlDispatcher) -> None:
    """Register the pages' routes."""
    dest = "/destinations/{namespace}/{name}"
    item = "/items/{item_id:[0-9]{1,19}}"
    router.add_get("/", overview_page)
    router.add_get("/events", events)
    router.add_get(dest, destination_page)
    router.add_post(dest + "/{action:" + "|".join(ops.DESTINATION_ACTIONS) + "}", destination_post)
    router.add_get(item, item_page)
    router.add_post(item + "/payload", payload_page)
    router.add_post(item + "/{action:" + "|".join(ops.ITEM_ACTIONS) + "}", item_post)
    router.add_get("/audit", audit_page)
    router.add_get("/search", search_page)
    router.add_post("/search", search_patient_post)
    router.add_get("/worklists", worklists_page)
    router.add_post("/worklists/items/{item_id:[0-9]{1,19}}/clear", worklist_clear_post)
