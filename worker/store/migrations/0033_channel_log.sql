-- The channel log (issue 43, "stored once, delivered to many"; docs/explanation/storage-layout.md).
--
-- A message is stored once, in its channel's log `inturn_message`, with the set of destinations
-- that take it (`inturn_route`); each destination's worker pulls the log rows past its cursor
-- (`inturn_cursor`) into slim rows of `inturn_delivery` that name the log row (`message_id`)
-- and hold no payload of their own. The log is partitioned by ranges of its ids, one range an
-- epoch (`inturn_epoch`; the retention work of issue 37 turns and drops them): epoch 1 is
-- [1, 2^40), so a database whose epochs are never turned still takes every id.
--
-- Online: new tables, and on `inturn_delivery` three nullable columns without a default and
-- payload made nullable: catalog changes only, no rewrite, no scan; the ACCESS EXCLUSIVE lock
-- they take lasts as long as the catalog update. The rows stored before keep their payload and
-- their seal binding (NULL binding: the row's own id and destination, as they were sealed), and
-- are delivered as they are.

-- A route set: the destinations (sorted, "namespace/name") of one channel that take a message.
CREATE TABLE inturn_route (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel       text   NOT NULL,
    destinations  text[] NOT NULL,
    UNIQUE (channel, destinations)
);

-- Epochs: id ranges of the log, one partition each. Only epoch 1 here; issue 37 adds the rest.
CREATE TABLE inturn_epoch (
    n          integer     PRIMARY KEY,
    lo         bigint      NOT NULL,
    hi         bigint      NOT NULL,
    opened_at  timestamptz NOT NULL DEFAULT now(),
    closed_at  timestamptz,
    CHECK (lo < hi)
);
INSERT INTO inturn_epoch (n, lo, hi) VALUES (1, 1, 1099511627776);

-- The log. Its ids come from its own sequence, drawn under the channel's enqueue lock (ingest):
-- on one channel, id order is commit order, which the cursors rely on.
CREATE TABLE inturn_message (
    id            bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME inturn_message_id_seq),
    channel       text        NOT NULL,
    control_id    text        NOT NULL,            -- MSH-10
    message_type  text        NOT NULL,            -- MSH-9
    payload       bytea       NOT NULL,            -- as received, or sealed once (scope channel)
    size          integer     NOT NULL,            -- bytes as received
    patient_keys  text[],                          -- the identifier index keys (migration 0004)
    traceparent   text,
    route         integer     NOT NULL,            -- inturn_route.id
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    seal_id       bigint,                          -- a row sealed under another binding
    seal_scope    text,                            -- (a legacy row's payload): NULL, own id
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);

CREATE TABLE inturn_message_e1 PARTITION OF inturn_message FOR VALUES FROM (1) TO (1099511627776);

-- Per partition (created on each partition by the parent's definition): a channel's log in
-- order (the pull), MSH-10 lookups and the duplicate window, patient lookups and erasure.
CREATE INDEX inturn_message_channel ON inturn_message (channel, id);
CREATE INDEX inturn_message_control_id ON inturn_message USING hash (control_id);
CREATE INDEX inturn_message_patient ON inturn_message USING gin (patient_keys);

-- Where each destination's pull has reached in its channel's log (ids <= position are pulled).
CREATE TABLE inturn_cursor (
    destination  text   PRIMARY KEY,
    channel      text   NOT NULL,
    position     bigint NOT NULL DEFAULT 0
);

-- The slim row: its message in the log, and the binding a payload of its own was sealed with.
ALTER TABLE inturn_delivery ADD COLUMN message_id bigint;
ALTER TABLE inturn_delivery ADD COLUMN seal_id bigint;
ALTER TABLE inturn_delivery ADD COLUMN seal_scope text;
ALTER TABLE inturn_delivery ALTER COLUMN payload DROP NOT NULL;
