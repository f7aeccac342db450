"""What the console can do, shared by its JSON API and its pages.

Every action calls the operations layer (:mod:`inturn.worker.operations.queue`,
:mod:`inturn.worker.operations.worklist`) that ``inturn queue ...`` calls too, with the
authenticated identity as the actor: the role an action needs, whether it needs a reason and
why nothing changed are decided there, once. This module picks the pool, turns results into
JSON and pokes the overview feed. Failures are :class:`~inturn.worker.errors.InturnError`
(mapped to HTTP statuses by :data:`STATUS`) or :class:`ConsoleError` with a stable code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from inturn.worker import worklist
from inturn.worker.console.auth import Identity
from inturn.worker.console.feed import Feed
from inturn.worker.console.text import segments
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.drain.lanes import summarize
from inturn.worker.errors import InturnError
from inturn.worker.operations import privacy
from inturn.worker.operations import queue as actions
from inturn.worker.operations import worklist as worklist_actions
from inturn.worker.store import history, reads
from inturn.worker.store.model import STATES
from inturn.worker.store.worklist_model import ITEM_STATES
from inturn.worker.worklist.delivery_failed import RECORD_KIND as DELIVERY_RECORD

#: The actions the console offers on one item (their rules: ``operations.actor.ACTIONS``).
ITEM_ACTIONS = ("retry", "skip", "remove", "resend", "erase")
#: The actions the console offers on a destination.
DESTINATION_ACTIONS = ("retry", "drain", "suspend", "resume", "resend-failed")
#: HTTP status of each :class:`~inturn.worker.errors.InturnError` code.
STATUS = {
    "not_found": 404,
    "conflict": 409,
    "reason_required": 400,
    "forbidden": 403,
    "invalid_request": 400,
    "confirmation_mismatch": 400,
}


class ConsoleError(InturnError):
    """A refused or failed request: HTTP status, stable code, and a message with no payload."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.kind = code
        self.message = message

    @classmethod
    def of(cls, exc: InturnError) -> ConsoleError:
        """The console's form of an error of the operations layer (status from its code)."""
        if isinstance(exc, ConsoleError):
            return exc
        return cls(STATUS.get(exc.kind, 400), exc.kind, str(exc))


@dataclass
class Console:
    """The console's handles: the write pool, the read pool, the overview feed, and the codec
    that opens encrypted payloads for the audited view (no keys: an envelope is refused)."""

    write: AsyncConnectionPool
    read: AsyncConnectionPool
    feed: Feed
    payloads: PayloadCodec = field(default_factory=PayloadCodec)


def require(identity: Identity, role: str) -> None:
    """Raise 403 ``forbidden`` unless ``identity`` holds ``role`` (for reading)."""
    if not identity.can(role):
        raise ConsoleError(403, "forbidden", f"this needs the {role} role")


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
    return min(limit, reads.LIST_LIMIT_MAX)


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
        items, total = await reads.list_items(
            conn, destination=destination, state=check_state(state), limit=limit, before=before
        )
    more = len(items) == limit
    return {
        "total": total,
        "items": [i.to_json() for i in items],
        "nextCursor": str(items[-1].id) if more else None,
    }


#: Most attempts marked on a destination's day picture (the newest are kept).
MAX_ATTEMPT_MARKS = 1000


async def attempt_marks(
    console: Console, identity: Identity, destination: str, *, seconds: float = 86400.0
) -> list[tuple[datetime, str]]:
    """``destination``'s failed attempts of the last ``seconds`` (a day), newest first, at most
    :data:`MAX_ATTEMPT_MARKS`: ``(at, outcome)``, outcome ``retry`` or ``failed``."""
    require(identity, "viewer")
    async with console.read.connection() as conn:
        return await reads.destination_attempts(
            conn, destination, seconds=seconds, limit=MAX_ATTEMPT_MARKS
        )


async def history_line(console: Console, identity: Identity) -> str:
    """The history's size and oldest day, the hot table's size and the maintenance job's last
    run, as one line (:meth:`inturn.worker.store.history.Status.describe`)."""
    require(identity, "viewer")
    async with console.read.connection() as conn:
        status = await history.status(conn, count_up_to=history.COUNT_UP_TO)
    return status.describe(datetime.now(UTC))


async def head_item(
    console: Console, identity: Identity, destination: str
) -> dict[str, Any] | None:
    """The destination's head: its oldest pending item (everything else waits behind it), as
    an item's JSON; None when nothing is pending."""
    require(identity, "viewer")
    async with console.read.connection() as conn:
        head = await reads.oldest_pending(conn, destination)
    return head.to_json() if head is not None else None


#: What a destination's lane view says when its window could not be read in time.
LANE_VIEW_UNAVAILABLE = (
    f"lanes view unavailable: its pending messages took longer than"
    f" {reads.LANE_VIEW_TIMEOUT_MS / 1000:g} s to read"
)


async def lane_view(
    console: Console, identity: Identity, destination: str
) -> dict[str, Any] | None:
    """What the destination's lanes hold (``spec.lanes.count`` above 1, something pending):
    :meth:`inturn.worker.drain.lanes.LaneSummary.to_json` of its oldest pending rows (at most
    :data:`inturn.worker.store.reads.LANE_VIEW_LIMIT`); None for one lane or nothing pending;
    ``{"count": n, "unavailable": text}`` when its window took longer than
    :data:`inturn.worker.store.reads.LANE_VIEW_TIMEOUT_MS` to read (the page shows the rest)."""
    require(identity, "viewer")
    async with console.read.connection() as conn:
        rows = await reads.depth(conn, destination)
        if not rows or rows[0].lanes <= 1 or not rows[0].pending:
            return None
        window = await reads.lane_window_within(conn, destination)
    if window is None:
        return {"count": rows[0].lanes, "unavailable": LANE_VIEW_UNAVAILABLE}
    return summarize(window, rows[0].lanes, reads.LANE_VIEW_LIMIT).to_json()


#: Longest control ID searched for: ingest refuses a longer MSH-10, so none is stored.
MAX_CONTROL_ID_CHARS = 199
#: Most items a search shows (the total is counted all the same).
SEARCH_LIMIT = 100
#: Most related items and worklist items an item's page lists.
RELATED_LIMIT = 100


async def item_detail(console: Console, identity: Identity, item_id: int) -> dict[str, Any]:
    """One item's whole life, without its payload: metadata, failed attempts, its resend chain
    (first original to latest copy, itself included), the other items of its channel with its
    control ID (the same message for other destinations, or an MSH-10 reused), the worklist
    items about it and the audit entries naming it.

    Raises:
        ConsoleError: 404 ``not_found``.
    """
    require(identity, "viewer")
    async with console.read.connection() as conn:
        item = await reads.get_item(conn, item_id)
        if item is None:
            raise ConsoleError(404, "not_found", f"no item {item_id}")
        attempts = await reads.attempts(conn, item_id)
        audit = await reads.audit_log(conn, 100, item_id=item_id)
        chain = await reads.resend_chain(conn, item_id)
        same, _ = await reads.list_items(
            conn, channel=item.channel, control_id=item.control_id, limit=RELATED_LIMIT + 1
        )
        work = await worklist.list_items(
            conn,
            record_kind=DELIVERY_RECORD,
            record_key=str(item_id),
            state=None,
            limit=RELATED_LIMIT,
        )
    return {
        "item": item.to_json(),
        "attempts": [a.to_json() for a in attempts],
        "audit": audit,
        "resends": [i.to_json() for i in chain] if len(chain) > 1 else [],
        "sameControlId": [i.to_json() for i in same if i.id != item_id][:RELATED_LIMIT],
        "worklist": [w.to_json() for w in work.items],
    }


async def search_control_id(
    console: Console, identity: Identity, control_id: str, *, limit: int = SEARCH_LIMIT
) -> dict[str, Any]:
    """Items of every destination whose MSH-10 is ``control_id`` (exact, through its index),
    newest first: ``{"total", "items"}``; any role may search so.

    Raises:
        ConsoleError: 400 ``invalid_request`` for an empty control ID or one longer than
            :data:`MAX_CONTROL_ID_CHARS`.
    """
    require(identity, "viewer")
    text = control_id.strip()
    if not text:
        raise ConsoleError(400, "invalid_request", "give a control ID (MSH-10) to search for")
    if len(control_id) > MAX_CONTROL_ID_CHARS:
        raise ConsoleError(
            400, "invalid_request", f"a control ID is at most {MAX_CONTROL_ID_CHARS} characters"
        )
    async with console.read.connection() as conn:
        items, total = await reads.list_items(conn, control_id=text, limit=capped(limit))
    return {"total": total, "items": [i.to_json() for i in items]}


async def search_patient(
    console: Console,
    identity: Identity,
    patient_id: str | None,
    authority: str | None,
    why: str | None,
    *,
    limit: int = SEARCH_LIMIT,
) -> dict[str, Any]:
    """Items naming a patient, newest first, for the privacy role, through the identifier index
    ``inturn queue list --patient-id`` reads; audited (``search-patient``, with the reason and
    the items shown, never the identifier) as a payload viewing is.

    Returns ``{"total", "items", "unindexed"}`` (``unindexed``: items not indexed yet, which
    the search could not look at).

    Raises:
        ConsoleError: 403 without the privacy role, 400 without a reason or a patient ID.
    """
    try:
        async with console.write.connection() as conn:
            found = await privacy.search_patient(
                conn,
                identity,
                patient_id or "",
                authority or None,
                why,
                limit=capped(limit),
                payloads=console.payloads,
            )
    except InturnError as exc:
        raise ConsoleError.of(exc) from None
    return {
        "total": found.total,
        "items": [i.to_json() for i in found.items],
        "unindexed": found.unindexed,
    }


async def item_action(
    console: Console,
    identity: Identity,
    item_id: int,
    action: str,
    why: str | None,
    *,
    include_delivered: bool = False,
) -> dict[str, Any]:
    """Retry, skip, remove, resend or erase one item, as ``identity``; audited by the store.

    A resend copies a failed item; a delivered or skipped one only with ``include_delivered``
    (the item page's explicit button; the API's ``includeDelivered: true``), as the command
    line's ``--include-delivered``: one rule, in :func:`inturn.worker.operations.queue.resend`.

    Returns ``{"action", "itemId", "changed": [ids]}`` (resend: ``[original, copy]``).

    Raises:
        ConsoleError: 404 unknown action or item, 403 role missing, 400 reason missing,
            409 ``conflict`` when the item's state does not allow it (the message says why).
    """
    if action not in ITEM_ACTIONS:
        raise ConsoleError(404, "not_found", f"no item action {action!r}")
    try:
        async with console.write.connection() as conn:
            changed: tuple[int, ...]
            if action == "retry":
                changed = (await actions.retry_item(conn, identity, item_id, why)).ids
            elif action == "skip":
                changed = (await actions.skip(conn, identity, item_id, why)).ids
            elif action == "remove":
                changed = (await actions.remove_item(conn, identity, item_id, why)).ids
            elif action == "erase":
                changed = (await privacy.erase_item(conn, identity, item_id, why)).ids
            else:
                resent = await actions.resend(
                    conn,
                    identity,
                    item_id,
                    why,
                    console.payloads,
                    include_delivered=include_delivered,
                )
                changed = (resent.original, resent.copy)
    except InturnError as exc:
        raise ConsoleError.of(exc) from None
    console.feed.poke()
    return {"action": action, "itemId": item_id, "changed": list(changed)}


async def destination_action(
    console: Console,
    identity: Identity,
    destination: str,
    action: str,
    why: str | None,
    confirm: str | None = None,
    message_type: str | None = None,
) -> dict[str, Any]:
    """Retry all, drain, suspend, resume or resend-failed a destination, as ``identity``;
    audited. ``resend-failed`` queues copies of every failed item not resent yet, in their
    original order (``message_type``: only those whose MSH-9 matches).

    Drain needs ``confirm`` equal to the destination's name (typed by the person) and a reason.
    Returns ``{"action", "destination", "changed": count}``.

    Raises:
        ConsoleError: 404 unknown action or destination, 403 role missing,
            400 ``confirmation_mismatch`` or ``reason_required``.
    """
    if action not in DESTINATION_ACTIONS:
        raise ConsoleError(404, "not_found", f"no destination action {action!r}")
    try:
        # the operation checks its rule once (role, reason, then drain's confirmation)
        async with console.write.connection() as conn:
            if action == "retry":
                done = await actions.retry_destination(conn, identity, destination, why)
                changed = len(done.ids)
            elif action == "drain":
                drained = await actions.drain(
                    conn, identity, destination, why, confirm=confirm or ""
                )
                changed = len(drained.ids)
            elif action == "resend-failed":
                resent = await actions.resend_failed(
                    conn,
                    identity,
                    destination,
                    why,
                    message_type=message_type or None,
                    payloads=console.payloads,
                )
                changed = len(resent.copies)
            else:
                hold = actions.suspend if action == "suspend" else actions.resume
                changed = int((await hold(conn, identity, destination, why)).changed)
    except InturnError as exc:
        raise ConsoleError.of(exc) from None
    console.feed.poke()
    return {"action": action, "destination": destination, "changed": changed}


async def view_payload(
    console: Console, identity: Identity, item_id: int, why: str | None
) -> dict[str, Any]:
    """One item's payload, segment by segment, for a ``privacy`` user; the viewing is audited.

    Returns ``{"itemId", "segments": [text], "asSent"}`` (control characters escaped):
    ``asSent`` is the message as its destination's receiver gets it
    (:func:`inturn.worker.operations.as_sent.shape`: ``shaped``, ``refusal``, ``sequence``,
    ``reserved`` and ``segments``, None when refused).

    Raises:
        ConsoleError: 403 without the privacy role, 400 without a reason, 404 no such item.
    """
    try:
        async with console.write.connection() as conn:
            shown = await privacy.view_payload(
                conn, identity, item_id, why, console.payloads, as_sent=True
            )
    except InturnError as exc:
        raise ConsoleError.of(exc) from None
    sent = shown.as_sent
    as_sent = None
    if sent is not None:
        text = None if sent.data is None else segments(sent.data, sent.codec)
        as_sent = {**sent.to_json(), "segments": text}
    return {"itemId": item_id, "segments": segments(shown.data), "asSent": as_sent}


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
        entries = await reads.audit_log(
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
    try:
        async with console.write.connection() as conn:
            item = await worklist_actions.clear(conn, identity, item_id, note)
    except InturnError as exc:
        raise ConsoleError.of(exc) from None
    return item.to_json()
