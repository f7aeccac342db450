"""CSRF protection for every state change (OWASP's HMAC-based token pattern).

The token is an HMAC-SHA256 of the authenticated identity's name under a server secret: pages
put it in a hidden form field and in htmx's request headers; API clients read it from
``GET /api/v1/me``. A POST, PUT, PATCH or DELETE must carry it (``X-CSRF-Token`` header or
``csrf_token`` form field), and when the browser says where the request comes from (``Origin``)
that must be one of this server's names (:mod:`inturn.worker.console.names`). A page on another
site can make a browser send the user's cookies or proxy session, but it cannot read the token,
so it cannot forge a change.

Source: OWASP Cross-Site Request Forgery Prevention Cheat Sheet (signed double-submit token,
verifying the origin with standard headers).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HEADER = "X-CSRF-Token"
FIELD = "csrf_token"


class Csrf:
    """Issues and checks tokens bound to an identity name.

    ``secret`` should be shared by every replica (the chart mounts one from a Secret); without
    one a random secret is made, and tokens then last as long as the process.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def token(self, name: str) -> str:
        """The token for identity ``name`` (64 hex characters)."""
        return hmac.new(
            self._secret, b"inturn-console:" + name.encode(), hashlib.sha256
        ).hexdigest()

    def valid(self, name: str, presented: str | None) -> bool:
        """Whether ``presented`` is ``name``'s token (constant-time comparison)."""
        return bool(presented) and hmac.compare_digest(self.token(name), str(presented))
