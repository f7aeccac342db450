-- Named queries of ingest. Each block starts with "-- name: <query_name>".
-- Parameters use psycopg's %(name)s style. Loaded by inturn.worker.store.queries.

-- name: routes
-- The routing table: every live destination of every channel. Suspended ones are included on
-- purpose: a suspended destination keeps receiving, it only stops sending.
SELECT destination, channel, message_types, suspended
  FROM inturn_destination
 WHERE deleted_at IS NULL
 ORDER BY channel, destination;

-- name: remember
-- Record a received message in the duplicate window. Returns one row:
--   id:     the new (or recycled) row, or NULL when the same channel, MSH-10 and bytes were
--           already received inside the window (a duplicate: the caller rolls back);
--   reused: whether another message with this MSH-10 but different bytes was received on the
--           channel inside the window (it is still stored: it is a different message).
-- A row for the same key that is older than the window is recycled, not treated as a duplicate.
-- Runs first in the ingest transaction; a concurrent copy of the same message waits here on the
-- unique index until the first one commits or rolls back.
WITH ins AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    VALUES (%(channel)s, %(control_id)s, %(digest)s, %(size)s)
    ON CONFLICT (channel, control_id, digest) DO UPDATE
       SET received_at = now(), size = excluded.size, delivery_ids = '{}'
     WHERE r.received_at < now() - make_interval(secs => %(window_seconds)s)
    RETURNING r.id
)
SELECT (SELECT id FROM ins) AS id,
       EXISTS (SELECT 1
                 FROM inturn_received o
                WHERE o.channel = %(channel)s
                  AND o.control_id = %(control_id)s
                  AND o.digest <> %(digest)s
                  AND o.received_at >= now() - make_interval(secs => %(window_seconds)s))
         AS reused;

-- name: remember_ids
-- Link the window row to the delivery rows it produced (same transaction as the inserts).
UPDATE inturn_received SET delivery_ids = %(ids)s WHERE id = %(id)s;

-- name: forget_old
-- Purge one batch of window rows older than the window. Returns the number deleted.
WITH old AS (
    SELECT id
      FROM inturn_received
     WHERE received_at < now() - make_interval(secs => %(window_seconds)s)
     ORDER BY received_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM inturn_received r USING old WHERE r.id = old.id;
