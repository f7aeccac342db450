"""The console's aiohttp application: authentication, CSRF, security headers, errors, routes.

Every request but the probes (``GET /healthz``, ``GET /readyz``) must authenticate
(:mod:`.auth`); one that does not gets 401 with ``{"error": {"code": "unauthenticated"}}`` and
nothing else. Every POST must carry the CSRF token (:mod:`.csrf`). Every response carries a
strict Content-Security-Policy (scripts, styles and connections from this origin only; no
inline script, no framing) and is not cached (static files aside). Errors of the JSON API are
``{"error": {"code", "message"}}`` with a stable code; a page's errors are a small HTML page
with the same code. Nothing that could hold a payload is ever put in a URL, a log line or an
error body.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from inturn.worker.console import api, pages
from inturn.worker.console.auth import AuthConfig
from inturn.worker.console.context import (
    AUTH_KEY,
    CONSOLE_KEY,
    CSRF_KEY,
    CSRF_TOKEN_KEY,
    IDENTITY_KEY,
    NAMES_KEY,
)
from inturn.worker.console.csrf import FIELD, HEADER, SAFE_METHODS, Csrf
from inturn.worker.console.names import ServerNames
from inturn.worker.console.operations import Console, ConsoleError
from inturn.worker.errors import InturnError
from inturn.worker.text.conditions import notes
from inturn.worker.text.display import printable

log = logging.getLogger("inturn.console")

#: The status recorded (in the access log) for an answer whose client went away first: the
#: "client closed request" of nginx; nothing is sent.
CLIENT_GONE = 499

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(request: web.Request, status: int, code: str, message: str) -> web.Response:
    """A JSON error for the API (and for 401 everywhere), an HTML page otherwise."""
    if status == 401 or request.path.startswith("/api/") or request.path == "/events":
        error = {"code": code} if status == 401 else {"code": code, "message": message}
        headers = {"WWW-Authenticate": 'Bearer realm="inturn"'} if status == 401 else None
        return web.json_response({"error": error}, status=status, headers=headers)
    return aiohttp_jinja2.render_template(
        "error.html",
        request,
        {"status": status, "code": code, "message": message},
        status=status,
    )


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate, check CSRF on state changes, turn failures into stable error codes, and
    add the security headers."""
    response = await _guarded(request, handler)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    if not request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-store")
    return response


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PROBES:
        return await handler(request)
    names = request.app[NAMES_KEY]
    if not names.serves(request.headers.get("Host")):
        # DNS rebinding: a page of another site whose name now points here. Nothing else is
        # looked at, in any auth mode (RFC 9110 §15.5.20: not this server's name).
        return error_response(request, 421, "misdirected", "not a name this console serves")
    who = request.app[AUTH_KEY].authenticate(request.headers, request.remote)
    if who is None:
        return error_response(request, 401, "unauthenticated", "")
    request[IDENTITY_KEY] = who
    csrf = request.app[CSRF_KEY]
    request[CSRF_TOKEN_KEY] = csrf.token(who.name)
    try:
        if any("\x00" in value for value in request.query.values()):
            # No text column can hold a NUL: refuse it here rather than fail in a query.
            raise ConsoleError(400, "invalid_request", "a query parameter holds a NUL character")
        if request.method not in SAFE_METHODS:
            presented = request.headers.get(HEADER)
            if presented is None and request.content_type in (
                "application/x-www-form-urlencoded",
                "multipart/form-data",
            ):
                presented = str((await request.post()).get(FIELD) or "")
            if not csrf.valid(who.name, presented) or not names.same_origin(
                request.headers.get("Origin")
            ):
                raise ConsoleError(403, "csrf_failed", "missing or wrong CSRF token")
        return await handler(request)
    except ConsoleError as exc:
        return error_response(request, exc.status, exc.code, exc.message)
    except InturnError as exc:  # an action's refusal: its stable code, mapped to a status
        refused = ConsoleError.of(exc)
        return error_response(request, refused.status, refused.code, refused.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
            exc.status, "invalid_request"
        )
        response = error_response(request, exc.status, code, exc.reason)
        if "Allow" in exc.headers:  # a 405 names the methods that are allowed (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except ConnectionError:
        # The client went away mid-answer (a closed tab ends its live view's event stream):
        # ordinary, and nobody is left to answer. aiohttp writes the answer below to nothing.
        log.info("console: %s %s: the client went away", request.method, printable(request.path))
        return web.Response(status=CLIENT_GONE)
    except Exception:
        # The traceback goes to the log (no request body is ever in it); the client gets a code.
        log.exception("console: %s %s failed", request.method, printable(request.path))
        return error_response(request, 500, "internal", "internal error; see the console's log")


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while the process serves (no authentication)."""
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 while the process serves (no authentication), with one line per
    periodic statement the database refuses now (the feed's session: read-only, a lock
    timeout, the connection gone; :func:`inturn.worker.text.conditions.notes`)."""
    return web.Response(text="".join(f"{line}\n" for line in ["ready", *notes()]))


#: The paths served without authentication (probes: they say nothing about the queues).
PROBES = frozenset({"/healthz", "/readyz"})


def static_dir() -> Path:
    """The folder of the console's static files (htmx, its SSE extension, the style sheet)."""
    return Path(str(resources.files("inturn.worker.console").joinpath("static")))


def make_app(
    console: Console, auth: AuthConfig, csrf: Csrf, names: ServerNames | None = None
) -> web.Application:
    """Build the application (routes of :mod:`.api` and :mod:`.pages`, static files), serving
    requests whose ``Host`` is one of ``names`` (default: the loopback names)."""
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    app[CONSOLE_KEY] = console
    app[AUTH_KEY] = auth
    app[CSRF_KEY] = csrf
    app[NAMES_KEY] = names or ServerNames.parse(())
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("inturn.worker.console", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
        undefined=jinja2.StrictUndefined,
    )
    pages.install_filters(env)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_static("/static/", static_dir(), name="static")
    api.add_routes(app.router)
    pages.add_routes(app.router)
    return app
