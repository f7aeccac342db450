-- The sweeper's feeds pack: feed-silent. %(schedules)s lists the schedules open now and
-- %(since)s when each opened (NULL: open at all times), judged in Python
-- (inturn.worker.worklist.windows); a feed whose schedule is not listed is outside its busy
-- hours and is not judged. A feed is silent from the later of its last message (or, never
-- having had one, its declaration or first message) and the opening of its current window.

-- name: silent_due
-- Silent feeds, most overdue first. An item placed since the silence began (pending, or
-- cleared by a person) is not placed again for the same silence.
WITH win AS (
    SELECT w.schedule, w.since
      FROM unnest(%(schedules)s::jsonb[], %(since)s::timestamptz[]) AS w(schedule, since)
),
feed AS (
    SELECT f.channel, ''::text AS sender, f.channel AS record_key, f.last_message_at,
           coalesce(f.last_message_at, f.declared_at) AS heard, f.silent_after_seconds,
           f.schedule
      FROM inturn_feed f
    UNION ALL
    SELECT s.channel, s.sender, s.channel || '/' || s.sender, s.last_message_at,
           s.last_message_at, f.silent_after_seconds, f.schedule
      FROM inturn_feed f
      JOIN inturn_feed_sender s ON s.channel = f.channel
     WHERE f.per_sender AND s.messages > 1  -- a sender seen once is noise, never a feed
),
quiet AS (
    SELECT x.*, greatest(x.heard, win.since) AS quiet_since
      FROM feed x
      LEFT JOIN win ON win.schedule = x.schedule
     WHERE x.schedule IS NULL OR win.schedule IS NOT NULL
)
SELECT q.channel, q.sender, q.record_key, q.last_message_at, q.silent_after_seconds,
       q.quiet_since, extract(epoch FROM now() - q.quiet_since)::float8 AS silent_seconds
  FROM quiet q
 WHERE q.quiet_since <= now() - make_interval(secs => q.silent_after_seconds)
   AND NOT EXISTS (
       SELECT 1 FROM inturn_worklist_item w
        WHERE w.record_kind = 'feed' AND w.record_key = q.record_key
          AND w.queue = 'feeds' AND w.reason = 'feed-silent'
          AND (w.state = 'pending' OR w.placed_at >= q.quiet_since))
 ORDER BY q.quiet_since + make_interval(secs => q.silent_after_seconds), q.record_key
 LIMIT %(limit)s;

-- name: silent_stale
-- Pending feed-silent items whose feed is not silent any more, with why.
WITH win AS (
    SELECT w.schedule, w.since
      FROM unnest(%(schedules)s::jsonb[], %(since)s::timestamptz[]) AS w(schedule, since)
),
feed AS (
    SELECT f.channel AS record_key, coalesce(f.last_message_at, f.declared_at) AS heard,
           f.silent_after_seconds, f.schedule
      FROM inturn_feed f
    UNION ALL
    SELECT s.channel || '/' || s.sender, s.last_message_at, f.silent_after_seconds, f.schedule
      FROM inturn_feed f
      JOIN inturn_feed_sender s ON s.channel = f.channel
     WHERE f.per_sender AND s.messages > 1
)
SELECT w.record_key,
       CASE WHEN x.record_key IS NULL AND EXISTS (
                     SELECT 1 FROM inturn_feed_sender n
                      WHERE n.channel || '/' || n.sender = w.record_key)
                 THEN 'a sender seen only once (noise, not a feed)'
            WHEN x.record_key IS NULL THEN 'the feed is no longer declared'
            WHEN x.schedule IS NOT NULL AND win.schedule IS NULL
                 THEN 'outside its busy hours (schedule)'
            ELSE 'messages flow again' END AS why
  FROM inturn_worklist_item w
  LEFT JOIN feed x ON x.record_key = w.record_key
  LEFT JOIN win ON win.schedule = x.schedule
 WHERE w.state = 'pending' AND w.queue = 'feeds' AND w.reason = 'feed-silent'
   AND w.record_kind = 'feed'
   AND (x.record_key IS NULL
        OR (x.schedule IS NOT NULL AND win.schedule IS NULL)
        OR greatest(x.heard, win.since) > now() - make_interval(secs => x.silent_after_seconds))
 ORDER BY w.id
 LIMIT %(limit)s;

-- name: schedules
-- The distinct schedules of the declared feeds.
SELECT DISTINCT schedule FROM inturn_feed WHERE schedule IS NOT NULL;

-- name: pending_count
SELECT count(*) AS n FROM inturn_worklist_item
 WHERE state = 'pending' AND queue = 'feeds' AND reason = 'feed-silent';

-- name: now
SELECT now() AS now;

-- name: overview
-- Every declared feed and each sender of per-sender feeds heard more than once (one heard once
-- is noise, not a feed), for the console and the CLI.
SELECT f.channel, ''::text AS sender, f.last_message_at, f.declared_at,
       f.silent_after_seconds, f.schedule, f.per_sender
  FROM inturn_feed f
UNION ALL
SELECT s.channel, s.sender, s.last_message_at, s.first_message_at, f.silent_after_seconds,
       f.schedule, true
  FROM inturn_feed f JOIN inturn_feed_sender s ON s.channel = f.channel
 WHERE f.per_sender AND s.messages > 1
 ORDER BY 1, 2;
