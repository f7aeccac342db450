"""What a person does with worklist items: clear one, saying what was done.

The command line (``inturn worklist clear``) and the console call :func:`clear`; the sweeper's
own clears (``system``) go through :func:`inturn.worker.worklist.clear_where`.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from inturn.worker.operations.actor import Actor, permit
from inturn.worker.store import worklist as store
from inturn.worker.store.worklist_model import WorklistItem


async def clear(
    conn: AsyncConnection[Any], actor: Actor, item_id: int, note: str | None
) -> WorklistItem:
    """Clear one pending worklist item as ``actor`` with ``note``; audited by the store.

    Returns the item as cleared.

    Raises:
        Forbidden: the actor lacks the operator role.
        ReasonRequired: no note.
        Invalid: a note longer than 1,000 characters or holding a NUL character.
        NotFound: no such item (:class:`~inturn.worker.store.worklist.ItemNotFound`).
        Conflict: it was cleared before; the message says by whom and when
            (:class:`~inturn.worker.store.worklist.AlreadyCleared`).
    """
    text = permit(actor, "clear", note)
    assert text is not None  # permit refuses an empty note
    return await store.clear(conn, item_id, who=actor.name, note=text)
