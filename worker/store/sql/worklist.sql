-- Named queries of the worklists. Each block starts with "-- name: <query_name>".
-- Parameters use psycopg's %(name)s style. Loaded by inturn.worker.store.worklist.

-- name: place
-- The conflict target repeats the partial unique index's predicate (state = 'pending'); without
-- it Postgres finds no matching arbiter index. A conflict returns no row: the item was there.
INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, details, placed_by)
VALUES (%(queue)s, %(record_kind)s, %(record_key)s, %(reason)s, %(details)s::jsonb,
        %(placed_by)s)
ON CONFLICT (queue, record_kind, record_key, reason) WHERE state = 'pending' DO NOTHING
RETURNING id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
          cleared_at, cleared_by, note;

-- name: place_many
-- place for many items in one statement (arrays of equal length, one element per item).
INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, details, placed_by)
SELECT q, k, r_key, r, d, p
  FROM unnest(%(queues)s::text[], %(record_kinds)s::text[], %(record_keys)s::text[],
              %(reasons)s::text[], %(details)s::jsonb[], %(placed_by)s::text[])
       AS t(q, k, r_key, r, d, p)
ON CONFLICT (queue, record_kind, record_key, reason) WHERE state = 'pending' DO NOTHING
RETURNING id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
          cleared_at, cleared_by, note;

-- name: pending_many
SELECT id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
       cleared_at, cleared_by, note
  FROM inturn_worklist_item
  JOIN unnest(%(queues)s::text[], %(record_kinds)s::text[], %(record_keys)s::text[],
              %(reasons)s::text[]) AS t(q, k, r_key, r)
    ON queue = q AND record_kind = k AND record_key = r_key AND reason = r
 WHERE state = 'pending';

-- name: pending_one
SELECT id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
       cleared_at, cleared_by, note
  FROM inturn_worklist_item
 WHERE queue = %(queue)s AND record_kind = %(record_kind)s AND record_key = %(record_key)s
   AND reason = %(reason)s AND state = 'pending';

-- name: get
SELECT id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
       cleared_at, cleared_by, note
  FROM inturn_worklist_item WHERE id = %(id)s;

-- name: record_history
-- Every item, on any queue, for one record: the history a show prints.
SELECT id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
       cleared_at, cleared_by, note
  FROM inturn_worklist_item
 WHERE record_kind = %(record_kind)s AND record_key = %(record_key)s
 ORDER BY id;

-- name: clear
UPDATE inturn_worklist_item
   SET state = 'cleared', cleared_at = clock_timestamp(), cleared_by = %(who)s, note = %(note)s
 WHERE id = %(id)s AND state = 'pending'
RETURNING id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
          cleared_at, cleared_by, note;

-- name: clear_where
-- A system clear: the pending items of some records, optionally only on one queue or reason.
UPDATE inturn_worklist_item
   SET state = 'cleared', cleared_at = clock_timestamp(), cleared_by = %(who)s, note = %(note)s
 WHERE state = 'pending'
   AND record_kind = %(record_kind)s
   AND record_key = ANY(%(record_keys)s::text[])
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
RETURNING id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
          cleared_at, cleared_by, note;

-- name: list_oldest
-- Oldest first; the cursor is the last id of the previous page (0 for the first).
SELECT id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
       cleared_at, cleared_by, note
  FROM inturn_worklist_item
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(record_kind)s::text IS NULL OR record_kind = %(record_kind)s::text)
   AND (%(record_key)s::text IS NULL OR record_key = %(record_key)s::text)
   AND (%(placed_from)s::timestamptz IS NULL OR placed_at >= %(placed_from)s::timestamptz)
   AND (%(placed_to)s::timestamptz IS NULL OR placed_at < %(placed_to)s::timestamptz)
   AND id > coalesce(%(cursor)s::bigint, 0)
 ORDER BY id
 LIMIT %(limit)s;

-- name: list_newest
-- Newest first; the cursor is the last id of the previous page (NULL for the first).
SELECT id, queue, record_kind, record_key, reason, details, placed_at, placed_by, state,
       cleared_at, cleared_by, note
  FROM inturn_worklist_item
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(record_kind)s::text IS NULL OR record_kind = %(record_kind)s::text)
   AND (%(record_key)s::text IS NULL OR record_key = %(record_key)s::text)
   AND (%(placed_from)s::timestamptz IS NULL OR placed_at >= %(placed_from)s::timestamptz)
   AND (%(placed_to)s::timestamptz IS NULL OR placed_at < %(placed_to)s::timestamptz)
   AND (%(cursor)s::bigint IS NULL OR id < %(cursor)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: count
-- Items per queue and reason in one state (pending unless told otherwise).
SELECT queue, reason, count(*) AS items, min(placed_at) AS oldest
  FROM inturn_worklist_item
 WHERE state = %(state)s
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
 GROUP BY queue, reason
 ORDER BY queue, reason;

-- name: purge_batch
-- One batch of items cleared longer ago than the retention (database time), in one short
-- transaction, deleted by the function of migration 0011 (never a pending one; the purge role
-- may call it, and has no DELETE of its own).
SELECT id FROM inturn_purge_worklist(%(older_than_seconds)s, %(batch)s) AS deleted(id);

-- name: purge_count
-- What purge_batch would remove, all batches together (inturn purge --dry-run; migration 0031).
SELECT inturn_purge_worklist_count(%(older_than_seconds)s) AS n;

-- name: announce
-- A new item's notification on the publisher's channel (worklist publisher "notify").
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: now
SELECT now() AS now;
