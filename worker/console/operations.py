"""What the console can do, shared by its JSON API and its pages.

Every operation here calls the store functions that ``inturn queue ...`` and the audit already
use (:mod:`inturn.worker.store.queue`, :mod:`inturn.worker.store.registry`); nothing is
implemented a second time. Each checks the caller's role first and records the authenticated
identity as ``who``. Failures are :class:`ConsoleError` with a stable code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from inturn.worker import worklist
from inturn.worker.console.auth import Identity
from inturn.worker.console.feed import Feed
from inturn.worker.console.text import segments
from inturn.worker.store import queue, registry
from inturn.worker.store.model import STATES
from inturn.worker.worklist.model import ITEM_STATES, NOTE_MAX

#: Role each item action needs.
ITEM_ACTIONS = {
    "retry": "operator",
    "skip": "operator",
    "remove": "operator",
    "resend": "operator",
    "erase": "privacy",
}
#: Role each destination action needs.
DESTINATION_ACTIONS = {
    "retry": "operator",
    "drain": "operator",
    "suspend": "operator",
    "resume": "operator",
}
#: Actions that abandon or expose something: a reason is required.
REASON_REQUIRED = frozenset({"skip", "drain", "erase", "view-payload"})
#: Longest reason or note kept, in characters.
REASON_MAX = 500


class ConsoleError(Exception):
    """A refused or failed request: HTTP status, stable code, and a message with no payload."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass
class Console:
    """The console's handles: the write pool, the read pool and the overview feed."""

    write: AsyncConnectionPool
    read: AsyncConnectionPool
    feed: Feed


def require(identity: Identity, role: str) -> None:
    """Raise 403 ``forbidden`` unless ``identity`` holds ``role``."""
    if not identity.can(role):
        raise ConsoleError(403, "forbidden", f"this needs the {role} role")


def reason(action: str, why: str | None) -> str | None:
    """Normalise a reason: stripped, None when empty.

    Raises:
        ConsoleError: 400 ``reason_required`` when ``action`` needs one and none was given;
            400 ``invalid_request`` when it is longer than :data:`REASON_MAX`.
    """
    text = (why or "").strip()
    if "\x00" in text:
        raise ConsoleError(400, "invalid_request", "a reason cannot hold a NUL character")
    if len(text) > REASON_MAX:
        raise ConsoleError(400, "invalid_request", f"a reason is at most {REASON_MAX} characters")
    if not text and action in REASON_REQUIRED:
        raise ConsoleError(400, "reason_required", f"{action} needs a reason")
    return text or None


def check_state(state: str | None) -> str | None:
    """Return ``state`` (None for any) or raise 400 ``invalid_request``."""
    if state is None:
        return None
    if state not in STATES:
        raise ConsoleError(400, "invalid_request", f"state must be one of {', '.join(STATES)}")
    return state


def capped(limit: int) -> int:
    """A page size capped at 1,000 (an unbounded page over a large backlog would be a denial of
    service on ourselves).

    Raises:
        ConsoleError: 400 ``invalid_request`` below 1.
    """
    if limit < 1:
        raise ConsoleError(400, "invalid_request", "limit must be at least 1")
    return min(limit, queue.LIST_LIMIT_MAX)


async def list_items(
    console: Console,
    identity: Identity,
    destination: str,
    *,
    state: str | None,
    limit: int,
    before: int | None,
) -> dict[str, Any]:
    """One page of a destination's items, newest first, never payloads.

    Returns ``{"total", "items", "nextCursor"}``; ``nextCursor`` is the ``before`` value of the
    next page, or None on the last one.
    """
    require(identity, "viewer")
    limit = capped(limit)
    async with console.read.connection() as conn:
        items, total = await queue.list_items(
            conn, destination=destination, state=check_state(state), limit=limit, before=before
        )
    more = len(items) == limit
    return {
        "total": total,
        "items": [i.to_json() for i in items],
        "nextCursor": str(items[-1].id) if more else None,
    }


async def item_detail(console: Console, identity: Identity, item_id: int) -> dict[str, Any]:
    """One item's metadata, failed attempts and audit entries (no payload).

    Raises:
        ConsoleError: 404 ``not_found``.
    """
    require(identity, "viewer")
    async with console.read.connection() as conn:
        item = await queue.get_item(conn, item_id)
        if item is None:
            raise ConsoleError(404, "not_found", f"no item {item_id}")
        attempts = await queue.attempts(conn, item_id)
        audit = await queue.audit_log(conn, 100, item_id=item_id)
    return {
        "item": item.to_json(),
        "attempts": [a.to_json() for a in attempts],
        "audit": audit,
    }


async def item_action(
    console: Console, identity: Identity, item_id: int, action: str, why: str | None
) -> dict[str, Any]:
    """Retry, skip, remove, resend or erase one item, as ``identity``; audited by the store.

    Returns ``{"action", "itemId", "changed": [ids]}`` (resend: ``[original, copy]``).

    Raises:
        ConsoleError: 404 unknown action or item, 403 role missing, 400 reason missing,
            409 ``conflict`` when the item's state does not allow it.
    """
    role = ITEM_ACTIONS.get(action)
    if role is None:
        raise ConsoleError(404, "not_found", f"no item action {action!r}")
    require(identity, role)
    why = reason(action, why)
    who = identity.name
    async with console.write.connection() as conn:
        if await queue.get_item(conn, item_id) is None:
            raise ConsoleError(404, "not_found", f"no item {item_id}")
        changed: list[int]
        if action == "retry":
            changed = await queue.retry_now(conn, who=who, item_id=item_id, why=why)
        elif action == "skip":
            changed = [item_id] if await queue.skip(conn, item_id, who=who, why=why) else []
        elif action == "remove":
            changed = await queue.remove(conn, [item_id], who=who, why=why)
        elif action == "erase":
            changed = await queue.erase(conn, [item_id], who=who, why=why)
        else:
            try:
                copy = await queue.resend(conn, item_id, who=who, why=why)
            except ValueError:
                changed = []
            else:
                changed = [item_id, copy] if copy is not None else []
    if not changed:
        wanted = "finished" if action in ("remove", "resend") else "pending"
        raise ConsoleError(409, "conflict", f"item {item_id} is not {wanted}; nothing changed")
    console.feed.poke()
    return {"action": action, "itemId": item_id, "changed": changed}


async def destination_action(
    console: Console,
    identity: Identity,
    destination: str,
    action: str,
    why: str | None,
    confirm: str | None = None,
) -> dict[str, Any]:
    """Retry all, drain, suspend or resume a destination, as ``identity``; audited.

    Drain needs ``confirm`` equal to the destination's name (typed by the person) and a reason.
    Returns ``{"action", "destination", "changed": count}``.

    Raises:
        ConsoleError: 404 unknown action (or, for suspend/resume, unregistered destination),
            403 role missing, 400 ``confirmation_mismatch`` or ``reason_required``.
    """
    role = DESTINATION_ACTIONS.get(action)
    if role is None:
        raise ConsoleError(404, "not_found", f"no destination action {action!r}")
    require(identity, role)
    why = reason(action, why)
    if action == "drain" and (confirm or "").strip() != destination:
        raise ConsoleError(
            400, "confirmation_mismatch", "type the destination's name exactly to drain it"
        )
    who = identity.name
    async with console.write.connection() as conn:
        if action == "retry":
            changed = len(await queue.retry_now(conn, who=who, destination=destination, why=why))
        elif action == "drain":
            changed = len(await queue.drain(conn, destination, who=who, why=why))
        else:
            hold = registry.suspend if action == "suspend" else registry.resume
            if not await hold(conn, destination, who=who, why=why):
                raise ConsoleError(404, "not_found", f"no registered destination {destination}")
            changed = 1
    console.feed.poke()
    return {"action": action, "destination": destination, "changed": changed}


async def view_payload(
    console: Console, identity: Identity, item_id: int, why: str | None
) -> dict[str, Any]:
    """One item's payload, segment by segment, for a ``privacy`` user; the viewing is audited.

    Returns ``{"itemId", "segments": [text]}`` (control characters escaped).

    Raises:
        ConsoleError: 403 without the privacy role, 400 without a reason, 404 no such item.
    """
    require(identity, "privacy")
    why = reason("view-payload", why)
    async with console.write.connection() as conn:
        data = await queue.view_payload(conn, item_id, who=identity.name, why=why)
    if data is None:
        raise ConsoleError(404, "not_found", f"no item {item_id}")
    return {"itemId": item_id, "segments": segments(data)}


async def audit(
    console: Console,
    identity: Identity,
    *,
    limit: int,
    destination: str | None = None,
    item_id: int | None = None,
    before: int | None = None,
) -> dict[str, Any]:
    """Audit entries newest first: ``{"entries", "nextCursor"}``; never payloads."""
    require(identity, "viewer")
    limit = capped(limit)
    async with console.read.connection() as conn:
        entries = await queue.audit_log(
            conn, limit, destination=destination or None, item_id=item_id, before=before
        )
    more = len(entries) == limit
    return {"entries": entries, "nextCursor": str(entries[-1]["id"]) if more else None}


async def worklist_counts(
    console: Console, identity: Identity, *, state: str = "pending"
) -> dict[str, Any]:
    """Worklist items per queue and reason: ``{"state", "counts": [...]}``."""
    require(identity, "viewer")
    if state not in ITEM_STATES:
        raise ConsoleError(400, "invalid_request", "state must be pending or cleared")
    async with console.read.connection() as conn:
        rows = await worklist.count(conn, state=state)
    return {"state": state, "counts": [r.to_json() for r in rows]}


async def worklist_items(
    console: Console,
    identity: Identity,
    *,
    queue: str | None,
    reason: str | None,
    state: str | None,
    limit: int,
    cursor: int | None,
) -> dict[str, Any]:
    """One page of worklist items, oldest placement first: ``{"items", "nextCursor"}``."""
    require(identity, "viewer")
    if state is not None and state not in ITEM_STATES:
        raise ConsoleError(400, "invalid_request", "state must be pending or cleared")
    async with console.read.connection() as conn:
        page = await worklist.list_items(
            conn, queue=queue, reason=reason, state=state, limit=capped(limit), cursor=cursor
        )
    return page.to_json()


async def worklist_clear(
    console: Console, identity: Identity, item_id: int, note: str | None
) -> dict[str, Any]:
    """Clear one worklist item with a note, as ``identity`` (audited by the store).

    Raises:
        ConsoleError: 403 without the operator role, 400 ``reason_required`` without a note,
            404 no such item, 409 ``conflict`` when it was already cleared (says by whom).
    """
    require(identity, "operator")
    text = (note or "").strip()
    if "\x00" in text:
        raise ConsoleError(400, "invalid_request", "a note cannot hold a NUL character")
    if not text:
        raise ConsoleError(400, "reason_required", "clearing needs a note")
    if len(text) > NOTE_MAX:
        raise ConsoleError(400, "invalid_request", f"a note is at most {NOTE_MAX} characters")
    try:
        async with console.write.connection() as conn:
            item = await worklist.clear(conn, item_id, who=identity.name, note=text)
    except worklist.ItemNotFound:
        raise ConsoleError(404, "not_found", f"no worklist item {item_id}") from None
    except worklist.AlreadyCleared as exc:
        raise ConsoleError(409, "conflict", str(exc)) from None
    return item.to_json()
