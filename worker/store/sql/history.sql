-- Named queries of history and retention (migration 0034; inturn.worker.store.history): the
-- maintenance job's calls of its functions, and what the readers of its state need.

-- name: lock_timeout
-- The longest this transaction's statements wait for a lock (milliseconds), so that the job
-- never holds others up for longer (they queue behind a lock it waits for).
SELECT set_config('lock_timeout', %(ms)s::text || 'ms', true) AS lock_timeout;

-- name: now
SELECT clock_timestamp() AS now;

-- name: epochs
-- Every epoch, oldest first: its id range, when it was opened and closed, and what became of
-- its partitions.
SELECT n, lo, hi, opened_at, closed_at, detached_at, dropped_at
  FROM inturn_epoch
 ORDER BY n;

-- name: move
-- One batch of the hot window's move (inturn_history_move): finished rows older than
-- hot_seconds into history, at most "batch" (<= 5,000).
SELECT inturn_history_move(%(hot_seconds)s, %(batch)s) AS moved;

-- name: movable
-- What the move would take now, all batches together (inturn purge --dry-run).
SELECT inturn_history_movable(%(hot_seconds)s) AS n;

-- name: prepare
-- The next epoch's partitions created ahead (0: they were).
SELECT inturn_epoch_prepare(%(lock_ms)s) AS n;

-- name: turn
-- The epoch turned when the open one is older than epoch_seconds (0: not yet).
SELECT inturn_epoch_turn(%(epoch_seconds)s) AS n;

-- name: pull_behind
-- One batch of a pull for one destination whose cursor is behind in the epoch (no row: none).
SELECT destination, pulled FROM inturn_epoch_pull(%(epoch)s, %(limit)s);

-- name: copy
-- One keyset page of the hot table: its rows reading their payload from the epoch's log get
-- a copy of their own.
SELECT last_id, copied FROM inturn_epoch_copy(%(epoch)s, %(after)s, %(batch)s);

-- name: keep
-- The epoch's history rows a person still needs, back to the hot table.
SELECT inturn_epoch_keep(%(epoch)s) AS back;

-- name: detach
SELECT inturn_epoch_detach(%(epoch)s, %(lock_ms)s) AS done;

-- name: drop
-- No row, or NULL counts, when the epoch is not detached or a hot row still needs its log.
SELECT log_rows, history_rows, bytes FROM inturn_epoch_drop(%(epoch)s, %(lock_ms)s);

-- name: record
-- What the job was told and when it ran (one row), for the readers' alerts.
INSERT INTO inturn_maintenance AS m
       (one, retention_seconds, epoch_seconds, hot_seconds, ran_at, turned_at, dropped_at)
VALUES (true, %(retention_seconds)s, %(epoch_seconds)s, %(hot_seconds)s, clock_timestamp(),
        CASE WHEN %(turned)s THEN clock_timestamp() END,
        CASE WHEN %(dropped)s THEN clock_timestamp() END)
ON CONFLICT (one) DO UPDATE
   SET retention_seconds = EXCLUDED.retention_seconds,
       epoch_seconds = EXCLUDED.epoch_seconds,
       hot_seconds = EXCLUDED.hot_seconds,
       ran_at = EXCLUDED.ran_at,
       turned_at = coalesce(EXCLUDED.turned_at, m.turned_at),
       dropped_at = coalesce(EXCLUDED.dropped_at, m.dropped_at);

-- name: status
-- The history as operators see it (inturn queue depth, the console, /metrics), from the
-- catalog (no table read): rows (the planner's estimate) and bytes, with indexes and TOAST, of
-- the hot table and of the log and history partitions held; the oldest epoch held and the
-- open one; what the maintenance job was last told and when it ran.
WITH held AS (
    SELECT e.n, e.opened_at, e.closed_at
      FROM inturn_epoch e
     WHERE e.dropped_at IS NULL AND e.opened_at IS NOT NULL
),
parts AS (
    SELECT c.oid, c.reltuples, starts_with(c.relname, 'inturn_history_') AS history
      FROM held
      JOIN pg_class c ON c.relnamespace = to_regnamespace(current_schema())
                     AND c.relname IN ('inturn_message_e' || held.n, 'inturn_history_e' || held.n)
)
SELECT (SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
         WHERE c.oid = 'inturn_delivery'::regclass) AS hot_rows,
       pg_total_relation_size('inturn_delivery'::regclass) AS hot_bytes,
       coalesce((SELECT sum(greatest(p.reltuples, 0))::bigint FROM parts p WHERE p.history), 0)
           AS history_rows,
       coalesce((SELECT sum(pg_total_relation_size(p.oid))::bigint FROM parts p
                  WHERE p.history), 0) AS history_bytes,
       coalesce((SELECT sum(greatest(p.reltuples, 0))::bigint FROM parts p
                  WHERE NOT p.history), 0) AS log_rows,
       coalesce((SELECT sum(pg_total_relation_size(p.oid))::bigint FROM parts p
                  WHERE NOT p.history), 0) AS log_bytes,
       (SELECT count(*) FROM held) AS epochs,
       (SELECT min(held.opened_at) FROM held) AS oldest_at,
       (SELECT held.opened_at FROM held WHERE held.closed_at IS NULL
         ORDER BY held.n DESC LIMIT 1) AS open_since,
       (SELECT min(held.closed_at) FROM held) AS oldest_closed_at,
       m.retention_seconds, m.epoch_seconds, m.hot_seconds, m.ran_at, m.turned_at,
       m.dropped_at
  FROM (SELECT 1) AS one
  LEFT JOIN inturn_maintenance m ON true;

-- name: counted
-- Exact row counts of the hot table, the history and the log (attached partitions), each read
-- no further than "cap" rows: where a count reaches the cap, the planner's estimate of status
-- stands. For people's reads (inturn queue depth, the console), never for /metrics: the
-- estimate is 0 until ANALYZE first runs, and a small table may never reach autovacuum's
-- threshold.
-- Where every day held is counted as it is written (migration 0052: inturn_epoch_rows), the
-- history's and the log's counts are those sums, exact whatever their size ("counters").
WITH held AS (
    SELECT e.n, e.counted FROM inturn_epoch e
     WHERE e.dropped_at IS NULL AND e.opened_at IS NOT NULL
),
counters AS (
    SELECT coalesce(bool_and(held.counted), true) AS exact FROM held
),
sums AS (
    SELECT r.part, sum(r.rows)::bigint AS n
      FROM inturn_epoch_rows r JOIN held ON held.n = r.epoch
     GROUP BY r.part
)
SELECT (SELECT count(*) FROM (SELECT 1 FROM inturn_delivery LIMIT %(cap)s) AS s) AS hot_rows,
       CASE WHEN (SELECT exact FROM counters)
            THEN coalesce((SELECT n FROM sums WHERE part = 'history'), 0)
            ELSE (SELECT count(*) FROM (SELECT 1 FROM inturn_history LIMIT %(cap)s) AS s)
       END AS history_rows,
       CASE WHEN (SELECT exact FROM counters)
            THEN coalesce((SELECT n FROM sums WHERE part = 'log'), 0)
            ELSE (SELECT count(*) FROM (SELECT 1 FROM inturn_message LIMIT %(cap)s) AS s)
       END AS log_rows,
       (SELECT exact FROM counters) AS counters;

-- name: erase_detached
-- An erasure by patient in the days detached and not dropped yet (migration 0035).
-- key: the key's forms, comma-separated (as find_patient).
SELECT inturn_erase_detached(string_to_array(%(key)s::text, ',')) AS erased;
