-- Named queries of the sweeper's delivery rules (its lock is in locks.sql, key in locks.py). Each block starts with
-- "-- name: <query_name>". Due-date conditions are here, in database time (now()), and each
-- due query returns the most overdue first, at most %(limit)s rows: above the limit the least
-- urgent wait for the next run. Every scan goes through the pending-head index
-- (inturn_delivery_head), so its cost follows what is due, not the size of the table.

-- name: behind
-- Destinations with a message of their channel's log routed to them and not pulled for at
-- least %(seconds)s seconds (inturn_unpulled, migration 0038): a worker that is stopped,
-- missing or far behind. The sweeper pulls for them, so that its rules (stuck, orphaned,
-- expired) judge those messages as rows. Oldest first, at most %(limit)s.
SELECT destination, pending, oldest
  FROM inturn_unpulled(NULL)
 WHERE oldest <= now() - make_interval(secs => %(seconds)s)
 ORDER BY oldest, destination
 LIMIT %(limit)s;

-- name: stuck_due
-- Live destinations whose head (oldest pending message) has waited at least their threshold.
-- With lanes (d.lanes > 1) the oldest pending message holds only what must wait for it (its
-- patient's later messages, the merges and barriers naming it): it is stuck all the same.
-- A destination with a delivery window (spec.schedule) is judged only while its window is open,
-- and its head's wait counts from the later of its enqueue and the window's opening: %(schedules)s
-- lists the schedules open now and %(since)s when each opened (NULL: open at all times), as
-- inturn.worker.spec.schedule computes them (time zones and DST are Python's).
WITH win AS (
    SELECT w.schedule, w.since
      FROM unnest(%(schedules)s::jsonb[], %(since)s::timestamptz[]) AS w(schedule, since)
)
SELECT d.destination, d.stuck_after_seconds, d.suspended, d.lanes,
       h.id AS head_id, h.enqueued_at, h.attempts, h.last_error,
       extract(epoch FROM now() - h.enqueued_at)::float8 AS waiting_seconds
  FROM inturn_destination d
  LEFT JOIN win ON win.schedule = d.schedule
 CROSS JOIN LATERAL (
       SELECT id, enqueued_at, attempts, last_error
         FROM inturn_delivery x
        WHERE x.destination = d.destination AND x.state = 'pending'
        ORDER BY x.id
        LIMIT 1) h
 WHERE d.deleted_at IS NULL
   AND (d.schedule IS NULL OR win.schedule IS NOT NULL)
   AND greatest(h.enqueued_at, win.since) <= now() - make_interval(secs => d.stuck_after_seconds)
 ORDER BY greatest(h.enqueued_at, win.since) + make_interval(secs => d.stuck_after_seconds),
          d.destination
 LIMIT %(limit)s;

-- name: stuck_stale
-- Pending destination-stuck items whose destination is no longer stuck: its head is within
-- its threshold, nothing is pending, its delivery window is closed (it is held on purpose),
-- or it is not registered any more (then it is orphaned).
WITH win AS (
    SELECT w.schedule, w.since
      FROM unnest(%(schedules)s::jsonb[], %(since)s::timestamptz[]) AS w(schedule, since)
)
SELECT w.record_key
  FROM inturn_worklist_item w
 WHERE w.queue = %(queue)s AND w.reason = %(reason)s AND w.state = 'pending'
   AND w.record_kind = 'destination'
   AND NOT EXISTS (
       SELECT 1
         FROM inturn_destination d
         LEFT JOIN win ON win.schedule = d.schedule
        CROSS JOIN LATERAL (
              SELECT enqueued_at FROM inturn_delivery x
               WHERE x.destination = d.destination AND x.state = 'pending'
               ORDER BY x.id LIMIT 1) h
        WHERE d.destination = w.record_key AND d.deleted_at IS NULL
          AND (d.schedule IS NULL OR win.schedule IS NOT NULL)
          AND greatest(h.enqueued_at, win.since)
              <= now() - make_interval(secs => d.stuck_after_seconds))
 ORDER BY w.id
 LIMIT %(limit)s;

-- name: schedules
-- The distinct delivery windows of live destinations (few: most share one or have none).
SELECT DISTINCT schedule FROM inturn_destination
 WHERE deleted_at IS NULL AND schedule IS NOT NULL;

-- name: now
SELECT now() AS now;

-- name: orphaned_due
-- Destinations with pending messages and no live registration, oldest head first. The
-- recursive walk visits each destination once on the pending-head index (a loose index scan).
WITH RECURSIVE dest AS (
    (SELECT destination FROM inturn_delivery
      WHERE state = 'pending' ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT (SELECT x.destination FROM inturn_delivery x
             WHERE x.state = 'pending' AND x.destination > dest.destination
             ORDER BY x.destination LIMIT 1)
      FROM dest
     WHERE dest.destination IS NOT NULL
)
SELECT dest.destination, h.id AS head_id, h.enqueued_at,
       extract(epoch FROM now() - h.enqueued_at)::float8 AS waiting_seconds,
       r.deleted_at
  FROM dest
 CROSS JOIN LATERAL (
       SELECT id, enqueued_at FROM inturn_delivery x
        WHERE x.destination = dest.destination AND x.state = 'pending'
        ORDER BY x.id LIMIT 1) h
  LEFT JOIN inturn_destination r ON r.destination = dest.destination
 WHERE dest.destination IS NOT NULL
   AND (r.destination IS NULL OR r.deleted_at IS NOT NULL)
 ORDER BY h.enqueued_at, dest.destination
 LIMIT %(limit)s;

-- name: orphaned_stale
-- Pending orphaned-queue items whose destination is registered again or has nothing pending.
SELECT w.record_key
  FROM inturn_worklist_item w
 WHERE w.queue = %(queue)s AND w.reason = %(reason)s AND w.state = 'pending'
   AND w.record_kind = 'destination'
   AND (EXISTS (SELECT 1 FROM inturn_destination d
                 WHERE d.destination = w.record_key AND d.deleted_at IS NULL)
        OR NOT EXISTS (SELECT 1 FROM inturn_delivery x
                        WHERE x.destination = w.record_key AND x.state = 'pending'))
 ORDER BY w.id
 LIMIT %(limit)s;

-- name: expired_due
-- Pending messages older than their live destination's expireAfterSeconds, most overdue first.
-- Per destination the walk starts at the head and stops at the first message not yet expired
-- (messages are pending in enqueue order), so it reads what is due and one row more.
WITH RECURSIVE walk AS (
    SELECT d.destination, d.expire_after_seconds, h.id, h.enqueued_at, 1 AS n
      FROM inturn_destination d
     CROSS JOIN LATERAL (
           SELECT id, enqueued_at FROM inturn_delivery x
            WHERE x.destination = d.destination AND x.state = 'pending'
            ORDER BY x.id LIMIT 1) h
     WHERE d.deleted_at IS NULL AND d.expire_after_seconds IS NOT NULL
       AND h.enqueued_at <= now() - make_interval(secs => d.expire_after_seconds)
    UNION ALL
    SELECT w.destination, w.expire_after_seconds, nx.id, nx.enqueued_at, w.n + 1
      FROM walk w
     CROSS JOIN LATERAL (
           SELECT id, enqueued_at FROM inturn_delivery x
            WHERE x.destination = w.destination AND x.state = 'pending' AND x.id > w.id
            ORDER BY x.id LIMIT 1) nx
     WHERE w.n < %(limit)s
       AND nx.enqueued_at <= now() - make_interval(secs => w.expire_after_seconds)
)
SELECT destination, expire_after_seconds, id, enqueued_at
  FROM walk
 ORDER BY enqueued_at + make_interval(secs => expire_after_seconds), id
 LIMIT %(limit)s;

-- name: expire_skip
-- Skip expired messages that are still pending (one batch, in the caller's transaction).
UPDATE inturn_delivery
   SET state = 'skipped', decided_by = %(who)s, finished_at = clock_timestamp(),
       reason = coalesce(reason, 'expired')
 WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
RETURNING id, destination, channel, control_id, message_type, attempts, enqueued_at;

-- name: pending_keys
-- Which of these records already have a pending item (a dry run's "already there").
SELECT record_key
  FROM inturn_worklist_item
 WHERE queue = %(queue)s AND reason = %(reason)s AND record_kind = %(record_kind)s
   AND record_key = ANY(%(record_keys)s::text[]) AND state = 'pending';
