"""The operations layer: one rule per action whoever calls (command line, console, robot),
typed results, and one error tree."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection

from inturn.worker.console.auth import Identity
from inturn.worker.errors import (
    Conflict,
    Forbidden,
    InturnError,
    Invalid,
    NotFound,
    ReasonRequired,
)
from inturn.worker.operations import privacy
from inturn.worker.operations import queue as actions
from inturn.worker.operations import worklist as worklist_actions
from inturn.worker.operations.actor import ACTIONS, Trusted, permit
from inturn.worker.store import queue, worklist
from inturn.worker.store.model import NewItem
from tests.support import db

DEST = "ward/lab"
CLI = Trusted("alice")
OPERATOR = Identity("otto", frozenset({"operator"}))
VIEWER = Identity("vic", frozenset({"viewer"}))
PRIVACY = Identity("pia", frozenset({"privacy"}))


async def enqueue(conn: AsyncConnection[Any], n: int) -> list[int]:
    return await queue.enqueue(
        conn,
        [
            NewItem(
                DEST,
                "adt",
                f"M{i}",
                "ADT^A01",
                f"MSH|^~\\&|A|B|C|D|||ADT^A01|M{i}|P|2.5\r".encode(),
            )
            for i in range(n)
        ],
    )


@pytest.mark.parametrize("action", ["skip", "drain", "erase", "view-payload", "clear"])
@pytest.mark.parametrize("actor", [CLI, OPERATOR, PRIVACY])
def test_a_reason_is_required_whoever_asks(action: str, actor: Any) -> None:
    if not actor.can(ACTIONS[action].role):
        with pytest.raises(Forbidden):
            permit(actor, action, "because")
        return
    for why in (None, "", "   "):
        with pytest.raises(ReasonRequired, match=f"{action} needs a"):
            permit(actor, action, why)
    assert permit(actor, action, "  ticket 7 ") == "ticket 7"


def test_roles_length_and_nul_are_checked_once() -> None:
    with pytest.raises(Forbidden, match="this needs the operator role"):
        permit(VIEWER, "retry", None)
    with pytest.raises(Forbidden, match="privacy"):
        permit(OPERATOR, "erase", "request 9")
    with pytest.raises(Invalid, match="at most 500"):
        permit(CLI, "skip", "x" * 501)
    with pytest.raises(Invalid, match="NUL"):
        permit(CLI, "skip", "a\x00b")
    assert permit(CLI, "retry", None) is None  # no reason needed, none kept


def test_the_error_tree_refines_the_builtin_errors() -> None:
    for cls, builtin in (
        (NotFound, LookupError),
        (ReasonRequired, ValueError),
        (Invalid, ValueError),
        (Forbidden, PermissionError),
        (worklist.ItemNotFound, NotFound),
        (worklist.AlreadyCleared, Conflict),
    ):
        assert issubclass(cls, InturnError) and issubclass(cls, builtin)
    assert {NotFound.kind, Conflict.kind, ReasonRequired.kind, Forbidden.kind} == {
        "not_found",
        "conflict",
        "reason_required",
        "forbidden",
    }


async def test_each_action_says_what_happened_or_why_not(conn: AsyncConnection[Any]) -> None:
    a, b, c = await enqueue(conn, 3)
    assert await actions.skip(conn, OPERATOR, a, "sent twice") == actions.Changed("skip", (a,))
    with pytest.raises(Conflict, match=f"item {a} is skipped, not pending: nothing to skip"):
        await actions.skip(conn, CLI, a, "again")
    with pytest.raises(NotFound, match="no item 999999"):
        await actions.skip(conn, CLI, 999999, "x")
    with pytest.raises(Conflict, match=f"item {b} is pending, not finished: nothing to remove"):
        await actions.remove_item(conn, CLI, b)
    with pytest.raises(Conflict, match="still pending"):
        await actions.resend(conn, CLI, b)
    with pytest.raises(Conflict, match=f"item {a} was skipped: only failed items are resent"):
        await actions.resend(conn, CLI, a)
    resent = await actions.resend(conn, CLI, a, include_delivered=True)
    assert resent.original == a and resent.copy > c
    assert await actions.remove(conn, CLI, [a, b, 999999]) == actions.Removed(
        (a,),
        (b, 999999),
        (f"item {b} is pending, not finished: nothing to remove", "no item 999999"),
    )
    retried = await actions.retry_destination(conn, CLI, DEST)
    assert retried == actions.Changed("retry", (b, c, resent.copy), DEST)
    assert (await actions.drain(conn, CLI, DEST, "stale")).ids == (b, c, resent.copy)
    assert (await actions.drain(conn, CLI, DEST, "stale")).ids == ()  # known, nothing pending
    with pytest.raises(NotFound, match="no destination nobody/x"):
        await actions.drain(conn, CLI, "nobody/x", "stale")
    with pytest.raises(NotFound, match="no registered destination"):
        await actions.suspend(conn, CLI, DEST)
    shown = await privacy.view_payload(conn, PRIVACY, b, "ticket 7")
    assert shown.item_id == b and shown.data.startswith(b"MSH|")
    matched = await privacy.find_for_erasure(conn, item_ids=[b, 999999])
    assert [m.id for m in matched] == [b]
    assert (await privacy.erase_item(conn, PRIVACY, b, "request 9")).ids == (b,)
    with pytest.raises(NotFound):
        await privacy.erase_item(conn, PRIVACY, b, "request 9")
    with pytest.raises(Invalid):
        await privacy.find_for_erasure(conn)


async def test_suspend_and_resume_say_when_nothing_changed_and_what_still_holds(
    conn: AsyncConnection[Any],
) -> None:
    """A second suspend keeps the first hold, a resume of what is not held changes nothing,
    and neither is audited; a resume says the manifest's spec.suspend still holds."""
    await db.register(conn, DEST)
    await db.register(conn, "ward/frozen", suspended=True)
    assert await actions.suspend(conn, CLI, DEST, "upgrade") == actions.Held(DEST, True)
    again = await actions.suspend(conn, Trusted("kim"), DEST, "again")
    assert again == actions.Held(DEST, True, changed=False, held_by=CLI.name)
    assert again.describe() == f"{DEST} was already held (by {CLI.name}): nothing changed"
    assert await actions.resume(conn, CLI, DEST) == actions.Held(DEST, False)
    idle = await actions.resume(conn, CLI, DEST)
    assert idle == actions.Held(DEST, False, changed=False)
    assert idle.describe() == f"{DEST} was not held: nothing to resume"
    frozen = await actions.resume(conn, CLI, "ward/frozen")
    assert (frozen.changed, frozen.by_manifest) == (False, True)
    assert frozen.describe() == (
        "ward/frozen was not held: nothing to resume; its manifest suspends it too"
        " (spec.suspend: true), so it sends nothing until that is lifted"
    )
    cur = await conn.execute("SELECT who, action FROM inturn_audit ORDER BY id")
    assert await cur.fetchall() == [(CLI.name, "suspend"), (CLI.name, "resume")]


async def test_clearing_a_worklist_item_needs_a_note_and_says_who_was_first(
    conn: AsyncConnection[Any],
) -> None:
    placed = await worklist.place(
        conn, queue="q", record_kind="delivery", record_key="1", reason="r", details={},
        placed_by="test",
    )  # fmt: skip
    with pytest.raises(ReasonRequired, match="clear needs a note"):
        await worklist_actions.clear(conn, OPERATOR, placed.item.id, " ")
    with pytest.raises(Forbidden):
        await worklist_actions.clear(conn, VIEWER, placed.item.id, "done")
    item = await worklist_actions.clear(conn, OPERATOR, placed.item.id, "re-sent")
    assert (item.cleared_by, item.note) == ("otto", "re-sent")
    with pytest.raises(Conflict, match="already cleared by otto"):
        await worklist_actions.clear(conn, CLI, placed.item.id, "again")
    with pytest.raises(NotFound, match="no worklist item 999999"):
        await worklist_actions.clear(conn, CLI, 999999, "x")
