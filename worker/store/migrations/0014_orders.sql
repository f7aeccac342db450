-- Orders and their replies (spec.replies). The registry carries each Destination's expectation
-- rules, so that ingest knows which messages of a channel are replies and to whom.
ALTER TABLE inturn_destination ADD COLUMN replies jsonb;

-- One row per delivered order and key: written by the worker in the transaction that marks the
-- order delivered, answered by ingest in the transaction that stores the reply. The key is
-- matched by its digest (inturn.worker.spec.replies.key_digest, like the patient identifier
-- index) and kept in clear only to be shown on the worklist; erasing the order's message erases
-- its rows. The sweeper's unanswered-order rule reads them; placing and clearing stay with it.
CREATE TABLE inturn_order_expectation (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination         text        NOT NULL,
    delivery_id         bigint      NOT NULL,   -- the order's inturn_delivery row
    control_id          text        NOT NULL,   -- the order's MSH-10
    message_type        text        NOT NULL,   -- the order's MSH-9
    order_key           text        NOT NULL,   -- the matching key (e.g. ORC-2.1)
    key_digest          text        NOT NULL,   -- 32 hex digits: destination, NUL, key
    reply_channel       text        NOT NULL,
    reply_types         text[]      NOT NULL,
    delivered_at        timestamptz NOT NULL DEFAULT now(),
    due_at              timestamptz NOT NULL,
    answered_at         timestamptz,
    answered_control_id text,                   -- the reply's MSH-10
    raised_at           timestamptz             -- when the sweeper placed it on a worklist
);
-- The sweeper: open expectations not yet raised, by due time (most overdue first, bounded):
-- the scan reads what is due and one row more, however many were raised before.
CREATE INDEX inturn_order_expectation_due
    ON inturn_order_expectation (due_at) WHERE answered_at IS NULL AND raised_at IS NULL;
-- Ingest: a reply's keys on its channel, among the open expectations.
CREATE INDEX inturn_order_expectation_key
    ON inturn_order_expectation (reply_channel, key_digest) WHERE answered_at IS NULL;
-- Erasure: the rows of an erased order.
CREATE INDEX inturn_order_expectation_delivery ON inturn_order_expectation (delivery_id);
