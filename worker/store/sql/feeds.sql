-- Named queries of the feeds: ingest declares them and records when each last received a
-- message (from memory, one statement per flush); the sweeper's feed-silent rule reads them.

-- name: declare
-- Upsert the declared feeds; a changed declaration keeps its last message time.
INSERT INTO inturn_feed AS f (channel, silent_after_seconds, per_sender, schedule)
SELECT c, s, p, sc
  FROM unnest(%(channels)s::text[], %(silent_after)s::int[], %(per_sender)s::bool[],
              %(schedules)s::jsonb[]) AS t(c, s, p, sc)
ON CONFLICT (channel) DO UPDATE
   SET silent_after_seconds = excluded.silent_after_seconds,
       per_sender = excluded.per_sender,
       schedule = excluded.schedule
 WHERE (f.silent_after_seconds, f.per_sender, f.schedule)
       IS DISTINCT FROM (excluded.silent_after_seconds, excluded.per_sender, excluded.schedule);

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
-- The latest message time per channel and sender of per-sender feeds.
INSERT INTO inturn_feed_sender AS s (channel, sender, first_message_at, last_message_at)
SELECT t.channel, t.sender, t.at, t.at
  FROM unnest(%(channels)s::text[], %(senders)s::text[], %(ats)s::timestamptz[])
       AS t(channel, sender, at)
  JOIN inturn_feed f ON f.channel = t.channel AND f.per_sender
ON CONFLICT (channel, sender) DO UPDATE
   SET last_message_at = greatest(s.last_message_at, excluded.last_message_at);
