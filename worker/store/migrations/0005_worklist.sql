-- Worklists: items of work for people (or robots), each "record K needs attention on queue Q
-- for reason R". Items survive being worked: clearing sets who, when and a note, and only purge
-- deletes cleared items after their retention. Details are small JSON and never a payload.
CREATE TABLE inturn_worklist_item (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL,             -- e.g. "delivery-failed"
    record_kind  text        NOT NULL,             -- what the key names: delivery, destination, booking
    record_key   text        NOT NULL,             -- e.g. a delivery id, "namespace/name", a locator
    reason       text        NOT NULL,             -- stable reason code, e.g. "destination-stuck"
    details      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    placed_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    placed_by    text        NOT NULL,
    state        text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'cleared')),
    cleared_at   timestamptz,
    cleared_by   text,
    note         text,
    CHECK ((state = 'pending') = (cleared_at IS NULL)),
    CHECK (state = 'pending' OR (cleared_by IS NOT NULL AND note IS NOT NULL))
);

-- One pending item per (queue, record, reason): placement is INSERT ... ON CONFLICT on exactly
-- this index, so the ON CONFLICT clause repeats its predicate.
CREATE UNIQUE INDEX inturn_worklist_pending_key
    ON inturn_worklist_item (queue, record_kind, record_key, reason) WHERE state = 'pending';
-- Listing a queue (newest or oldest first, keyset on id) and counting what is pending.
CREATE INDEX inturn_worklist_queue ON inturn_worklist_item (queue, state, id);
-- Everything about one record, across queues: a show's history and clearing by record.
CREATE INDEX inturn_worklist_record ON inturn_worklist_item (record_kind, record_key, id);
-- The purge: cleared items by age.
CREATE INDEX inturn_worklist_cleared ON inturn_worklist_item (cleared_at) WHERE state = 'cleared';
