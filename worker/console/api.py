"""The JSON API, version 1 (``/api/v1/...``), described by ``openapi.yaml`` beside this file.

Handlers parse and check their input, call :mod:`.operations`, and answer JSON. Bodies of
state changes are JSON objects (``{"why": ..., "confirm": ...}``) and need the CSRF token in
``X-CSRF-Token`` (``GET /api/v1/me`` gives it).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import yaml
from aiohttp import web

from inturn.worker.console import operations as ops
from inturn.worker.console.context import console, csrf_token, identity
from inturn.worker.console.operations import ConsoleError
from inturn.worker.spec.documents import DocumentError, load_json

#: Largest id accepted in a path or cursor (Postgres bigint).
ID_MAX = 2**63 - 1
#: A namespace or a Destination's name (RFC 1123 label).
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def int_param(
    request: web.Request, name: str, default: int | None, *, minimum: int = 1, blank: bool = False
) -> int | None:
    """An integer query parameter, or ``default`` when absent (or empty, if ``blank``: the
    pages' filter forms send empty fields).

    Raises:
        ConsoleError: 400 ``invalid_request`` when it is not a whole number in range.
    """
    raw = request.query.get(name)
    if raw is None or (blank and raw == ""):
        return default
    if not raw.isascii() or not raw.isdigit() or not minimum <= int(raw) <= ID_MAX:
        raise ConsoleError(400, "invalid_request", f"{name} must be a whole number >= {minimum}")
    return int(raw)


def only_query(request: web.Request, *allowed: str) -> None:
    """Refuse query parameters the document does not declare for this operation.

    Raises:
        ConsoleError: 400 ``invalid_request`` naming none of them (they may be anything).
    """
    if any(key not in allowed for key in request.query):
        raise ConsoleError(400, "invalid_request", "unknown query parameter")


def item_id(request: web.Request) -> int:
    """The ``{item_id}`` path segment as an int (404 when out of range)."""
    value = int(request.match_info["item_id"])
    if not 1 <= value <= ID_MAX:
        raise ConsoleError(404, "not_found", "no such item")
    return value


def destination(request: web.Request) -> str:
    """``namespace/name`` from the path.

    Raises:
        ConsoleError: 404 ``not_found`` when either part is not a Kubernetes name (RFC 1123
            label: lower-case letters, digits and ``-``, at most 63 characters).
    """
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    if not (K8S_NAME.match(namespace) and K8S_NAME.match(name)):
        raise ConsoleError(404, "not_found", "no such destination")
    return f"{namespace}/{name}"


#: Largest request body read, bytes (the application refuses larger ones before this; a body is
#: a few short strings).
MAX_BODY_BYTES = 64 * 1024


async def body(request: web.Request, schema: str = "ActionBody") -> dict[str, Any]:
    """The JSON body of a state change (may be absent), checked against the document's
    ``schema`` (``ActionBody``: ``why`` and ``confirm`` strings, ``includeDelivered`` a
    boolean; ``ClearBody``: ``note``), nothing else (``who`` in particular is never taken from
    a body: it is the authenticated identity).

    Raises:
        ConsoleError: 400 ``invalid_request`` naming what is wrong.
    """
    if not request.can_read_body:
        return {}
    try:  # bounded: depth, size, each member once (a second "why" is refused, not the last)
        doc = load_json(await request.read() or b"{}", max_bytes=MAX_BODY_BYTES)
    except DocumentError as exc:
        raise ConsoleError(400, "invalid_request", f"the body: {exc}"[:200]) from None
    if not isinstance(doc, dict):
        raise ConsoleError(400, "invalid_request", "the body must be a JSON object")
    error = jsonschema.exceptions.best_match(body_validator(schema).iter_errors(doc))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "body"
        raise ConsoleError(400, "invalid_request", f"{where}: {error.message}"[:200])
    if any(isinstance(value, str) and "\x00" in value for value in doc.values()):
        raise ConsoleError(400, "invalid_request", "a value holds a NUL character")
    return dict(doc)


async def me(request: web.Request) -> web.Response:
    """``GET /api/v1/me``: who you are, your roles, your CSRF token."""
    only_query(request)
    who = identity(request)
    return web.json_response(
        {"name": who.name, "roles": sorted(who.roles), "csrfToken": csrf_token(request)}
    )


async def overview(request: web.Request) -> web.Response:
    """``GET /api/v1/overview``: one row per destination, worst first."""
    only_query(request)
    ops.require(identity(request), "viewer")
    snapshot = console(request).feed.snapshot
    body = snapshot.rendered("json", lambda s: json.dumps(s.to_json()).encode())
    return web.Response(body=body, content_type="application/json")


async def destination_items(request: web.Request) -> web.Response:
    """``GET /api/v1/destinations/{namespace}/{name}/items``: a page of items, no payloads."""
    only_query(request, "state", "limit", "cursor")
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
    """``POST /api/v1/destinations/{namespace}/{name}/{action}``: retry, drain, suspend, resume,
    resend-failed."""
    only_query(request)
    doc = await body(request)
    result = await ops.destination_action(
        console(request),
        identity(request),
        destination(request),
        request.match_info["action"],
        doc.get("why"),
        doc.get("confirm"),
        doc.get("messageType"),
    )
    return web.json_response(result)


async def item(request: web.Request) -> web.Response:
    """``GET /api/v1/items/{item_id}``: metadata, attempts and audit of one item."""
    only_query(request)
    return web.json_response(
        await ops.item_detail(console(request), identity(request), item_id(request))
    )


async def item_action(request: web.Request) -> web.Response:
    """``POST /api/v1/items/{item_id}/{action}``: retry, skip, remove, resend, erase."""
    only_query(request)
    doc = await body(request)
    result = await ops.item_action(
        console(request),
        identity(request),
        item_id(request),
        request.match_info["action"],
        doc.get("why"),
        include_delivered=doc.get("includeDelivered") is True,
    )
    return web.json_response(result)


async def payload(request: web.Request) -> web.Response:
    """``POST /api/v1/items/{item_id}/payload``: the segments, for the privacy role; audited.

    A POST, so that the request is a deliberate act, carries a reason, and is never cached or
    prefetched; the answer is marked ``no-store``.
    """
    only_query(request)
    doc = await body(request)
    result = await ops.view_payload(
        console(request), identity(request), item_id(request), doc.get("why")
    )
    return web.json_response(result)


async def audit(request: web.Request) -> web.Response:
    """``GET /api/v1/audit``: who did what, when, to which items, and why."""
    only_query(request, "limit", "destination", "itemId", "cursor")
    result = await ops.audit(
        console(request),
        identity(request),
        limit=int_param(request, "limit", 100) or 100,
        destination=request.query.get("destination") or None,
        item_id=int_param(request, "itemId", None),
        before=int_param(request, "cursor", None),
    )
    return web.json_response(result)


async def search(request: web.Request) -> web.Response:
    """``GET /api/v1/search?controlId=...``: the items of that MSH-10, every destination."""
    only_query(request, "controlId", "limit")
    result = await ops.search_control_id(
        console(request),
        identity(request),
        request.query.get("controlId", ""),
        limit=int_param(request, "limit", ops.SEARCH_LIMIT) or ops.SEARCH_LIMIT,
    )
    return web.json_response(result)


async def search_patient(request: web.Request) -> web.Response:
    """``POST /api/v1/search/patient``: the items naming a patient, for the privacy role;
    audited. A POST, so that the identifier is never in a URL (nor a proxy's access log) and
    the search carries a reason."""
    only_query(request)
    doc = await body(request, "PatientSearchBody")
    result = await ops.search_patient(
        console(request),
        identity(request),
        doc.get("patientId"),
        doc.get("authority"),
        doc.get("why"),
    )
    return web.json_response(result)


async def worklist_counts(request: web.Request) -> web.Response:
    """``GET /api/v1/worklists/counts``: items per queue and reason."""
    only_query(request, "state")
    result = await ops.worklist_counts(
        console(request), identity(request), state=request.query.get("state", "pending")
    )
    return web.json_response(result)


async def worklist_items(request: web.Request) -> web.Response:
    """``GET /api/v1/worklists/items``: a page of worklist items, oldest placement first."""
    only_query(request, "queue", "reason", "state", "limit", "cursor")
    result = await ops.worklist_items(
        console(request),
        identity(request),
        queue=request.query.get("queue"),
        reason=request.query.get("reason"),
        state=request.query.get("state", "pending"),
        limit=int_param(request, "limit", 100) or 100,
        cursor=int_param(request, "cursor", None),
    )
    return web.json_response(result)


async def worklist_clear(request: web.Request) -> web.Response:
    """``POST /api/v1/worklists/items/{item_id}/clear``: clear one item with a note."""
    only_query(request)
    doc = await body(request, "ClearBody")
    result = await ops.worklist_clear(
        console(request), identity(request), item_id(request), doc.get("note")
    )
    return web.json_response(result)


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of this API (``openapi.yaml``), parsed once."""
    text = resources.files("inturn.worker.console").joinpath("openapi.yaml").read_text("utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


@cache
def body_validator(name: str) -> jsonschema.protocols.Validator:
    """A validator for the document's request body schema ``name``."""
    schema = openapi_document()["components"]["schemas"][name]
    validator: jsonschema.protocols.Validator = jsonschema.Draft7Validator(schema)
    return validator


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
    router.add_post(
        dest + "/{action:" + "|".join(ops.DESTINATION_ACTIONS) + "}", destination_action
    )
    router.add_get(prefix + "/items/{item_id:[0-9]{1,19}}", item)
    router.add_post(prefix + "/items/{item_id:[0-9]{1,19}}/payload", payload)
    router.add_post(
        prefix + "/items/{item_id:[0-9]{1,19}}/{action:" + "|".join(ops.ITEM_ACTIONS) + "}",
        item_action,
    )
    router.add_get(prefix + "/audit", audit)
    router.add_get(prefix + "/search", search)
    router.add_post(prefix + "/search/patient", search_patient)
    router.add_get(prefix + "/worklists/counts", worklist_counts)
    router.add_get(prefix + "/worklists/items", worklist_items)
    router.add_post(prefix + "/worklists/items/{item_id:[0-9]{1,19}}/clear", worklist_clear)
