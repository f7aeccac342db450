-- The delivery queue: one row per message and destination. The identity column is the order.
-- Retry bookkeeping (attempts, next_attempt, last_attempt, last_error, reason) is deliberately
-- absent from every index so that a failed attempt's UPDATE can stay heap-only (HOT).
CREATE TABLE inturn_delivery (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination   text        NOT NULL,            -- "namespace/name"
    channel       text        NOT NULL,
    control_id    text        NOT NULL,            -- MSH-10
    message_type  text        NOT NULL,            -- MSH-9, e.g. "ADT^A01"
    payload       bytea       NOT NULL,            -- the bytes exactly as received
    size          integer     NOT NULL,            -- bytes
    state         text        NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'delivered', 'failed', 'skipped')),
    attempts      integer     NOT NULL DEFAULT 0,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    next_attempt  timestamptz NOT NULL DEFAULT now(),
    last_attempt  timestamptz,
    last_error    text,
    reason        text,                            -- the first failure's cause, never overwritten
    decided_by    text,                            -- who skipped, drained or resent
    finished_at   timestamptz,
    CHECK ((state = 'pending') = (finished_at IS NULL))
) WITH (fillfactor = 85,
        autovacuum_vacuum_scale_factor = 0,
        autovacuum_vacuum_threshold = 1000);

-- The head of a destination: same cost with 100 or 1,000,000 rows waiting.
CREATE INDEX inturn_delivery_head ON inturn_delivery (destination, id) WHERE state = 'pending';
-- Purge: finished rows by age.
CREATE INDEX inturn_delivery_finished ON inturn_delivery (finished_at) WHERE state <> 'pending';
-- Listing one destination's items newest first, whatever their state.
CREATE INDEX inturn_delivery_destination ON inturn_delivery (destination, id DESC);
-- Failed items stay until someone removes them: counted per destination by depth().
CREATE INDEX inturn_delivery_failed ON inturn_delivery (destination) WHERE state = 'failed';

-- Every decision a person (or the purge) took: who, when, what, which items and why. Never a payload.
CREATE TABLE inturn_audit (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    who          text        NOT NULL,
    action       text        NOT NULL,   -- skip, drain, erase, retry-now, resend, remove
    destination  text,
    item_ids     bigint[]    NOT NULL DEFAULT '{}',
    why          text
);
CREATE INDEX inturn_audit_at ON inturn_audit (at);

-- The destination registry: written by the operator (or `inturn local`), read by ingest for routing.
CREATE TABLE inturn_destination (
    destination    text        PRIMARY KEY,       -- "namespace/name"
    namespace      text        NOT NULL,
    name           text        NOT NULL,
    channel        text        NOT NULL,
    message_types  text[]      NOT NULL DEFAULT '{}',  -- patterns on MSH-9.1^MSH-9.2; empty = all
    generation     bigint      NOT NULL DEFAULT 0,
    suspended      boolean     NOT NULL DEFAULT false,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    deleted_at     timestamptz
);
CREATE INDEX inturn_destination_channel ON inturn_destination (channel) WHERE deleted_at IS NULL;
