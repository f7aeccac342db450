-- Named queries of ingest. Each block starts with "-- name: <query_name>".
-- Parameters use psycopg's %(name)s style. Loaded by inturn.worker.store.queries.

-- name: routes
-- The routing table: every live destination of every channel. Suspended ones are included on
-- purpose: a suspended destination keeps receiving, it only stops sending.
SELECT destination, channel, message_types, suspended, sender_kind, replies, filter_fields
  FROM inturn_destination
 WHERE deleted_at IS NULL
 ORDER BY channel, destination;

-- name: store
-- A batch of messages for one channel and one set of destinations, stored by ONE statement in
-- autocommit mode (its implicit COMMIT returns with the result). The steps are ordered by data
-- dependencies: window rows, then the enqueue locks (queue.sql's enqueue_lock, in sorted order),
-- then the delivery rows with their identifier index keys (patient_keys: one comma-separated
-- string per message), then one NOTIFY per destination; a reply (reply_keys) answers its orders. A message whose window
-- row conflicts is a duplicate: nothing is done for it. Explained in full in
-- inturn.worker.ingest.batch.store_batch; keep this text short (psycopg caches only queries
-- under 4 KiB).
WITH msg AS (
    SELECT m.control_id, m.message_type, m.payload, m.digest, m.keys, m.tp, m.rk, m.n
      FROM unnest(%(control_ids)s::text[], %(message_types)s::text[], %(payloads)s::bytea[],
                  %(digests)s::bytea[], %(patient_keys)s::text[], %(traceparents)s::text[],
                  %(reply_keys)s::text[])
           WITH ORDINALITY AS m(control_id, message_type, payload, digest, keys, tp, rk, n)
),
remembered AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    SELECT %(channel)s, control_id, digest, length(payload)
      FROM msg
     WHERE %(remember)s
     ORDER BY n
    ON CONFLICT (channel, control_id, digest) DO UPDATE
       SET received_at = now(), size = excluded.size
     WHERE r.received_at < now() - make_interval(secs => %(window_seconds)s)
    RETURNING r.control_id, r.digest
),
fresh AS MATERIALIZED (
    SELECT m.*
      FROM msg m
     WHERE NOT %(remember)s
        OR EXISTS (SELECT 1 FROM remembered x
                    WHERE x.control_id = m.control_id AND x.digest = m.digest)
),
locked AS MATERIALIZED (
    -- set_config: this transaction commits synchronously (no session setting: pooler-safe)
    SELECT count(inturn_enqueue_lock(s.d)) AS n
      FROM (SELECT d FROM unnest(%(destinations)s::text[]) AS d ORDER BY d) AS s
     WHERE EXISTS (SELECT 1 FROM fresh) AND set_config('synchronous_commit', 'on', true) = 'on'
),
inserted AS (
    INSERT INTO inturn_delivery
           (destination, channel, control_id, message_type, payload, size, patient_keys,
            traceparent)
    SELECT t.d, %(channel)s, f.control_id, f.message_type, f.payload, length(f.payload),
           string_to_array(f.keys, ','), f.tp
      FROM fresh f
     CROSS JOIN unnest(%(destinations)s::text[]) WITH ORDINALITY AS t(d, k)
     WHERE (SELECT n FROM locked) > 0
     ORDER BY f.n, t.k
    RETURNING id
),
notified AS (
    SELECT count(pg_notify(u.c, u.d)) AS n
      FROM unnest(%(channels)s::text[], %(destinations)s::text[]) AS u(c, d)
     WHERE EXISTS (SELECT 1 FROM inserted)
),
answered AS (
    -- spec.replies: a reply answers the open expectations of its keys (rk: digests)
    UPDATE inturn_order_expectation e
       SET answered_at = now(), answered_control_id = f.control_id
      FROM fresh f
     WHERE f.rk <> '' AND e.reply_channel = %(channel)s AND e.answered_at IS NULL
       AND e.key_digest = ANY (string_to_array(f.rk, ','))
       AND (SELECT n FROM locked) > 0
    RETURNING f.n
)
SELECT (SELECT array_agg(n ORDER BY n) FROM fresh) AS fresh,
       (SELECT array_agg(DISTINCT n) FROM answered) AS answered,
       (SELECT array_agg(id ORDER BY id) FROM inserted) AS ids,
       (SELECT n FROM notified) AS notified,
       (SELECT array_agg(m.n ORDER BY m.n)
          FROM msg m
         CROSS JOIN LATERAL (
               -- LIMIT: an index probe per message
               SELECT 1
                 FROM inturn_received o
                WHERE o.channel = %(channel)s
                  AND o.control_id = m.control_id
                  AND o.digest <> m.digest
                  AND o.received_at >= now() - make_interval(secs => %(window_seconds)s)
                LIMIT 1) AS other
         WHERE %(remember)s
       ) AS reused;

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

-- name: reserve
-- With payload keys, the first of the two statements that store a batch (in one transaction):
-- the window rows (sizes, never payloads, reach this statement), the enqueue locks as in
-- store, then one row ID per fresh message and destination, drawn after the locks so that ID
-- order stays commit order. The caller seals each payload for its row ID and runs store_sealed.
WITH msg AS (
    SELECT m.control_id, m.digest, m.size, m.n
      FROM unnest(%(control_ids)s::text[], %(digests)s::bytea[], %(sizes)s::int[])
           WITH ORDINALITY AS m(control_id, digest, size, n)
),
remembered AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    SELECT %(channel)s, control_id, digest, size
      FROM msg
     WHERE %(remember)s
     ORDER BY n
    ON CONFLICT (channel, control_id, digest) DO UPDATE
       SET received_at = now(), size = excluded.size
     WHERE r.received_at < now() - make_interval(secs => %(window_seconds)s)
    RETURNING r.control_id, r.digest
),
fresh AS MATERIALIZED (
    SELECT m.*
      FROM msg m
     WHERE NOT %(remember)s
        OR EXISTS (SELECT 1 FROM remembered x
                    WHERE x.control_id = m.control_id AND x.digest = m.digest)
),
locked AS MATERIALIZED (
    -- set_config: the transaction (this and store_sealed) commits synchronously, pooler-safe
    SELECT count(inturn_enqueue_lock(s.d)) AS n
      FROM (SELECT d FROM unnest(%(destinations)s::text[]) AS d ORDER BY d) AS s
     WHERE EXISTS (SELECT 1 FROM fresh) AND set_config('synchronous_commit', 'on', true) = 'on'
),
drawn AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('inturn_delivery', 'id')) AS id
      FROM generate_series(1, (SELECT count(*) FROM fresh)
                              * cardinality(%(destinations)s::text[]))
     WHERE (SELECT n FROM locked) > 0
)
SELECT (SELECT array_agg(n ORDER BY n) FROM fresh) AS fresh,
       (SELECT array_agg(id ORDER BY id) FROM drawn) AS ids,
       (SELECT array_agg(m.n ORDER BY m.n)
          FROM msg m
         CROSS JOIN LATERAL (
               SELECT 1
                 FROM inturn_received o
                WHERE o.channel = %(channel)s
                  AND o.control_id = m.control_id
                  AND o.digest <> m.digest
                  AND o.received_at >= now() - make_interval(secs => %(window_seconds)s)
                LIMIT 1) AS other
         WHERE %(remember)s
       ) AS reused;

-- name: store_sealed
-- The second statement: the rows reserve drew IDs for, each payload sealed for its own row
-- (inturn.worker.crypto), one NOTIFY per destination, and the orders a reply answers (as in
-- store; positions n are the messages' 1-based positions in the batch).
WITH inserted AS (
    INSERT INTO inturn_delivery
           (id, destination, channel, control_id, message_type, payload, size, patient_keys,
            traceparent)
    OVERRIDING SYSTEM VALUE
    SELECT r.id, r.d, %(channel)s, r.control_id, r.message_type, r.payload, r.size,
           string_to_array(r.keys, ','), r.tp
      FROM unnest(%(ids)s::bigint[], %(row_destinations)s::text[], %(row_control_ids)s::text[],
                  %(row_types)s::text[], %(row_payloads)s::bytea[], %(row_sizes)s::int[],
                  %(row_keys)s::text[], %(row_traceparents)s::text[])
           AS r(id, d, control_id, message_type, payload, size, keys, tp)
     ORDER BY r.id
    RETURNING id
),
notified AS (
    SELECT count(pg_notify(u.c, u.d)) AS n
      FROM unnest(%(channels)s::text[], %(destinations)s::text[]) AS u(c, d)
     WHERE EXISTS (SELECT 1 FROM inserted)
),
answered AS (
    UPDATE inturn_order_expectation e
       SET answered_at = now(), answered_control_id = f.control_id
      FROM unnest(%(control_ids)s::text[], %(reply_keys)s::text[], %(positions)s::int[])
           AS f(control_id, rk, n)
     WHERE f.rk <> '' AND e.reply_channel = %(channel)s AND e.answered_at IS NULL
       AND e.key_digest = ANY (string_to_array(f.rk, ','))
    RETURNING f.n
)
SELECT (SELECT array_agg(DISTINCT n) FROM answered) AS answered,
       (SELECT count(*) FROM inserted) AS inserted,
       (SELECT n FROM notified) AS notified;
