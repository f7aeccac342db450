-- Named queries of the feeds: ingest declares them and records when each last received a
-- message (from memory, one statement per flush); the sweeper's feed-silent rule reads them.

-- name: declare
-- Upsert the declared feeds; a changed declaration keeps its last message time. max_senders is
-- the bound the table itself keeps on a per-sender feed's senders (migration 0017).
INSERT INTO inturn_feed AS f (channel, silent_after_seconds, per_sender, schedule, max_senders)
SELECT c, s, p, sc, m
  FROM unnest(%(channels)s::text[], %(silent_after)s::int[], %(per_sender)s::bool[],
              %(schedules)s::jsonb[], %(max_senders)s::int[]) AS t(c, s, p, sc, m)
ON CONFLICT (channel) DO UPDATE
   SET silent_after_seconds = excluded.silent_after_seconds,
       per_sender = excluded.per_sender,
       schedule = excluded.schedule,
       max_senders = excluded.max_senders
 WHERE (f.silent_after_seconds, f.per_sender, f.schedule, f.max_senders)
       IS DISTINCT FROM (excluded.silent_after_seconds, excluded.per_sender, excluded.schedule,
                         excluded.max_senders);

-- name: undeclare
-- Feeds no longer declared go, with their senders (the sweeper clears their items).
DELETE FROM inturn_feed WHERE NOT (channel = ANY (%(channels)s::text[]));

-- name: seen_channels
-- The latest message time per channel (only ever moves forward).
UPDATE inturn_feed f
   SET last_message_at = greatest(f.last_message_at, t.at)
  FROM unnest(%(channels)s::text[], %(ats)s::timestamptz[]) AS t(channel, at)
 WHERE f.channel = t.channel;

-- name: seen_senders
-- The latest message time and the message count per channel and sender of per-sender feeds.
-- A new sender over its channel's max_senders is not inserted (the trigger of migration 0017
-- decides, under a lock of the feed's row, and may give a noise sender's place to it); the rows
-- written are returned, so the caller counts the refused ones.
INSERT INTO inturn_feed_sender AS s (channel, sender, first_message_at, last_message_at, messages)
SELECT t.channel, t.sender, t.at, t.at, t.n
  FROM unnest(%(channels)s::text[], %(senders)s::text[], %(ats)s::timestamptz[],
              %(counts)s::bigint[]) AS t(channel, sender, at, n)
  JOIN inturn_feed f ON f.channel = t.channel AND f.per_sender
 ORDER BY t.channel,  -- known senders first: a newcomer never evicts one heard in this flush
          NOT EXISTS (SELECT 1 FROM inturn_feed_sender x
                       WHERE x.channel = t.channel AND x.sender = t.sender),
          t.sender
ON CONFLICT (channel, sender) DO UPDATE
   SET last_message_at = greatest(s.last_message_at, excluded.last_message_at),
       messages = s.messages + excluded.messages
RETURNING s.channel, s.sender;
