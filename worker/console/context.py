"""What a request handler finds on the application and the request (aiohttp keys)."""

from __future__ import annotations

from aiohttp import web

from inturn.worker.console.auth import AuthConfig, Identity
from inturn.worker.console.csrf import Csrf
from inturn.worker.console.names import ServerNames
from inturn.worker.console.operations import Console

CONSOLE_KEY = web.AppKey("console", Console)
AUTH_KEY = web.AppKey("auth", AuthConfig)
CSRF_KEY = web.AppKey("csrf", Csrf)
NAMES_KEY = web.AppKey("server_names", ServerNames)
IDENTITY_KEY = web.RequestKey("identity", Identity)
CSRF_TOKEN_KEY = web.RequestKey("csrf_token", str)


def identity(request: web.Request) -> Identity:
    """The authenticated identity of ``request`` (set by the guard middleware)."""
    return request[IDENTITY_KEY]


def console(request: web.Request) -> Console:
    """The console's pools and feed."""
    return request.app[CONSOLE_KEY]


def csrf_token(request: web.Request) -> str:
    """The caller's CSRF token (set by the guard middleware)."""
    return request[CSRF_TOKEN_KEY]
