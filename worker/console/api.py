"""The JSON API, version 1 (``/api/v1/...``), described by ``openapi.yaml`` beside this file.

Handlers parse and check their input, call :mod:`.operations`, and answer JSON. Bodies of
state changes are JSON objects (``{"why": ..., "confirm": ...}``) and need the CSRF token in
``X-CSRF-Token`` (``GET /api/v1/me`` gives it).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import yaml
from aiohttp import web

from inturn.worker.console import operations as ops
from inturn.worker.console.context import console, csrf_token, identity
from inturn.worker.console.operations import ConsoleError

#: Largest id accepted in a path or cursor (Postgres bigint).
ID_MAX = 2**63 - 1


def int_param(
    request: web.Request, name: str, default: int | None, *, minimum: int = 1
) -> int | None:
    """An integer query parameter, or ``default`` when absent.

    Raises:
        ConsoleError: 400 ``invalid_request`` when it is not a whole number in range.
    """
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or not minimum <= int(raw) <= ID_MAX:
        raise ConsoleError(400, "invalid_request", f"{name} must be a whole number >= {minimum}")
    return int(raw)


def item_id(request: web.Request) -> int:
    """The ``{item_id}`` path segment as an int (404 when out of range)."""
    value = int(request.match_info["item_id"])
    if not 1 <= value <= ID_MAX:
        raise ConsoleError(404, "not_found", "no such item")
    return value


def destination(request: web.Request) -> str:
    """``namespace/name`` from the path."""
    return f"{request.match_info['namespace']}/{request.match_info['name']}"


async def body(request: web.Request) -> dict[str, str | None]:
    """The JSON object of a state change (may be empty): string values only.

    Raises:
        ConsoleError: 400 ``invalid_request`` for anything but a JSON object of strings/nulls.
    """
    if not request.can_read_body:
        return {}
    try:
        doc = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ConsoleError(400, "invalid_request", "the body must be a JSON object") from None
    if not isinstance(doc, dict) or not all(v is None or isinstance(v, str) for v in doc.values()):
        raise ConsoleError(400, "invalid_request", "the body must be a JSON object of strings")
    return doc


async def me(request: web.Request) -> web.Response:
    """``GET /api/v1/me``: who you are, your roles, your CSRF token."""
    who = identity(request)
    return web.json_response(
        {"name": who.name, "roles": sorted(who.roles), "csrfToken": csrf_token(request)}
    )


async def overview(request: web.Request) -> web.Response:
    """``GET /api/v1/overview``: one row per destination, worst first."""
    ops.require(identity(request), "viewer")
    return web.json_response(console(request).feed.snapshot.to_json())


async def destination_items(request: web.Request) -> web.Response:
    """``GET /api/v1/destinations/{namespace}/{name}/items``: a page of items, no payloads."""
    page = await ops.list_items(
        console(request),
        identity(request),
        destination(request),
        state=request.query.get("state"),
        limit=int_param(request, "limit", 100) or 100,
        before=int_param(request, "cursor", None),
    )
    return web.json_response(page)


async def destination_action(request: web.Request) -> web.Response:
    """``POST /api/v1/destinations/{namespace}/{name}/{action}``: retry, drain, suspend, resume."""
    doc = await body(request)
    result = await ops.destination_action(
        console(request),
        identity(request),
        destination(request),
        request.match_info["action"],
        doc.get("why"),
        doc.get("confirm"),
    )
    return web.json_response(result)


async def item(request: web.Request) -> web.Response:
    """``GET /api/v1/items/{item_id}``: metadata, attempts and audit of one item."""
    return web.json_response(
        await ops.item_detail(console(request), identity(request), item_id(request))
    )


async def item_action(request: web.Request) -> web.Response:
    """``POST /api/v1/items/{item_id}/{action}``: retry, skip, remove, resend, erase."""
    doc = await body(request)
    result = await ops.item_action(
        console(request),
        identity(request),
        item_id(request),
        request.match_info["action"],
        doc.get("why"),
    )
    return web.json_response(result)


async def payload(request: web.Request) -> web.Response:
    """``POST /api/v1/items/{item_id}/payload``: the segments, for the privacy role; audited.

    A POST, so that the request is a deliberate act, carries a reason, and is never cached or
    prefetched; the answer is marked ``no-store``.
    """
    doc = await body(request)
    result = await ops.view_payload(
        console(request), identity(request), item_id(request), doc.get("why")
    )
    return web.json_response(result)


async def audit(request: web.Request) -> web.Response:
    """``GET /api/v1/audit``: who did what, when, to which items, and why."""
    result = await ops.audit(
        console(request),
        identity(request),
        limit=int_param(request, "limit", 100) or 100,
        destination=request.query.get("destination") or None,
        item_id=int_param(request, "itemId", None),
        before=int_param(request, "cursor", None),
    )
    return web.json_response(result)


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of this API (``openapi.yaml``), parsed once."""
    text = resources.files("inturn.worker.console").joinpath("openapi.yaml").read_text("utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


async def openapi(request: web.Request) -> web.Response:
    """``GET /api/v1/openapi.json``: the OpenAPI document."""
    return web.json_response(openapi_document())


def add_routes(router: web.UrlDispatcher) -> None:
    """Register the API's routes."""
    prefix = "/api/v1"
    dest = prefix + "/destinations/{namespace}/{name}"
    router.add_get(prefix + "/openapi.json", openapi)
    router.add_get(prefix + "/me", me)
    router.add_get(prefix + "/overview", overview)
    router.add_get(dest + "/items", destination_items)
    router.add_post(dest + "/{action}", destination_action)
    router.add_get(prefix + "/items/{item_id:[0-9]{1,19}}", item)
    router.add_post(prefix + "/items/{item_id:[0-9]{1,19}}/payload", payload)
    router.add_post(prefix + "/items/{item_id:[0-9]{1,19}}/{action}", item_action)
    router.add_get(prefix + "/audit", audit)
