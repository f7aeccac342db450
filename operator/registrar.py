"""The operator's rows in Postgres: the destination registry (one row per Destination, written
only when it differs from what is there), the carrier check before a Destination's children are
made, and the grouped depth query its statuses show.

One :class:`Registrar` per operator process, on a small pool of its own (opened without waiting:
the operator runs, and converges the cluster, while the database is away). Every failure of the
database is reported as a value, never raised: the periodic pass retries. A refusal that lasts
(the database read-only for maintenance or a standby, a lock or statement timeout, the
connection gone) is logged once when it begins and once when it ends, per kind of statement,
not once per Destination and pass (:class:`inturn.worker.text.conditions.Condition`; the
classification is :func:`inturn.worker.store.faults.refusal`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from inturn.operator import manifests
from inturn.operator.restore import HOLDER
from inturn.worker.drain.lanes import summarize
from inturn.worker.spec.config import DEFAULT_STUCK_AFTER_SECONDS
from inturn.worker.spec.schema_packs import pack_spec_of
from inturn.worker.store import faults, logins, reads, registry, restore
from inturn.worker.text.conditions import Condition

log = logging.getLogger("inturn.operator")

#: What the database can fail with, as the operator sees it (logged, retried by the pass).
DB_ERRORS = (psycopg.Error, OSError, TimeoutError)


class Registrar:
    """The registry rows, carrier claims and queue depth of one operator (see the module
    docstring).

    Args:
        dsn: the operator's own Postgres DSN; None disables the registry and the depth (every
            method then does nothing and returns None).
    """

    def __init__(self, dsn: str | None) -> None:
        self.dsn = dsn
        self.pool: AsyncConnectionPool | None = None
        self._registered: dict[str, tuple[Any, ...]] = {}
        #: One condition per kind of statement (said when it begins and when it ends).
        self.conditions = {
            "carriers": Condition(log, "registry: the carrier check (the registration checks)"),
            "register": Condition(log, "registry: writing Destinations' rows"),
            "deleted": Condition(log, "registry: marking deleted Destinations"),
            "depth": Condition(log, "registry: the queue depth query (the last one is kept)"),
            "rows": Condition(log, "registry: reading its rows"),
            "logins": Condition(log, "registry: making or dropping destinations' worker logins"),
            "restore": Condition(log, "registry: the database clock and the restore witness"),
        }

    def _failed(self, kind: str, exc: BaseException, about: str = "") -> str:
        """Count a failure of a ``kind`` of statement; its one-line cause."""
        cause = faults.refusal(exc) or f"{type(exc).__name__}: {exc}".splitlines()[0]
        self.conditions[kind].failed(f"{cause}{f' ({about})' if about else ''}", "every pass")
        return cause

    def _worked(self, kind: str) -> None:
        self.conditions[kind].succeeded()

    async def open(self) -> None:
        """Open the pool (without waiting for the database: calls fail fast meanwhile)."""
        if not self.dsn:
            return
        self.pool = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=4,
            open=False,
            kwargs={"autocommit": True},
            timeout=10,
            reconnect_timeout=0,  # keep trying for ever; calls fail fast meanwhile
        )
        await self.pool.open(wait=False)

    async def close(self) -> None:
        """Close the pool (and forget the conditions that held)."""
        if self.pool is not None:
            await self.pool.close()
        for condition in self.conditions.values():
            condition.forget()

    async def carriers_taken(self, children: manifests.Children) -> registry.CarrierTaken | None:
        """Whether another live Destination already serves one of this one's carriers.

        At most one live Destination may serve a carrier; the API server cannot check that
        across objects, so the operator does before it creates anything, and reports the
        second one as an invalid spec. The registry enforces it again when registering.
        """
        carriers = children.spec.get("carriers") or []
        if self.pool is None or not carriers:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                holders = await registry.carrier_holders(conn, children.key, carriers)
        except DB_ERRORS as exc:
            self._failed("carriers", exc, children.key)
            return None  # the registration checks again
        self._worked("carriers")
        return registry.CarrierTaken(children.key, holders) if holders else None

    async def register(
        self,
        snap: Mapping[str, Any],
        children: manifests.Children,
        registered: Mapping[str, registry.RegisteredDestination] | None,
    ) -> str | None:
        """Upsert the registry row if it differs; return an error text when the DB failed.

        Raises:
            registry.CarrierTaken: another live destination claimed one of its carriers.
        """
        if self.pool is None:
            return None
        meta = snap["metadata"]
        spec = children.spec
        row = registry.RegisteredDestination(
            destination=children.key,
            namespace=meta["namespace"],
            name=meta["name"],
            channel=spec["channel"],
            message_types=tuple((spec.get("filter") or {}).get("messageTypes", [])),
            generation=int(meta.get("generation") or 0),
            suspended=bool(spec["suspend"]),
            carriers=tuple(sorted(spec.get("carriers") or ())),
            sender_kind=next(iter(spec["sender"]), None),  # the one key: mllp, http, sftp
            sender=manifests.sender_summary(spec),
            stuck_after_seconds=int(
                (spec.get("alerting") or {}).get("stuckAfterSeconds", DEFAULT_STUCK_AFTER_SECONDS)
            ),
            expire_after_seconds=spec.get("expireAfterSeconds"),
            schedule=spec.get("schedule"),
            replies=spec.get("replies") or None,
            filter_fields=(spec.get("filter") or {}).get("fields") or None,
            lanes=int((spec.get("lanes") or {}).get("count", 1)),
            pack_spec=pack_spec_of(spec) or None,
            profile=spec.get("profile") or None,
        )
        if registered is not None and registered.get(children.key) == row:
            return None
        if registered is None and self._registered.get(children.key) == _row_tuple(row):
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                await registry.register(
                    conn,
                    destination=row.destination,
                    namespace=row.namespace,
                    name=row.name,
                    channel=row.channel,
                    message_types=row.message_types,
                    generation=row.generation,
                    suspended=row.suspended,
                    carriers=row.carriers,
                    sender_kind=row.sender_kind,
                    sender=row.sender,
                    stuck_after_seconds=row.stuck_after_seconds,
                    expire_after_seconds=row.expire_after_seconds,
                    schedule=row.schedule,
                    replies=row.replies,
                    filter_fields=row.filter_fields,
                    lanes=row.lanes,
                    pack_spec=row.pack_spec,
                    profile=row.profile,
                )
        except DB_ERRORS as exc:
            self._failed("register", exc, children.key)
            return f"the database is unavailable: {type(exc).__name__}"
        self._worked("register")
        self._registered[children.key] = _row_tuple(row)
        return None

    async def mark_deleted(self, destination: str) -> None:
        """The Destination ``namespace/name`` is gone: mark its row deleted (its messages are
        kept); a failure is logged (the periodic pass marks it later)."""
        self._registered.pop(destination, None)
        if self.pool is None:
            return
        try:
            async with self.pool.connection(timeout=5) as conn:
                if await registry.mark_deleted(conn, destination):
                    log.info(
                        "registry: %s marked deleted; its queued messages are kept", destination
                    )
        except DB_ERRORS as exc:  # the periodic pass marks it later
            self._failed("deleted", exc, destination)
        else:
            self._worked("deleted")

    async def ensure_login(self, destination: str, password: str) -> str | None:
        """Make (or re-key) ``destination``'s own worker login
        (:func:`inturn.worker.store.logins.ensure_login`); its role name, or None when there is
        no database or it failed (logged; the reconcile is retried)."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                login = await logins.ensure_login(conn, destination, password)
        except DB_ERRORS as exc:
            self._failed("logins", exc, destination)
            return None
        self._worked("logins")
        return login

    async def drop_login(self, destination: str) -> None:
        """Drop a deleted Destination's worker login (a failure is logged; a login left behind
        keeps working for that destination only, and is dropped by the next delete)."""
        if self.pool is None:
            return
        try:
            async with self.pool.connection(timeout=5) as conn:
                if await logins.drop_login(conn, destination):
                    log.info("registry: %s's worker login dropped", destination)
        except DB_ERRORS as exc:
            self._failed("logins", exc, destination)
        else:
            self._worked("logins")

    async def restore_pass(
        self, *, move: bool = True
    ) -> tuple[int, int, dict[str, restore.Seen]] | None:
        """Move the database's clock on (unless ``move`` is False: a look only) and read what
        each destination holds: ``(the tick it held, the tick it holds now, {namespace/name:
        what it holds})``; None when there is no database or it failed (logged)."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                if move:
                    before, now = await restore.tick(conn)
                else:
                    before = now = await restore.clock(conn)
                seen = await restore.witness(conn)
        except DB_ERRORS as exc:
            self._failed("restore", exc)
            return None
        self._worked("restore")
        return before, now, seen

    async def record_finding(
        self, destination: str, finding: restore.RestoreFinding, channel_before: datetime | None
    ) -> tuple[int, tuple[int | None, datetime | None]] | None:
        """Keep ``finding`` in the restored database (the bounds of ``mark-delivered``); count
        the messages of ``destination`` delivered before, waiting again; and find its channel
        log's last message accepted by ``channel_before`` (the witness's last one; None: not
        looked for). None when the database failed (logged; the next tick finds the restore
        again: a count of 0 would be a wrong one)."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                await restore.record_finding(conn, destination, finding)
                again = await restore.exposure(conn, destination)
                if channel_before is None:
                    return again, (None, None)
                return again, await restore.kept(conn, destination, channel_before)
        except DB_ERRORS as exc:
            self._failed("restore", exc, destination)
            return None

    async def recount(
        self, destination: str, channel_before: datetime | None
    ) -> tuple[int, tuple[int | None, datetime | None]] | None:
        """While a restore is undecided: the messages of ``destination`` that may be sent twice
        now (within its recorded finding), and its channel log's last message accepted by
        ``channel_before``; None when the database failed (logged)."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                again = await restore.exposure(conn, destination)
                if channel_before is None:
                    return again, (None, None)
                return again, await restore.kept(conn, destination, channel_before)
        except DB_ERRORS as exc:
            self._failed("restore", exc, destination)
            return None

    async def has_finding(self, destination: str) -> bool | None:
        """Whether the database keeps a restore's finding for ``destination``; None when the
        database failed (logged)."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                return await restore.finding(conn, destination) is not None
        except DB_ERRORS as exc:
            self._failed("restore", exc, destination)
            return None

    async def forget_finding(self, destination: str) -> bool:
        """Remove ``destination``'s finding once the restore is decided; False when the
        database failed (logged; the next tick tries again)."""
        if self.pool is None:
            return False
        try:
            async with self.pool.connection(timeout=5) as conn:
                await restore.forget_finding(conn, destination)
        except DB_ERRORS as exc:
            self._failed("restore", exc, destination)
            return False
        return True

    async def held(self, destination: str) -> bool | None:
        """Whether ``destination``'s delivery is held; None when the database failed."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                return await registry.held(conn, destination)
        except DB_ERRORS as exc:
            self._failed("restore", exc, destination)
            return None

    async def hold_after_restore(self, destination: str, why: str) -> bool:
        """Hold ``destination``'s delivery until a person decides (audited as ``suspend`` by
        the operator); False when it failed (logged; the next tick tries again)."""
        if self.pool is None:
            return False
        try:
            async with self.pool.connection(timeout=5) as conn:
                return await registry.suspend(conn, destination, who=HOLDER, why=why[:1000])
        except DB_ERRORS as exc:
            self._failed("restore", exc, destination)
            return False

    async def depth(self) -> dict[str, registry.DestinationDepth] | None:
        """The one grouped depth query, by ``namespace/name``; None when the database failed
        (logged) or there is none."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                depths = await registry.status_depth(conn)
                for key, row in depths.items():
                    if row.lanes > 1 and row.pending:  # what its lanes hold (spec.lanes)
                        window = await reads.lane_window_within(conn, key)
                        if window is None:  # too slow: its status says no lanes this time
                            continue
                        view = summarize(window, row.lanes, reads.LANE_VIEW_LIMIT).to_json()
                        depths[key] = dataclasses.replace(row, lane_view=view)
        except DB_ERRORS as exc:
            self._failed("depth", exc)
            return None
        self._worked("depth")
        return depths

    async def rows(self) -> dict[str, registry.RegisteredDestination] | None:
        """Every registry row by ``namespace/name``; None when the database failed (logged) or
        there is none."""
        if self.pool is None:
            return None
        try:
            async with self.pool.connection(timeout=5) as conn:
                rows = {r.destination: r for r in await registry.list_all(conn)}
        except DB_ERRORS as exc:
            self._failed("rows", exc)
            return None
        self._worked("rows")
        return rows


def _row_tuple(row: registry.RegisteredDestination) -> tuple[Any, ...]:
    return (
        row.namespace,
        row.name,
        row.channel,
        row.message_types,
        row.generation,
        row.suspended,
        row.carriers,
        row.sender_kind,
        row.sender,
        row.stuck_after_seconds,
        row.expire_after_seconds,
        json.dumps(row.schedule, sort_keys=True),
        json.dumps(row.replies, sort_keys=True),
        json.dumps(row.filter_fields, sort_keys=True),
        row.lanes,
        json.dumps(row.pack_spec, sort_keys=True),
        json.dumps(row.profile, sort_keys=True),
    )
