"""What the privacy role does: data-subject erasure (by item, by patient identifier, its keys
destroyed with it), viewing a payload, and finding a patient's messages; each checks its rule
(:func:`~inturn.worker.operations.actor.permit`) once and is audited. The front ends (the CLI,
the console) call these and only format.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from psycopg import AsyncConnection

from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.errors import PayloadKeysMissing
from inturn.worker.errors import Invalid, NotFound, Unavailable
from inturn.worker.hl7.pid import has_patient_id, lookup_key
from inturn.worker.operations.actor import Actor, permit
from inturn.worker.operations.as_sent import AsSent, receiver_view, shape
from inturn.worker.operations.queue import Changed
from inturn.worker.store import actions, history, identifiers, reads, sealing
from inturn.worker.store.connect import Pools
from inturn.worker.store.model import Item


@dataclass(frozen=True)
class Payload:
    """One item's stored bytes, and that their viewing was audited; with ``as_sent``, the
    message as its destination's receiver gets it too
    (:func:`inturn.worker.operations.as_sent.shape`)."""

    item_id: int
    data: bytes
    as_sent: AsSent | None = None


async def erase(
    conn: AsyncConnection[Any], actor: Actor, item_ids: Sequence[int], why: str | None
) -> Changed:
    """Delete items whatever their state (data-subject erasure); audited with ids, no payload.
    The result lists the ids erased (missing ones are not in it).

    Raises:
        ReasonRequired: no reason.
    """
    reason = permit(actor, "erase", why)
    ids = await actions.erase(conn, list(item_ids), who=actor.name, why=reason)
    return Changed("erase", tuple(ids))


async def erase_item(
    conn: AsyncConnection[Any], actor: Actor, item_id: int, why: str | None
) -> Changed:
    """Erase one item.

    Raises:
        ReasonRequired: no reason.
        NotFound: no such item.
    """
    done = await erase(conn, actor, [item_id], why)
    if not done.ids:
        raise NotFound(f"no item {item_id}")
    return done


class KeysNotDestroyed(Unavailable):
    """The key store did not destroy the patient's keys (unreachable, or refused): by
    :func:`erase_data_subject`, before any row was erased (the keys go first, see there); by
    :func:`erase_patient_keys`, after the caller erased them. Copies in backups stay readable
    until the erasure is run again."""

    kind = "keys_not_destroyed"


async def erase_patient_keys(
    actor: Actor,
    patient_id: str,
    authority: str | None,
    why: str | None,
    payloads: PayloadCodec | None,
    *,
    erased: int = 0,
) -> int | None:
    """Destroy the keys of every identifier an erasure of ``patient_id`` (``authority``)
    matches, after its rows were erased: every copy of its messages elsewhere (a dump, a
    backup, a replica) can no longer be read. The key store records it without identifiers.
    Safe to run again (0 keys the second time). None without payload keys (nothing to do).

    Raises:
        ReasonRequired: no reason.
        KeysNotDestroyed: the key store failed; the message says the ``erased`` rows are gone
            and that running the erasure again finishes it.
    """
    reason = permit(actor, "erase", why)
    return await _destroy_keys(actor, patient_id, authority, reason, payloads, erased=erased)


async def _destroy_keys(
    actor: Actor,
    patient_id: str,
    authority: str | None,
    reason: str | None,
    payloads: PayloadCodec | None,
    *,
    erased: int,
    before_rows: bool = False,
) -> int | None:
    """:func:`erase_patient_keys` once ``permit`` has said yes (``reason`` is its answer);
    ``before_rows``: the rows are not erased yet (the message says so)."""
    if payloads is None or not payloads.enabled:
        return None
    try:
        return await payloads.erase_patient(
            patient_id, authority, actor=actor.name, reason=reason or ""
        )
    except Exception as exc:  # the key store's failure, whatever it is: say what is left
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        done = "nothing erased yet" if before_rows else f"{erased} item(s) erased"
        raise KeysNotDestroyed(
            f"{done}, but the patient's keys were not destroyed ({first}):"
            " copies in backups stay readable until the erasure is run again"
        ) from exc


@dataclass(frozen=True)
class Match:
    """An item found for erasure (never its payload)."""

    id: int
    destination: str
    state: str
    message_type: str

    @classmethod
    def of(cls, item: Item) -> Match:
        """The match of a listed item."""
        return cls(item.id, item.destination, item.state, item.message_type)

    def to_json(self) -> dict[str, Any]:
        """``{"id", "destination", "state", "messageType"}``."""
        return {
            "id": self.id,
            "destination": self.destination,
            "state": self.state,
            "messageType": self.message_type,
        }


async def find_for_erasure(
    conn: AsyncConnection[Any],
    *,
    item_ids: Sequence[int] = (),
    patient_id: str | None = None,
    authority: str | None = None,
    scan: bool = False,
    progress: Callable[[str], None] | None = None,
    payloads: PayloadCodec | None = None,
) -> list[Match]:
    """What an erasure would erase: the items among ``item_ids`` that exist, or every held
    message naming ``patient_id`` (PID-2, PID-3, PID-4, MRG-1; with ``authority``, only
    identifiers it assigned), from the identifier index, or with ``scan`` by reading every
    payload (slow: ``progress`` is told how much there is and, after
    :data:`SCAN_RATE_SAMPLE` items, how long the rest will take).

    Raises:
        Invalid: neither or both of ``item_ids`` and a non-empty ``patient_id``.
        PayloadKeysMissing: by patient, without payload keys, on a database that seals
            payloads (:func:`require_blind_index`).
    """
    if bool(item_ids) == bool(patient_id and patient_id.strip()):
        raise Invalid("give exactly one of item ids or a non-empty patient id")
    if patient_id:
        await require_blind_index(conn, payloads)
    if patient_id and scan:
        return await _scan_for_patient(
            conn, patient_id, authority, progress or (lambda _: None), payloads or PayloadCodec()
        )
    if patient_id:
        found = await identifiers.find_patient(conn, patient_id, authority, payloads=payloads)
        return [Match(i.id, i.destination, i.state, i.message_type) for i in found]
    matched: list[Match] = []
    for item_id in item_ids:
        item = await reads.get_item(conn, item_id)
        if item is not None:
            matched.append(Match.of(item))
    return matched


#: Items read by a scan for a patient before it tells how long the rest will take.
SCAN_RATE_SAMPLE = 2000


async def _scan_for_patient(
    conn: AsyncConnection[Any],
    patient_id: str,
    authority: str | None,
    progress: Callable[[str], None],
    payloads: PayloadCodec,
) -> list[Match]:
    rows, size = await identifiers.scan_estimate(conn)
    progress(
        f"scanning every payload: about {rows} item(s), {size / 1e6:.0f} MB; without --scan the"
        " index answers the same question (reading only the payloads it cannot answer for)"
    )
    matched: list[Match] = []
    started = time.monotonic()
    seen = 0
    for_rate = True
    async for held in reads.scan_payloads(conn):
        seen += 1
        if for_rate and seen == SCAN_RATE_SAMPLE:
            for_rate = False
            elapsed = time.monotonic() - started
            left = max(rows - seen, 0) * elapsed / seen
            progress(f"at the rate of the first {seen} items: about {left:.0f}s more")
        plain = await payloads.open(held.seal_id, held.seal_scope, held.payload)
        if has_patient_id(plain, patient_id, authority):
            matched.append(Match(held.id, held.destination, held.state, held.message_type))
    return matched


async def view_payload(
    conn: AsyncConnection[Any],
    actor: Actor,
    item_id: int,
    why: str | None,
    payloads: PayloadCodec | None = None,
    *,
    as_sent: bool = False,
) -> Payload:
    """One item's message (decrypted on demand with ``payloads``); the viewing is audited
    with its reason, before the payload is opened. ``as_sent``: the message as its
    destination's receiver gets it too (its registered profile applied to the stored bytes).

    Raises:
        ReasonRequired: no reason.
        NotFound: no such item.
        PayloadKeysMissing: the payload is encrypted and ``payloads`` has no keys.
        PayloadErased: its patient's key was erased (Conflict).
    """
    reason = permit(actor, "view-payload", why)
    found = await reads.view_payload(conn, item_id, who=actor.name, why=reason)
    if found is None:
        raise NotFound(f"no item {item_id}")
    seal_id, scope = found.seal
    data = await (payloads or PayloadCodec()).open(seal_id, scope, found.payload)
    if not as_sent:
        return Payload(item_id, data)
    view = await receiver_view(conn, found.destination, item_id)
    return Payload(item_id, data, shape(data, view))


def patient_lookup_key(
    patient_id: str, authority: str | None = None, payloads: PayloadCodec | None = None
) -> str:
    """The identifier index key a search for ``patient_id`` (and ``authority``) reads: the one
    place where a search's key is made (``inturn queue list --patient-id`` and the console's
    patient search both call it), so that both find what ingest indexed. With payload keys,
    every stored form of it, comma-separated (the blind one, and the plain one of rows indexed
    before the keys were given: :func:`inturn.worker.store.identifiers.lookup_text`).

    Raises:
        Invalid: an empty patient ID or authority, or one holding a NUL character.
    """
    if not patient_id.strip():
        raise Invalid("the patient ID is empty")
    if authority is not None and not authority.strip():
        raise Invalid("the authority is empty")
    if "\x00" in patient_id or (authority and "\x00" in authority):
        raise Invalid("a patient ID cannot hold a NUL character")
    if payloads is not None and payloads.enabled:
        return identifiers.lookup_text(patient_id, authority, payloads)
    return lookup_key(patient_id, authority)


#: The refusal of a lookup by patient without payload keys on a database that seals payloads.
NEEDS_KEYS = (
    "payloads here are sealed with payload keys and indexed under the blind index: a search or"
    " erasure by patient needs --payload-keys and --key-dsn (without them it would find nothing)"
)


async def require_blind_index(conn: AsyncConnection[Any], payloads: PayloadCodec | None) -> None:
    """Refuse a lookup by patient that cannot compute the blind index while this database
    seals payloads (``inturn_payload_keys``, written by the first process that sealed one):
    without the keys, it would read only the plain index forms and report that nothing was
    found. Every lookup and erasure by patient calls it (:func:`patient_lookup`,
    :func:`find_for_erasure`); a database that never sealed answers as before. With keys, it
    takes a blind index key rotated since the process started (one key store read).

    Raises:
        PayloadKeysMissing: ``payloads`` has no keys and payloads are sealed here (one line
            naming ``--payload-keys``).
    """
    if payloads is not None and payloads.enabled:
        # a long-running process (the console) takes a rotated blind index key first
        await payloads.refresh_index()
        return
    if await sealing.in_use(conn):
        raise PayloadKeysMissing(NEEDS_KEYS)


async def patient_lookup(
    conn: AsyncConnection[Any],
    patient_id: str,
    authority: str | None = None,
    payloads: PayloadCodec | None = None,
) -> str:
    """:func:`patient_lookup_key`, after :func:`require_blind_index`: the key of a search by
    patient that finds what ingest indexed, or a refusal.

    Raises:
        Invalid: as :func:`patient_lookup_key`.
        PayloadKeysMissing: as :func:`require_blind_index`.
    """
    key = patient_lookup_key(patient_id, authority, payloads)
    await require_blind_index(conn, payloads)
    return key


@dataclass(frozen=True)
class PatientSearch:
    """What a search by patient identifier found.

    Attributes:
        items: the items, newest first (one page).
        total: how many items match in all.
        unindexed: items not indexed yet, which the search could not look at (``inturn
            migrate`` indexes them).
    """

    items: list[Item]
    total: int
    unindexed: int


async def search_patient(
    conn: AsyncConnection[Any],
    actor: Actor,
    patient_id: str,
    authority: str | None,
    why: str | None,
    *,
    limit: int = reads.LIST_LIMIT_DEFAULT,
    payloads: PayloadCodec | None = None,
    **filters: Unpack[reads.PageFilters],
) -> PatientSearch:
    """Items naming a patient (PID-2, PID-3, PID-4 or MRG-1; with ``authority``, only
    identifiers it assigned), found through the identifier index and, for the few rows whose
    identifiers ingest cut at ``--max-indexed-identifiers``, by reading their payloads
    (:func:`inturn.worker.store.identifiers.beyond_index`); the search is audited
    (``search-patient``, its reason and the items shown; never the identifier) in the same
    transaction. Every front end's search by patient is this call: the console's (page and
    API) and ``inturn queue list --patient-id``, whose other ``filters`` (``destination`` ...
    ``before``, :class:`inturn.worker.store.reads.PageFilters`) narrow the page.

    Raises:
        Forbidden: the actor lacks the privacy role.
        ReasonRequired: no reason.
        Invalid: an empty patient ID or authority, or one holding a NUL character; an unknown
            ``state``.
        PayloadKeysMissing: without payload keys on a database that seals payloads.
    """
    reason = permit(actor, "search-patient", why)
    key = await patient_lookup(conn, patient_id, authority, payloads)
    # Rows whose identifiers were cut at ingest's cap: their payloads answer for the rest.
    beyond = await identifiers.beyond_index(
        conn, patient_id, authority, payloads=payloads, unindexed=False
    )
    items, total = await reads.search_patient(
        conn, key, who=actor.name, why=reason, limit=limit, also=[i.id for i in beyond], **filters
    )
    return PatientSearch(items, total, await identifiers.unindexed_count(conn))


@dataclass(frozen=True)
class Erasure:
    """What a data-subject erasure found and did.

    Attributes:
        matched: the items it found (all of them, also in a dry run).
        erased: the ids it erased (empty in a dry run).
        keys_destroyed: the patient's keys destroyed in the key store; None when it did not
            try (a dry run, an erasure by ids, or no payload keys).
        dry_run: nothing was changed.
    """

    matched: tuple[Match, ...]
    erased: tuple[int, ...]
    keys_destroyed: int | None
    dry_run: bool


async def erase_data_subject(
    pools: Pools,
    actor: Actor,
    why: str | None,
    *,
    item_ids: Sequence[int] = (),
    patient_id: str | None = None,
    authority: str | None = None,
    scan: bool = False,
    progress: Callable[[str], None] | None = None,
    payloads: PayloadCodec | None = None,
    dry_run: bool = False,
) -> Erasure:
    """The erasure action whole, as ``inturn queue erase`` takes it: its rule checked once,
    before anything is read (a scan is slow: refuse first); the matches found on the read pool
    (:func:`find_for_erasure`); for an erasure by patient with payload keys, that patient's
    keys destroyed next (even with no row left: copies elsewhere are read with the keys), which
    waits for the messages being sealed under them to commit, and the patient's rows looked up
    again by the index (what was sealed meanwhile); then the rows erased on the write pool in
    one audited statement. So a message stored for the patient while this runs is erased with
    the others or sealed under a key made after it (readable), never left sealed under a
    destroyed key, for the enqueuers that hold their keys (ingest, ``queue.enqueue``:
    :meth:`~inturn.worker.crypto.codec.PayloadCodec.sealing`).

    A dry run by item ids checks no rule and records nothing (ids name no patient). A dry run
    by patient is a search by patient: the rule of ``search-patient`` (the privacy role, a
    reason), and its audit entry (the ids it found, or none) is written before the matches
    are returned, as the console's search is. An erasure by patient that matched nothing
    records ``erase`` with no ids: the lookup is in the audit trail either way.

    Raises:
        Forbidden, ReasonRequired, Invalid: the rule of ``erase`` (``search-patient`` for a dry
            run by patient) refuses; nothing was read.
        KeysNotDestroyed: the key store failed; nothing was erased (run it again).
    """
    by_patient = bool(patient_id and patient_id.strip())
    if not dry_run:
        reason = permit(actor, "erase", why)
    elif by_patient:
        reason = permit(actor, "search-patient", why)
    else:
        reason = None
    async with pools.read.connection() as conn:
        matched = await find_for_erasure(
            conn,
            item_ids=item_ids,
            patient_id=patient_id,
            authority=authority,
            scan=scan,
            progress=progress,
            payloads=payloads,
        )
    if dry_run:
        if by_patient:
            async with pools.write.connection() as conn:
                await reads.record_patient_lookup(
                    conn, [m.id for m in matched], who=actor.name, why=reason
                )
        return Erasure(tuple(matched), (), None, True)
    destroyed = None
    if patient_id and payloads is not None and payloads.enabled:
        # keys first: their DELETE waits for the seals in flight under them (ingest holds the
        # keys it seals under until its COMMIT, PayloadCodec.sealing), so the rows sealed
        # meanwhile are committed and found by the second look, by the index, below
        destroyed = await _destroy_keys(
            actor, patient_id, authority, reason, payloads, erased=0, before_rows=True
        )
        async with pools.read.connection() as conn:
            again = await find_for_erasure(
                conn, patient_id=patient_id, authority=authority, payloads=payloads
            )
        known = {m.id for m in matched}
        matched = [*matched, *(m for m in again if m.id not in known)]
    ids: tuple[int, ...] = ()
    # by patient, the channel log's messages naming the patient are erased too, pulled or not
    patient_key = (
        identifiers.lookup_text(patient_id, authority, payloads)
        if by_patient and patient_id
        else None
    )
    if matched or patient_key:
        async with pools.write.connection() as conn:
            erased = await actions.erase(
                conn, [m.id for m in matched], who=actor.name, why=reason, patient_key=patient_key
            )
            ids = tuple(erased)
    if not ids and by_patient:
        async with pools.write.connection() as conn:
            await reads.record_patient_lookup(conn, [], who=actor.name, why=reason, action="erase")
    if by_patient and patient_id:
        # a day between its DETACH and its DROP is seen by no lookup: erased there by its keys
        async with pools.write.connection() as conn:
            await history.erase_detached(
                conn, identifiers.lookup_text(patient_id, authority, payloads)
            )
    return Erasure(tuple(matched), ids, destroyed, False)
