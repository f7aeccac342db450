"""One Postgres role per component, each with only the privileges its job needs.

``inturn migrate --create-roles`` (run by a role allowed to create roles and owning the
tables, usually the one that runs the migrations) creates the roles below when they do not
exist, as ``LOGIN`` roles without a password (set one with ``ALTER ROLE ... PASSWORD``, or use
certificate or IAM authentication), and then makes each role's table privileges exactly those
of :data:`GRANTS`: everything else is revoked. Running it again after a migration grants the
new tables; it never touches other roles. This module declares what each role may;
:mod:`inturn.worker.store.roles_apply` puts it in place.

=========  ==================================================================================
role       may
=========  ==================================================================================
ingest     read the destination registry; insert delivery rows (and read back their ids); keep
           its duplicate window (reading the state of a message's earlier copies and linking a
           re-send to them); declare feeds and record their last message times. It cannot
           read payloads back, change a delivery's state or delete one.
worker     read delivery rows but their patient keys (it sends payloads, so it reads them);
           change only their state, attempts, times and errors; record failed attempts; place
           items on worklists (``delivery-failed``); read its destination's hold; take a
           destination's worker lock (no other role can). It cannot change a payload or a
           destination, delete rows or change the registry.
operator   write the destination registry and its carrier claims; read queue depth (delivery
           metadata, never the payload or patient keys).
sweeper    read delivery metadata, the registry and the reservation records; skip expired
           messages (state and decider only); cancel expired bookings (withdraw their
           segments, record the events, enqueue the carriers' cancellation notices through
           ``inturn_enqueue_cancel_notice``, which builds each from the booking record: it
           cannot insert a delivery of its own); place and clear worklist items; write the
           audit trail. It reads no payload, writes none and deletes nothing.
purge      delete finished deliveries and cleared worklist items, move finished rows to
           history, turn the log's epochs and drop a day's partitions, through the functions
           of migrations 0011 and 0034 only; it reads the epochs and records its own runs.
admin      the CLI's destructive commands (skip, drain, remove, resend, erase, imports, suspend
           and resume) and the console: read and change rows of every table, but no DDL and
           no role management.
reader     the CLI's listings and dashboards: read everything except payloads and patient keys.
=========  ==================================================================================

Privileges are table privileges (PostgreSQL "Privileges", ``GRANT``); a column list limits one
to those columns, and ``except`` grants it on every column but those named (resolved against
the table when the grants are applied, so a new column is covered by the next run). Identity
columns need no sequence privilege to be filled in; with payload encryption the roles that
enqueue draw row IDs first (the ID is bound into each envelope), so :data:`SEQUENCES` grants
them ``USAGE`` on the delivery table's sequence.

Our functions (migration 0011: the component locks and purge's deletions, ``SECURITY DEFINER``
with a fixed ``search_path``) are executable only by the components :data:`FUNCTIONS` names.
The server's advisory lock functions (``pg_advisory_lock(bigint)`` and its relatives,
:data:`ADVISORY_LOCKS`) are revoked from ``PUBLIC`` (and granted back to the functions' owner),
so no component role can take a lock key directly; that revocation needs a superuser (the
functions belong to the bootstrap superuser), and without one
:func:`~inturn.worker.store.roles_apply.apply_roles` reports it as a warning. ``pg_notify``
cannot be withheld (``NOTIFY`` needs no privilege): a notification is a wake-up, never a fact
(see docs/explanation/security.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inturn.worker.errors import Invalid

#: Component names, in the order roles are created.
COMPONENTS = ("ingest", "worker", "operator", "sweeper", "purge", "admin", "reader")
#: Default role name prefix: roles are ``inturn_ingest``, ``inturn_worker``, ...
DEFAULT_PREFIX = "inturn_"

_PREFIX = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


@dataclass(frozen=True)
class Grant:
    """One table privilege.

    Attributes:
        privilege: SELECT, INSERT, UPDATE or DELETE.
        columns: only these columns (empty: the whole table).
        but: every column except these (resolved when applied); exclusive with ``columns``.
    """

    privilege: str
    columns: tuple[str, ...] = ()
    but: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.privilege not in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            raise Invalid(f"unknown privilege {self.privilege!r}")
        if self.columns and self.but:
            raise Invalid("columns and but exclude each other")


SELECT = Grant("SELECT")
INSERT = Grant("INSERT")
UPDATE = Grant("UPDATE")
DELETE = Grant("DELETE")
ALL_DML = (SELECT, INSERT, UPDATE, DELETE)
#: Delivery columns that hold patient data: the payload, and digests of its patient IDs.
PATIENT_DATA = ("payload", "patient_keys")
NO_PATIENT_DATA = Grant("SELECT", but=PATIENT_DATA)

#: Sequences whose next values a component draws itself (``USAGE``): the delivery table's, for
#: the components that enqueue encrypted payloads (see ``queue.draw_ids``).
SEQUENCES: dict[str, tuple[str, ...]] = {
    "inturn_delivery_id_seq": ("ingest", "admin", "sweeper"),
    # the channel log's ids (migration 0033): a message is sealed once, bound to its log id
    "inturn_message_id_seq": ("ingest", "admin"),
}

#: Every table of the schema -> role -> its privileges. A table missing here fails
#: tests/integration/test_roles.py: each new table needs a decision (an empty mapping is one).
GRANTS: dict[str, dict[str, tuple[Grant, ...]]] = {
    "inturn_schema_migrations": {"reader": (SELECT,)},
    "inturn_delivery": {
        # RETURNING id needs SELECT on id. A message received again reads its earlier copies'
        # state (never their payload); a re-send it queues is linked to them by the insertion
        # itself (migration 0032's trigger, audited): no role writes resent_as.
        "ingest": (
            INSERT,
            Grant(
                "SELECT",
                (
                    "id",
                    "channel",
                    "control_id",
                    "destination",
                    "state",
                    "enqueued_at",
                    "finished_at",
                    "resent_from",
                ),
            ),
        ),
        # It reads the head (payload included) and the patient keys (with lanes, a message's
        # keys say which others it must wait for; the payload it sends names the same patients)
        # and records an outcome: state, attempts, times, errors. It never changes the payload,
        # the destination or the patient keys. It pulls its destination's messages from the
        # channel log (migration 0033) into slim rows: an insertion of the log's facts and the
        # message's id, never a payload or a state.
        "worker": (
            SELECT,
            Grant(
                "INSERT",
                (
                    "destination",
                    "channel",
                    "control_id",
                    "message_type",
                    "size",
                    "patient_keys",
                    "traceparent",
                    "enqueued_at",
                    "message_id",
                    "resent_from",
                ),
            ),
            Grant(
                "UPDATE",
                (
                    "state",
                    "attempts",
                    "next_attempt",
                    "last_attempt",
                    "finished_at",
                    "last_error",
                    "reason",
                ),
            ),
        ),
        "operator": (
            Grant(
                "SELECT",
                (
                    "id",
                    "destination",
                    "channel",
                    "state",
                    "attempts",
                    "enqueued_at",
                    "finished_at",
                    "last_error",
                    "resent_as",
                    # the restore witness: a slim row's log message (an id, no content)
                    "message_id",
                ),
            ),
        ),
        # delivery-expired skips a message: its state and who decided, never its content.
        # No INSERT: the only delivery the sweeper makes is a booking's cancellation notice,
        # built by inturn_enqueue_cancel_notice (FUNCTIONS) from the booking record.
        "sweeper": (
            NO_PATIENT_DATA,
            Grant("UPDATE", ("state", "decided_by", "finished_at", "reason")),
        ),
        # purge deletes through inturn_purge_deliveries (FUNCTIONS) and holds no privilege here
        # a person's role changes any column but the resend links (written by the copies' insertion)
        "admin": (SELECT, INSERT, Grant("UPDATE", but=("resent_as",)), DELETE),
        "reader": (NO_PATIENT_DATA,),
    },
    # The channel log (migration 0033): ingest appends a message once and reads back what its
    # duplicate window needs (never a payload); the worker reads what it pulls and sends.
    "inturn_message": {
        "ingest": (
            INSERT,
            Grant("SELECT", ("id", "channel", "control_id", "route", "enqueued_at")),
        ),
        "worker": (SELECT,),
        "operator": (Grant("SELECT", ("id", "channel", "route", "enqueued_at")),),
        "sweeper": (NO_PATIENT_DATA,),
        # an erasure deletes a message once, for every destination (migration 0038)
        "admin": (SELECT, INSERT, Grant("UPDATE", ("payload", "patient_keys")), DELETE),
        "reader": (NO_PATIENT_DATA,),
    },
    # Route sets: ingest adds the sets it meets; everyone who reads the log may resolve them.
    "inturn_route": {
        # (UPDATE of channel: a re-send's set is upserted, its id returned when it exists; a
        # trigger of migration 0048 refuses any update that changes a set)
        "ingest": (SELECT, INSERT, Grant("UPDATE", ("channel",))),
        "worker": (SELECT,),
        "operator": (SELECT,),
        "sweeper": (SELECT,),
        "admin": (SELECT, INSERT),
        "reader": (SELECT,),
    },
    # Each destination's place in its channel's log: the worker's pull moves it; depth reads it.
    "inturn_cursor": {
        # ingest: a message received again is pending while still in the log past a cursor
        "ingest": (Grant("SELECT", ("destination", "position")),),
        "worker": (SELECT, INSERT, Grant("UPDATE", ("channel", "position"))),
        "operator": (SELECT,),
        "sweeper": (SELECT,),
        "admin": (SELECT, INSERT, Grant("UPDATE", ("channel", "position"))),
        "reader": (SELECT,),
    },
    # The log's id ranges (partitions); the maintenance job (the purge role) reads them and
    # writes them through its functions (migration 0034).
    "inturn_epoch": {
        "purge": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # Each epoch's rows of the log and of history, counted as they are written (migration
    # 0052: triggers and the maintenance's functions write it; a day's drop audits its sums).
    "inturn_epoch_rows": {
        "purge": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # Finished rows moved out of the hot table (migration 0034), written and dropped by the
    # maintenance job's functions only. People read them as they read the hot table's; an
    # erasure deletes them.
    "inturn_history": {
        # the restore witness: each destination's last rows (never a payload)
        "operator": (
            Grant("SELECT", ("id", "destination", "state", "enqueued_at", "finished_at")),
        ),
        "sweeper": (NO_PATIENT_DATA,),
        # an erasure deletes; a rotation of the blind index key rewrites the patient index
        "admin": (SELECT, Grant("UPDATE", ("patient_keys",)), DELETE),
        "reader": (NO_PATIENT_DATA,),
    },
    # What the maintenance job was last told and when it ran: its alerts' facts.
    "inturn_maintenance": {
        "purge": (SELECT, INSERT, UPDATE),
        "operator": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # Which destination a worker's login works for (migration 0036): written by the login
    # functions only (the operator's, an admin's); people may see the mapping.
    "inturn_worker_scope": {
        # the worker role's row policies read the session's own mapping (sql/roles.sql)
        "worker": (SELECT,),
        "operator": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # The worker role's name, recorded by --create-roles for the login functions; the worker
    # role's row policies read it (a destination's login whose mapping is gone reaches nothing).
    "inturn_role_setting": {"worker": (SELECT,)},
    # The database's clock (migration 0039): the operator moves it on and reads it (a restored
    # database holds an older tick than the Destinations' status recorded).
    "inturn_clock": {
        "worker": (SELECT,),
        "operator": (SELECT, INSERT, Grant("UPDATE", ("tick", "at"))),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # A restore's finding until a person decides (migration 0042): the operator writes and
    # removes it; mark-delivered (admin) reads its bounds.
    "inturn_restore": {
        "operator": (SELECT, INSERT, UPDATE, DELETE),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # MSH-13 sequence numbers of a receiver profile (migration 0045): the worker reserves a
    # message's number at its first send (its destination's counter moves on) and reads it
    # back at a retry; people may see them.
    "inturn_sequence": {
        "worker": (SELECT, INSERT, Grant("UPDATE", ("last",))),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_sequence_number": {
        "worker": (SELECT, INSERT),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # ingest's own duplicate window (it purges it itself); nobody else uses it
    "inturn_received": {
        "ingest": (SELECT, INSERT, Grant("UPDATE", ("received_at", "size", "repeats")), DELETE),
    },
    "inturn_audit": {
        # the operator's hold after a restore is audited like a person's
        "operator": (INSERT,),
        "sweeper": (INSERT,),
        # a real purge records what it removed (counts per state, never ids or content)
        "purge": (INSERT,),
        "admin": (SELECT, INSERT),
        "reader": (SELECT,),
    },
    "inturn_worker_sender": {
        "worker": (SELECT, INSERT, UPDATE),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # Who holds a destination (migration 0019): the worker acquires, renews and releases its
    # lease, and its guarded statements renew it; people may see who holds what.
    "inturn_lease": {
        "worker": (SELECT, INSERT, UPDATE),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # Whether payloads are sealed here (migration 0021): the sealers record it once, and every
    # lookup by patient without payload keys reads it to refuse rather than find nothing.
    "inturn_payload_keys": {
        "ingest": (SELECT, INSERT),
        "admin": (SELECT, INSERT),
        "reader": (SELECT,),
    },
    "inturn_destination": {
        "ingest": (SELECT,),
        # The head query honours a hold (suspend from the console or the CLI).
        # Its depth gauge shows the delivery window (spec.schedule) and lanes of a live
        # registration.
        # Its depth counts the channel log's rows it has not pulled (inturn_unpulled): channel.
        "worker": (
            Grant(
                "SELECT", ("destination", "channel", "held_at", "schedule", "lanes", "deleted_at")
            ),
        ),
        "operator": (SELECT, INSERT, UPDATE),
        "sweeper": (SELECT,),
        # Suspend and resume set or lift a hold; nothing else of the registry changes.
        "admin": (SELECT, Grant("UPDATE", ("held_at", "held_by", "held_why", "updated_at"))),
        "reader": (SELECT,),
    },
    # Failed attempts (an item's history): written by the worker with each retry or give-up,
    # deleted with their item (ON DELETE CASCADE runs as the table's owner).
    "inturn_attempt": {
        "worker": (INSERT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_destination_carrier": {
        "operator": ALL_DML,
        "sweeper": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_worklist_item": {
        "worker": (SELECT, INSERT),
        "sweeper": (SELECT, INSERT, UPDATE),
        # purge deletes cleared items through inturn_purge_worklist (FUNCTIONS)
        "admin": (SELECT, INSERT, UPDATE),
        "reader": (SELECT,),
    },
    # Feeds: ingest declares them and records last message times; the sweeper reads them.
    "inturn_feed": {
        "ingest": ALL_DML,
        "sweeper": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    "inturn_feed_sender": {
        "ingest": (SELECT, INSERT, UPDATE),
        "sweeper": (SELECT,),
        "admin": (SELECT,),
        "reader": (SELECT,),
    },
    # spec.replies: the worker records expectations with the delivered mark, ingest answers
    # them with the stored reply; placing and clearing stay with the sweeper (raised_at).
    "inturn_order_expectation": {
        "ingest": (
            Grant("SELECT", ("reply_channel", "key_digest", "answered_at")),
            Grant("UPDATE", ("answered_at", "answered_control_id")),
        ),
        "worker": (INSERT,),
        "sweeper": (SELECT, Grant("UPDATE", ("raised_at",))),
        "admin": (SELECT, DELETE),
        "reader": (Grant("SELECT", but=("order_key", "key_digest")),),
    },
    # The sweeper cancels a booking and withdraws its segments: only those columns (the
    # notice function checks every value it puts into a message all the same).
    "inturn_booking": {
        "sweeper": (SELECT, Grant("UPDATE", ("cancelled_at", "cancel_reason", "updated_at"))),
        "admin": ALL_DML,
        "reader": (SELECT,),
    },
    "inturn_segment": {
        "sweeper": (SELECT, Grant("UPDATE", ("status", "status_changed_at"))),
        "admin": ALL_DML,
        "reader": (SELECT,),
    },
    "inturn_segment_event": {
        "sweeper": (SELECT, INSERT),
        "admin": ALL_DML,
        "reader": (SELECT,),
    },
}


#: Every function of the schema (its signature as ``regprocedure`` prints it) -> the components
#: that may execute it; nobody else may (EXECUTE is revoked from PUBLIC). A function missing
#: here stops :func:`~inturn.worker.store.roles_apply.apply_roles`, as a table missing from
#: :data:`GRANTS` does.
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "inturn_worker_lock(text)": ("worker",),
    "inturn_worker_unlock(text)": ("worker",),
    # whose backend holds a destination's worker lock: a dead holder's lease is taken at once
    "inturn_worker_lock_holder(text)": ("worker",),
    # the resend links (migration 0032): a trigger function, run by inserting a copy, by nobody
    "inturn_link_resend()": (),
    # a day's rows counted as the log and history are written: triggers (migration 0052)
    "inturn_count_log()": (),
    "inturn_count_history()": (),
    # a route set never changes (migration 0048): a trigger function, run by an update, by nobody
    "inturn_route_fixed()": (),
    # ingest stores, the admin resends (the notice function takes it as its owner)
    # (and the worker pulls its destination's messages from the channel log under it)
    "inturn_enqueue_lock(text)": ("ingest", "worker", "admin"),
    # the sweeper's one way to enqueue: a cancelled booking's notice to a carrier (0017)
    "inturn_enqueue_cancel_notice(text,text)": ("sweeper",),
    # the bound on feed senders, a trigger of inturn_feed_sender: nobody calls it (0017)
    "inturn_feed_sender_admit()": (),
    "inturn_purge_lock()": ("purge",),
    "inturn_purge_unlock()": ("purge",),
    "inturn_sweep_lock()": ("sweeper",),
    "inturn_sweep_unlock()": ("sweeper",),
    "inturn_purge_lease(text,double precision)": ("purge",),
    "inturn_purge_release(text,bigint)": ("purge",),
    "inturn_sweep_lease(text,double precision)": ("sweeper",),
    "inturn_sweep_release(text,bigint)": ("sweeper",),
    # inturn local runs as the tables' owner (it migrates), which needs no grant
    "inturn_local_lease(text,double precision)": (),
    "inturn_local_release(text,bigint)": (),
    "inturn_purge_deliveries(text,timestamp with time zone,integer)": ("purge",),
    "inturn_purge_worklist(double precision,integer)": ("purge",),
    "inturn_purge_leases(double precision,integer)": ("purge",),
    # inturn purge --dry-run: what each deleting function would remove (migration 0031)
    "inturn_purge_deliveries_count(text,timestamp with time zone)": ("purge",),
    "inturn_purge_worklist_count(double precision)": ("purge",),
    "inturn_purge_leases_count(double precision)": ("purge",),
    # the maintenance job's partition work (migration 0034): the move of finished rows to
    # history, the epoch's turn with its partitions made ahead, and a day's drop with what is
    # moved out of it first
    "inturn_history_move(double precision,integer)": ("purge",),
    "inturn_history_movable(double precision)": ("purge",),
    "inturn_epoch_prepare(integer)": ("purge",),
    "inturn_epoch_turn(double precision)": ("purge",),
    "inturn_epoch_pull(integer,integer)": ("purge",),
    "inturn_epoch_copy(integer,bigint,integer)": ("purge",),
    "inturn_epoch_keep(integer)": ("purge",),
    "inturn_epoch_detach(integer,integer)": ("purge",),
    "inturn_epoch_drop(integer,integer)": ("purge",),
    # an erasure by patient reaches a day detached and not dropped yet (migration 0035)
    "inturn_erase_detached(text[])": ("admin",),
    # the login's destination scope (migration 0036): every row policy of a worker table calls
    # it as the querying role, so every component may; it tells a session its own scope only
    "inturn_worker_destination()": COMPONENTS,
    # a destination's own worker login, made and dropped with its Destination (migration 0036)
    "inturn_worker_login(text,text)": ("operator", "admin"),
    "inturn_worker_logout(text)": ("operator", "admin"),
    # the channel log's rows a destination has not pulled (migration 0038): depth, status,
    # the console and /metrics count them; its pull without a lease, for people's actions
    # (drain, erasure, resend) and the sweeper, which then act on rows as before
    "inturn_unpulled(text)": ("worker", "operator", "sweeper", "admin", "reader"),
    "inturn_pull_for(text,integer)": ("sweeper", "admin"),
    # a message received again: its latest copy at a destination, in the log or a row (0041)
    "inturn_latest_copy(text,text,text,timestamp with time zone)": ("ingest",),
    # what a destination's lanes hold, keys made anonymous, for those who may not read them
    "inturn_lane_window(text,integer)": ("reader", "operator"),
    # a head's log payload read from its own partition, with its seal binding (migration
    # 0049): the worker's head, next head and take call it as the caller (row policies apply)
    "inturn_log_payload(bigint)": ("worker",),
    # the same read returning a set, the payload decompressed once (migration 0057); the old
    # one stays for the workers of the release before, mid-upgrade
    "inturn_log_payload_rows(bigint)": ("worker",),
    # a restore found: the id sequences moved past the witness's largest ids (migration 0050)
    "inturn_ids_past(bigint,bigint)": ("operator", "admin"),
}

#: The tables the worker role's restrictive row policy covers (``sql/roles.sql``
#: ``worker_policy_<table>``, made by ``--create-roles``): a login scoped to one destination
#: (``inturn_worker_scope``, :func:`~inturn.worker.store.roles_apply.apply_roles`) reaches only
#: that destination's rows of each.
#: On ``inturn_delivery`` a second one (``worker_pull_policy``) lets the worker role (scoped or
#: not) insert only a slim row naming a log message routed to the row's destination (the pull's
#: insertion): no row without a log message, none handing a destination another's message.
WORKER_SCOPED = (
    "inturn_attempt",
    "inturn_cursor",
    "inturn_delivery",
    "inturn_lease",
    "inturn_message",
    "inturn_order_expectation",
    "inturn_sequence",
    "inturn_sequence_number",
    "inturn_worker_sender",
    "inturn_worklist_item",
)

#: The tables the worker role may read but that its row policy does not narrow, and why: none
#: holds a message, a delivery's outcome or anything a worker writes. A table the worker role
#: is granted must be in :data:`WORKER_SCOPED` or here (tests/integration/test_worker_scope.py
#: fails otherwise), so a new table the worker reads cannot be forgotten.
WORKER_UNSCOPED: dict[str, str] = {
    "inturn_destination": "the registry: each Destination's name, channel, hold, schedule and"
    " lanes (read-only; no message, no receiver address)",
    "inturn_route": "route sets: which destinations of a channel a log message goes to"
    " (destination names only; read-only)",
    "inturn_clock": "the database's restore clock: one tick for the whole database (read-only)",
    "inturn_worker_scope": "which login works for which destination: its row policies read"
    " the session's own mapping (read-only; the reader role sees it too)",
    "inturn_role_setting": "the worker role's name, for the same policies (read-only)",
}

#: What the docs say of a function no component may execute, when it is not a trigger.
_NOBODY = {
    f: "– (the tables' owner: inturn local)"
    for f in ("inturn_local_lease(text,double precision)", "inturn_local_release(text,bigint)")
}

#: The server's advisory lock functions on one bigint key (the key space of our locks), revoked
#: from PUBLIC so that only our functions take our keys. The two-key variants lock another
#: key space (the lock tag's fourth field is 2, not 1) and cannot block ours.
ADVISORY_LOCKS = tuple(
    f"pg_catalog.{name}(bigint)"
    for name in (
        "pg_advisory_lock",
        "pg_advisory_lock_shared",
        "pg_try_advisory_lock",
        "pg_try_advisory_lock_shared",
        "pg_advisory_xact_lock",
        "pg_advisory_xact_lock_shared",
        "pg_try_advisory_xact_lock",
        "pg_try_advisory_xact_lock_shared",
    )
)


def _describe(grant: Grant) -> str:
    if grant.columns:
        return f"{grant.privilege} ({', '.join(grant.columns)})"
    if grant.but:
        return f"{grant.privilege} but {', '.join(grant.but)}"
    return grant.privilege


def privilege_tables() -> str:
    """The privileges of :data:`GRANTS` and :data:`FUNCTIONS` as two Markdown tables (table by
    table and column by column, then function by function), for the documentation, which a
    test keeps equal to this text."""
    head = "| table | " + " | ".join(COMPONENTS) + " |"
    lines = [head, "|---" * (len(COMPONENTS) + 1) + "|"]
    for table in sorted(GRANTS):
        cells = [
            "; ".join(_describe(g) for g in GRANTS[table].get(c, ())) or "–" for c in COMPONENTS
        ]
        lines.append(f"| `{table}` | " + " | ".join(cells) + " |")
    lines += ["", "| function | may be executed by |", "|---|---|"]
    for function in sorted(FUNCTIONS):
        who = ", ".join(FUNCTIONS[function]) or _NOBODY.get(
            function, "– (a trigger: fired, never called)"
        )
        lines.append(f"| `{function}` | {who} |")
    return "\n".join(lines) + "\n"


def role_name(component: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The role of ``component``: ``prefix + component``.

    Raises:
        Invalid: an unknown component, or a prefix that is not a lower-case identifier.
    """
    if component not in COMPONENTS:
        raise Invalid(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")
    if not _PREFIX.match(prefix):
        raise Invalid(f"role prefix {prefix!r}: lower-case letters, digits and _ only")
    return prefix + component
