"""Worklists: failures and missed deadlines turned into work that people list, work and clear.

The store (:mod:`inturn.worker.store.worklist`) holds the items; publishers (:mod:`.publish`)
announce created items after their COMMIT; the sweeper's rules (:mod:`.rules`, grouped in rule
packs) place what happens because time passed.

The API in one place::

    placement = await place(conn, queue=..., record_kind=..., record_key=..., reason=...,
                            details={...}, placed_by=...)   # in the caller's transaction
    await announce([placement], publishers)                 # after COMMIT
    await clear(conn, item_id, who=..., note=...)
    await clear_where(conn, record_kind=..., record_keys=[...], note=...)   # system clears
    page = await list_items(conn, queue=..., cursor=page.next_cursor)
    rows = await count(conn)
    shown = await show(conn, item_id)

Layer: worklists, below the feature packages and above the store. It may use the store, the
Destination API's pure helpers and hl7; it names no rule pack (``operations.packs`` does).
"""

from inturn.worker.store.worklist import (
    SYSTEM,
    AlreadyCleared,
    ItemNotFound,
    clear,
    clear_where,
    count,
    get,
    list_items,
    place,
    purge,
    show,
)
from inturn.worker.store.worklist_model import CountRow, Page, Placement, Shown, WorklistItem
from inturn.worker.worklist.publish import Publisher, announce
from inturn.worker.worklist.rules import PackOption, Rule, RuleOutcome, RulePack

__all__ = [
    "SYSTEM",
    "AlreadyCleared",
    "CountRow",
    "ItemNotFound",
    "PackOption",
    "Page",
    "Placement",
    "Publisher",
    "Rule",
    "RuleOutcome",
    "RulePack",
    "Shown",
    "WorklistItem",
    "announce",
    "clear",
    "clear_where",
    "count",
    "get",
    "list_items",
    "place",
    "purge",
    "show",
]
