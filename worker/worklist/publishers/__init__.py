"""The built-in publishers and how a process configures them from its environment.

Every process that places work (worker, sweeper, CLI) reads the same variables:

=================================  ===========================================================
``INTURN_WORKLIST_NOTIFY``         a Postgres NOTIFY channel name (e.g. ``inturn_worklist``)
``INTURN_WORKLIST_WEBHOOK_URL``    POST each new item here
``INTURN_WORKLIST_WEBHOOK_SECRET`` HMAC-SHA256 key; signs the body (``X-Inturn-Signature``)
``INTURN_WORKLIST_WEBHOOK_TIMEOUT`` seconds per attempt (default 5)
``INTURN_WORKLIST_WEBHOOK_ATTEMPTS`` tries in all (default 3)
``INTURN_WORKLIST_NATS_URL``       NATS server URL(s), comma-separated
``INTURN_WORKLIST_NATS_SUBJECT``   subject prefix (default ``inturn.worklist``)
=================================  ===========================================================

Unset (or empty) means that publisher is off; with none set nothing outside is told. A
publisher's module (and its client library: aiohttp, nats-py) is imported only when it is
configured, so a worker that announces nothing loads neither.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence

from inturn.worker.worklist.publish import Publisher

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _number(env: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def from_env(env: Mapping[str, str], dsn: str) -> list[Publisher]:
    """The publishers the environment asks for (none when no variable is set).

    Args:
        env: usually ``os.environ``.
        dsn: the store's database, for the NOTIFY publisher.

    Raises:
        ValueError: a variable has a bad value; the message names it.
    """
    publishers: list[Publisher] = []
    channel = env.get("INTURN_WORKLIST_NOTIFY", "").strip()
    if channel:
        if not _IDENTIFIER.match(channel):
            raise ValueError(
                f"INTURN_WORKLIST_NOTIFY={channel!r} is not a channel name"
                " (lowercase letters, digits, '_')"
            )
        from inturn.worker.worklist.publishers.notify import NotifyPublisher

        publishers.append(NotifyPublisher(dsn, channel))
    url = env.get("INTURN_WORKLIST_WEBHOOK_URL", "").strip()
    if url:
        if not url.startswith(("http://", "https://")):
            raise ValueError("INTURN_WORKLIST_WEBHOOK_URL must be an http:// or https:// URL")
        secret = env.get("INTURN_WORKLIST_WEBHOOK_SECRET", "")
        from inturn.worker.worklist.publishers.webhook import WebhookPublisher

        publishers.append(
            WebhookPublisher(
                url,
                secret=secret.encode() if secret else None,
                timeout_seconds=_number(env, "INTURN_WORKLIST_WEBHOOK_TIMEOUT", 5.0, 0.1),
                attempts=int(_number(env, "INTURN_WORKLIST_WEBHOOK_ATTEMPTS", 3, 1)),
            )
        )
    servers = [s.strip() for s in env.get("INTURN_WORKLIST_NATS_URL", "").split(",") if s.strip()]
    if servers:
        prefix = env.get("INTURN_WORKLIST_NATS_SUBJECT", "").strip() or "inturn.worklist"
        from inturn.worker.worklist.publishers.nats import NatsPublisher

        publishers.append(NatsPublisher(servers, subject_prefix=prefix))
    return publishers


async def close_all(publishers: Sequence[Publisher]) -> None:
    """Close every publisher (errors while closing are not worth failing for)."""
    for publisher in publishers:
        with contextlib.suppress(Exception):
            await publisher.close()


__all__ = ["close_all", "from_env"]
