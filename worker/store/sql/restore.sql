-- Named queries of inturn.worker.store.restore: the database's clock and what each destination
-- has accepted and delivered (issue 39, part 1).

-- name: tick
-- Move the clock on; the tick it held before and the one it holds now (its row made again if
-- someone emptied the table: then it held 0).
INSERT INTO inturn_clock AS c (one, tick, at) VALUES (true, 1, now())
ON CONFLICT (one) DO UPDATE SET tick = c.tick + 1, at = now()
RETURNING tick - 1 AS before, tick AS now;

-- name: clock
SELECT tick FROM inturn_clock WHERE one;

-- name: database_id
-- The database's identity (migration 0055): carried by its backups, new in a database made anew.
SELECT database_id::text AS database_id FROM inturn_clock WHERE one;

-- name: witness
-- Per live destination: how far its delivery had gone, its last row (hot table or history)
-- and its channel log's last message (any route). delivered_through: its last delivered row's id, but below its first waiting row
-- (lanes deliver out of order: a row below the last delivered one may still wait); NULL
-- when it delivered none. delivered_message: the same bound in the channel log's ids, over
-- its slim rows in the hot table (NULL when it has none there: a history row that holds its
-- own payload carries a drawn id in message_id; the operator keeps the last one it saw).
SELECT r.destination,
       CASE WHEN dl.id IS NOT NULL THEN least(dl.id, pf.first_id - 1) END AS delivered_through,
       dl.finished_at AS delivered_at,
       CASE WHEN dm.message_id IS NOT NULL
            THEN least(dm.message_id, pm.first_message - 1) END AS delivered_message,
       ac.id AS accepted_through, ac.enqueued_at AS accepted_at,
       ch.id AS channel_through, ch.enqueued_at AS channel_at
  FROM inturn_destination r
  LEFT JOIN LATERAL (
      SELECT x.id, x.finished_at
        FROM ((SELECT d.id, d.finished_at FROM inturn_delivery d
                WHERE d.destination = r.destination AND d.state = 'delivered'
                ORDER BY d.id DESC LIMIT 1)
              UNION ALL
              (SELECT h.id, h.finished_at FROM inturn_history h
                WHERE h.destination = r.destination AND h.state = 'delivered'
                ORDER BY h.id DESC LIMIT 1)) AS x
       ORDER BY x.id DESC LIMIT 1) AS dl ON true
  -- a destination's slim rows are made by its pulls, one at a time, in log order: their ids
  -- and their log ids go up together, so each bound is one row found by the id indexes (no
  -- scan of a backlog or of the hot window's finished rows)
  LEFT JOIN LATERAL (
      SELECT d.message_id FROM inturn_delivery d
       WHERE d.destination = r.destination AND d.state = 'delivered'
         AND d.message_id IS NOT NULL
       ORDER BY d.id DESC LIMIT 1) AS dm ON true
  LEFT JOIN LATERAL (
      SELECT min(d.id) AS first_id FROM inturn_delivery d
       WHERE d.destination = r.destination AND d.state = 'pending') AS pf ON true
  LEFT JOIN LATERAL (
      SELECT d.message_id AS first_message FROM inturn_delivery d
       WHERE d.destination = r.destination AND d.state = 'pending'
         AND d.message_id IS NOT NULL
       ORDER BY d.id LIMIT 1) AS pm ON true
  LEFT JOIN LATERAL (
      SELECT x.id, x.enqueued_at
        FROM ((SELECT d.id, d.enqueued_at FROM inturn_delivery d
                WHERE d.destination = r.destination ORDER BY d.id DESC LIMIT 1)
              UNION ALL
              (SELECT h.id, h.enqueued_at FROM inturn_history h
                WHERE h.destination = r.destination ORDER BY h.id DESC LIMIT 1)) AS x
       ORDER BY x.id DESC LIMIT 1) AS ac ON true
  LEFT JOIN LATERAL (
      SELECT m.id, m.enqueued_at FROM inturn_message m
       WHERE m.channel = r.channel ORDER BY m.id DESC LIMIT 1) AS ch ON true
 WHERE r.deleted_at IS NULL;

-- name: exposure
-- A destination's messages delivered before the database went back and waiting again (they
-- would be sent twice): its pending rows up to its last delivered row's id, or, for a slim
-- row (pulled again after the restore: a new id), up to the log message the witness saw
-- delivered; and the log rows of that kind it has not pulled again yet. Only messages
-- accepted no later than the witness's last delivery: a later one, whatever its id, was
-- accepted after the restore.
-- include: restore_scope
SELECT (SELECT count(*) FROM inturn_delivery d, scope
         WHERE d.destination = %(destination)s AND d.state = 'pending'
           AND d.enqueued_at <= scope.before
           AND (d.id <= scope.through OR (d.message_id IS NULL AND d.id <= scope.own)
                OR d.message_id <= scope.message))
     + (SELECT count(*)
          FROM scope
          JOIN inturn_destination r ON r.destination = %(destination)s
          JOIN inturn_message m
            ON m.channel = r.channel
           AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                 WHERE c.destination = r.destination), 0)
           AND m.id <= scope.message
         WHERE m.enqueued_at <= scope.before
           AND m.route = ANY (ARRAY(SELECT x.id FROM inturn_route x
                                     WHERE x.channel = r.channel
                                       AND x.destinations @> ARRAY[r.destination])))
       AS again;

-- fragment: restore_scope
-- What a decision after a restore covers. With the person's --through: the rows with an id up
-- to it (ids as the restored database lists them). Without: the recorded finding's bounds,
-- the rows that carry their own payload by id and the slim rows by their log message (pulled
-- again after the restore, they have new ids). Either way, when a finding is recorded, only
-- messages accepted no later than the last delivery the witness saw.
WITH scope AS (
    SELECT %(through)s::bigint AS through,
           CASE WHEN %(through)s::bigint IS NULL THEN f.delivered_through END AS own,
           CASE WHEN %(through)s::bigint IS NULL THEN f.delivered_message END AS message,
           coalesce(f.delivered_at, 'infinity'::timestamptz) AS before
      FROM (SELECT 1) AS one
      LEFT JOIN inturn_restore f ON f.destination = %(destination)s
)

-- name: kept
-- After a restore: the last message of a destination's channel log accepted no later than the
-- last one the witness saw (messages accepted after the restore, which may reuse the lost
-- messages' ids, are passed over from the newest).
SELECT m.id, m.enqueued_at
  FROM inturn_destination r
  JOIN inturn_message m ON m.channel = r.channel
 WHERE r.destination = %(destination)s AND m.enqueued_at <= %(before)s
 ORDER BY m.id DESC
 LIMIT 1;

-- name: finding
SELECT destination, detected_at, tick, delivered_through, delivered_message, delivered_at
  FROM inturn_restore WHERE destination = %(destination)s;

-- name: record_finding
-- The operator's finding (once per restore; a later restore found before a decision replaces
-- it).
INSERT INTO inturn_restore AS f
       (destination, tick, delivered_through, delivered_message, delivered_at)
VALUES (%(destination)s, %(tick)s, %(delivered_through)s, %(delivered_message)s,
        %(delivered_at)s)
ON CONFLICT (destination) DO UPDATE
   SET detected_at = now(), tick = EXCLUDED.tick,
       delivered_through = EXCLUDED.delivered_through,
       delivered_message = EXCLUDED.delivered_message, delivered_at = EXCLUDED.delivered_at;

-- name: ids_past
-- After a restore is found: the delivery rows' and the channel log's sequences past the largest
-- ids the witness saw (only forward; migration 0050).
SELECT inturn_ids_past(%(delivery)s, %(message)s);

-- name: forget_finding
DELETE FROM inturn_restore WHERE destination = %(destination)s;

-- name: mark_delivered
-- A person's decision after a restore: the pending rows of a destination within the scope
-- above (run after its channel log's rows were pulled) were delivered before; they are marked
-- so, never sent again.
-- include: restore_scope
UPDATE inturn_delivery d
   SET state = 'delivered', finished_at = clock_timestamp(), decided_by = %(who)s,
       reason = 'marked delivered: delivered before the database was restored'
  FROM scope
 WHERE d.destination = %(destination)s AND d.state = 'pending'
   AND d.enqueued_at <= scope.before
   AND (d.id <= scope.through OR (d.message_id IS NULL AND d.id <= scope.own)
        OR d.message_id <= scope.message)
RETURNING d.id;
