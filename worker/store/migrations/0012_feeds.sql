-- Feeds: channels that are expected to be busy. Declared by ingest from its --feeds file (the
-- sweeper's feed-silent rule reads them); last_message_at is written by ingest from memory,
-- one upsert per channel and sender per flush interval, never per message.
CREATE TABLE inturn_feed (
    channel              text        PRIMARY KEY,
    silent_after_seconds integer     NOT NULL CHECK (silent_after_seconds > 0),
    per_sender           boolean     NOT NULL DEFAULT false,
    schedule             jsonb,                    -- when it should be busy; NULL: always
    declared_at          timestamptz NOT NULL DEFAULT now(),
    last_message_at      timestamptz               -- NULL: nothing received since declared
);

-- The senders (MSH-3.1^MSH-4.1) of a per-sender feed, each a feed of its own once seen.
CREATE TABLE inturn_feed_sender (
    channel          text        NOT NULL REFERENCES inturn_feed ON DELETE CASCADE,
    sender           text        NOT NULL CHECK (length(sender) <= 180),
    first_message_at timestamptz NOT NULL,
    last_message_at  timestamptz NOT NULL,
    PRIMARY KEY (channel, sender)
);
