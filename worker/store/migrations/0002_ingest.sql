-- Ingest's duplicate window: one row per message accepted on a channel, keyed by its MSH-10 and
-- a SHA-256 of its bytes exactly as received (the payload itself is not kept here). A sender
-- that lost our ACK and sends the same bytes again finds its row and is acknowledged again
-- without a second copy being queued. Rows older than the window are purged by ingest itself.
CREATE TABLE inturn_received (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel       text        NOT NULL,
    control_id    text        NOT NULL,             -- MSH-10
    digest        bytea       NOT NULL,             -- SHA-256 of the payload (32 bytes)
    size          integer     NOT NULL,             -- bytes
    received_at   timestamptz NOT NULL DEFAULT now()
);

-- The duplicate check (a second copy inside the window conflicts on it and is not stored),
-- and by its prefix "the same MSH-10 with other bytes".
CREATE UNIQUE INDEX inturn_received_key ON inturn_received (channel, control_id, digest);
-- The purge: oldest first.
CREATE INDEX inturn_received_at ON inturn_received (received_at);
