-- Named queries of ingest. Each block starts with "-- name: <query_name>".
-- Parameters use psycopg's %(name)s style. Loaded by inturn.worker.store.queries, which puts
-- each "-- fragment: <name>" block in place of the "-- include: <name>" lines (see queue.sql).
-- The fragments are what store_log shares with reserve_log (how a batch meets the duplicate
-- window, which earlier copies a re-send follows, the channel's lock). The three statements
-- that write the log are sent compacted (inturn.worker.store.ingest), under psycopg's 4 KiB
-- cache limit: a fragment's comment lines are not sent, so it adds nothing to what is sent.

-- fragment: window_prior
-- The window's bounds (since: the duplicate window; done: the lost-ACK window), and each
-- message's earlier sighting in the window, if any (before this batch counts it again).
w AS (SELECT now() - make_interval(secs => %(window_seconds)s) AS since,
             now() - make_interval(secs => %(delivered_seconds)s) AS done),
prior AS (
    SELECT m.n, r.received_at, r.repeats
      FROM msg m JOIN inturn_received r
        ON r.channel = %(channel)s AND r.control_id = m.control_id AND r.digest = m.digest
     WHERE %(remember)s
),

-- fragment: window_counted
-- A message already in the window (same channel, MSH-10 and content): counted once more, or
-- its window started again when it had ended.
ON CONFLICT (channel, control_id, digest) DO UPDATE
   SET (received_at, repeats, size) = (SELECT CASE WHEN r.received_at < w.since THEN now()
       ELSE r.received_at END, CASE WHEN r.received_at < w.since THEN 0 ELSE r.repeats + 1
       END, excluded.size FROM w)
RETURNING r.control_id, r.digest, r.received_at, r.repeats

-- fragment: window_seen
-- Each message as the window now counts it (settled: no other batch counted it meanwhile),
-- and the fresh ones (never seen: queued).
seen AS MATERIALIZED (
    SELECT m.n, x.received_at, x.repeats, p.repeats = x.repeats - 1 AS settled
      FROM msg m JOIN remembered x ON x.control_id = m.control_id AND x.digest = m.digest
      LEFT JOIN prior p ON p.n = m.n AND p.received_at = x.received_at
),
fresh AS MATERIALIZED (
    SELECT m.* FROM msg m
     WHERE NOT %(remember)s OR EXISTS (SELECT 1 FROM seen s WHERE s.n = m.n AND s.repeats = 0)
),

-- fragment: repeat_columns
-- What the caller reads of the repeats (one array per message and destination) and of the
-- messages whose MSH-10 the window holds with another content (reused).
(SELECT json_agg(json_build_array(n, d, id, state, copy) ORDER BY n, k) FROM latest)
    AS repeated,
(SELECT array_agg(m.n ORDER BY m.n) FROM msg m CROSS JOIN w
  WHERE %(remember)s AND EXISTS (
        SELECT FROM inturn_received o
         WHERE o.channel = %(channel)s AND o.control_id = m.control_id
           AND o.digest <> m.digest AND o.received_at >= w.since)) AS reused;

-- name: routes
-- The routing table: every live destination of every channel. Suspended ones are included on
-- purpose: a suspended destination keeps receiving, it only stops sending.
SELECT destination, channel, message_types, suspended, sender_kind, replies, filter_fields,
       pack_spec
  FROM inturn_destination
 WHERE deleted_at IS NULL
 ORDER BY channel, destination;

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

-- name: answer_only
-- A reply on a channel whose messages are accepted and not stored (unrouted: accept): it
-- answers the open expectations its keys name, as the store statement's `answered` does.
UPDATE inturn_order_expectation
   SET answered_at = now(), answered_control_id = %(control_id)s
 WHERE reply_channel = %(channel)s AND answered_at IS NULL
   AND key_digest = ANY (string_to_array(%(reply_keys)s, ','));

-- The channel log (issue 43, migration 0033; docs/explanation/storage-layout.md): a message
-- is stored once, in inturn_message, with its route set (inturn_route: the destinations that
-- take it); each destination's worker pulls it into a slim row of its queue. The statements
-- below are store_log (in clear), reserve_log and store_log_sealed (with payload keys).

-- fragment: log_latest
-- For the repeats, per destination of the message's route set, its latest copy there
-- (inturn_latest_copy, migration 0041: a log row not pulled yet is the newest, pending) and
-- whether to queue a re-send of it (copy).
latest AS MATERIALIZED (
    SELECT s.n, t.d, t.k, o.id, CASE WHEN s.settled THEN o.state ELSE 'arriving' END AS state,
           s.settled AND NOT coalesce(o.state = 'pending'
           OR (o.state = 'delivered' AND o.finished_at >= w.done), false) AS copy
      FROM seen s JOIN msg m USING (n) CROSS JOIN w
      JOIN inturn_route rt ON rt.id = m.route
     CROSS JOIN unnest(rt.destinations) WITH ORDINALITY AS t(d, k)
      LEFT JOIN LATERAL inturn_latest_copy(%(channel)s, m.control_id, t.d, s.received_at) o
        ON true
     WHERE s.repeats > 0
),

-- fragment: log_queued
-- What goes into the log: each fresh message with its route set, and per message received
-- again one re-send row routed to the destinations that queue it again (a route set made here
-- when new), with the earlier copies it follows (resent_from, in the set's order: each
-- destination's pull links its slim row to its own earlier copy). Then the channel's lock
-- (inturn_enqueue_lock of "channel:<name>", held until COMMIT), taken only when something is
-- queued, so that the log ids of one channel are drawn, and committed, in order: a pull that
-- sees a channel's id committed sees every lower one of the channel committed too.
resend AS MATERIALIZED (
    SELECT n, array_agg(d ORDER BY k) AS ds, array_agg(id ORDER BY k) AS froms
      FROM latest WHERE copy GROUP BY n
),
made AS (
    INSERT INTO inturn_route (channel, destinations)
    SELECT DISTINCT %(channel)s, r.ds FROM resend r
    -- DO UPDATE (of nothing): the id is returned for a set that exists too
    ON CONFLICT (channel, destinations) DO UPDATE SET channel = excluded.channel
    RETURNING id, destinations
),
queued AS MATERIALIZED (
    SELECT f.n, f.route, NULL::bigint[] AS froms FROM fresh f
    UNION ALL
    SELECT r.n, x.id, r.froms FROM resend r JOIN made x ON x.destinations = r.ds
),
locked AS MATERIALIZED (
    -- set_config: this transaction commits synchronously (no session setting: pooler-safe)
    SELECT count(inturn_enqueue_lock('channel:' || %(channel)s)) AS n
     WHERE EXISTS (SELECT 1 FROM queued)
       AND set_config('synchronous_commit', 'on', true) = 'on'
),

-- name: route
-- A channel's route set (its destinations, sorted): its id, the set added when new. A set a
-- concurrent transaction is adding is not seen by this statement (no row): asked again.
WITH made AS (
    INSERT INTO inturn_route (channel, destinations)
    SELECT %(channel)s, %(destinations)s::text[]
     WHERE NOT EXISTS (SELECT 1 FROM inturn_route
                        WHERE channel = %(channel)s AND destinations = %(destinations)s::text[])
    ON CONFLICT (channel, destinations) DO NOTHING
    RETURNING id
)
SELECT id FROM made
UNION ALL
SELECT id FROM inturn_route WHERE channel = %(channel)s AND destinations = %(destinations)s::text[]
LIMIT 1;

-- name: store_log
-- One batch of one channel, each message with its route set, in one autocommit statement:
-- explained in inturn.worker.store.ingest.store_log_batch.
WITH msg AS (
    SELECT m.*
      FROM unnest(%(control_ids)s::text[], %(types)s::text[], %(payloads)s::bytea[],
                  %(digests)s::bytea[], %(keys)s::text[], %(tps)s::text[], %(rks)s::text[],
                  %(routes)s::int[])
           WITH ORDINALITY AS m(control_id, message_type, payload, digest, keys, tp, rk, route, n)
),
-- include: window_prior
remembered AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    SELECT %(channel)s, control_id, digest, length(payload) FROM msg WHERE %(remember)s ORDER BY n
    -- include: window_counted
),
-- include: window_seen
-- include: log_latest
-- include: log_queued
inserted AS (
    INSERT INTO inturn_message
           (channel, control_id, message_type, payload, size, patient_keys, traceparent, route,
            resent_from)
    SELECT %(channel)s, f.control_id, f.message_type, f.payload, length(f.payload),
           string_to_array(f.keys, ','), f.tp, q.route, q.froms
      FROM queued q JOIN msg f USING (n)
     WHERE (SELECT n FROM locked) > 0
     ORDER BY q.n
    RETURNING id
),
notified AS (
    SELECT count(pg_notify(%(wake)s, '')) AS n WHERE EXISTS (SELECT 1 FROM inserted)
),
answered AS (
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
       (SELECT array_agg(n ORDER BY n) FROM queued) AS placed,
       (SELECT array_agg(id ORDER BY id) FROM inserted) AS ids,
       (SELECT n FROM notified) AS notified,
       -- include: repeat_columns

-- name: reserve_log
-- With payload keys, the first of the two statements that store a batch in the log (in one
-- transaction): the window as in store_log (sizes, never payloads, reach it), the channel's
-- lock, then one log id per row to write, drawn under the lock. The caller seals each payload
-- once, for its log id and "channel:<name>", and runs store_log_sealed.
WITH msg AS (
    SELECT m.*
      FROM unnest(%(control_ids)s::text[], %(digests)s::bytea[], %(sizes)s::int[],
                  %(routes)s::int[])
           WITH ORDINALITY AS m(control_id, digest, size, route, n)
),
-- include: window_prior
remembered AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    SELECT %(channel)s, control_id, digest, size FROM msg WHERE %(remember)s ORDER BY n
    -- include: window_counted
),
-- include: window_seen
-- include: log_latest
-- include: log_queued
drawn AS MATERIALIZED (
    SELECT nextval('inturn_message_id_seq') AS id
      FROM generate_series(1, (SELECT count(*) FROM queued))
     WHERE (SELECT n FROM locked) > 0
)
SELECT (SELECT array_agg(n ORDER BY n) FROM fresh) AS fresh,
       (SELECT json_agg(json_build_array(n, route, froms) ORDER BY n) FROM queued) AS queued,
       (SELECT array_agg(id ORDER BY id) FROM drawn) AS ids,
       -- include: repeat_columns

-- name: store_log_sealed
-- The second statement: the log rows reserve_log drew ids for, each payload sealed once for
-- its log id and "channel:<name>", one NOTIFY for the channel, and the orders a reply answers.
WITH inserted AS (
    INSERT INTO inturn_message
           (id, channel, control_id, message_type, payload, size, patient_keys, traceparent,
            route, resent_from)
    OVERRIDING SYSTEM VALUE
    SELECT r.id, %(channel)s, r.control_id, r.message_type, r.payload, r.size,
           string_to_array(r.keys, ','), r.tp, r.route,
           CASE WHEN r.froms IS NOT NULL THEN string_to_array(r.froms, ',', '')::bigint[] END
      FROM unnest(%(ids)s::bigint[], %(row_control_ids)s::text[], %(row_types)s::text[],
                  %(row_payloads)s::bytea[], %(row_sizes)s::int[], %(row_keys)s::text[],
                  %(row_traceparents)s::text[], %(row_routes)s::int[], %(row_froms)s::text[])
           AS r(id, control_id, message_type, payload, size, keys, tp, route, froms)
     ORDER BY r.id
    RETURNING id
),
notified AS (
    SELECT count(pg_notify(%(wake)s, '')) AS n WHERE EXISTS (SELECT 1 FROM inserted)
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

-- The statements of the release before the channel log (one inturn_delivery row per message
-- and destination, each with its payload), kept for the minutes of an upgrade in place: ingest
-- uses them until migration 0041 is applied (inturn.worker.store.ingest_rows), then the log's.

-- fragment: window_latest
-- For the repeats (rows_store, reserve: one row per destination), the latest copy per destination
-- and whether to queue a re-send of it (copy).
latest AS MATERIALIZED (
    SELECT s.n, t.d, t.k, o.id, CASE WHEN s.settled THEN o.state ELSE 'arriving' END AS state,
           s.settled AND NOT coalesce(o.state = 'pending'
           OR (o.state = 'delivered' AND o.finished_at >= w.done), false) AS copy
      FROM seen s JOIN msg m USING (n) CROSS JOIN w
     CROSS JOIN unnest(%(destinations)s::text[]) WITH ORDINALITY AS t(d, k)
      LEFT JOIN LATERAL (
           SELECT id, state, finished_at FROM inturn_delivery o
            WHERE o.control_id = m.control_id AND o.channel = %(channel)s
              AND o.destination = t.d AND o.enqueued_at >= s.received_at
            ORDER BY o.id DESC LIMIT 1) o ON true
     WHERE s.repeats > 0
),

-- fragment: enqueue_locks
-- The destinations' enqueue locks in sorted order, taken only when something is queued.
SELECT count(inturn_enqueue_lock(s.d)) AS n
  FROM (SELECT d FROM unnest(%(destinations)s::text[]) AS d ORDER BY d) AS s
 WHERE (EXISTS (SELECT 1 FROM fresh) OR EXISTS (SELECT 1 FROM latest WHERE copy))
   AND set_config('synchronous_commit', 'on', true) = 'on'

-- fragment: linked_notified
-- After the rows are inserted: one NOTIFY per destination when anything was queued. (A
-- re-send's earlier copy is pointed at it by the insertion itself: the trigger of migration
-- 0032, which checks and audits the link; ingest may not write resent_as.)
notified AS (
    SELECT count(pg_notify(u.c, u.d)) AS n
      FROM unnest(%(channels)s::text[], %(destinations)s::text[]) AS u(c, d)
     WHERE EXISTS (SELECT 1 FROM inserted)
),

-- name: rows_store
-- One batch for one channel and destination set, in one autocommit statement: explained in
-- inturn.worker.store.ingest.store_batch (psycopg caches it only under 4 KiB: keep it short).
WITH msg AS (
    SELECT m.*
      FROM unnest(%(control_ids)s::text[], %(message_types)s::text[], %(payloads)s::bytea[],
                  %(digests)s::bytea[], %(patient_keys)s::text[], %(traceparents)s::text[],
                  %(reply_keys)s::text[])
           WITH ORDINALITY AS m(control_id, message_type, payload, digest, keys, tp, rk, n)
),
-- include: window_prior
remembered AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    SELECT %(channel)s, control_id, digest, length(payload) FROM msg WHERE %(remember)s ORDER BY n
    -- include: window_counted
),
-- include: window_seen
-- include: window_latest
locked AS MATERIALIZED (
    -- set_config: this transaction commits synchronously (no session setting: pooler-safe)
    -- include: enqueue_locks
),
inserted AS (
    INSERT INTO inturn_delivery
           (destination, channel, control_id, message_type, payload, size, patient_keys,
            traceparent, resent_from)
    SELECT r.d, %(channel)s, f.control_id, f.message_type, f.payload, length(f.payload),
           string_to_array(f.keys, ','), f.tp, r.id
      FROM (SELECT f.n, t.d, t.k, NULL::bigint AS id
              FROM fresh f CROSS JOIN unnest(%(destinations)s::text[]) WITH ORDINALITY AS t(d, k)
            UNION ALL SELECT n, d, k, id FROM latest WHERE copy) AS r
      JOIN msg f USING (n)
     WHERE (SELECT n FROM locked) > 0
     ORDER BY r.n, r.k
    RETURNING id, resent_from
),
-- include: linked_notified
answered AS (
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
       -- include: repeat_columns

-- name: rows_reserve
-- With payload keys, the first of the two statements that store a batch (in one transaction):
-- the window rows and the re-send decisions as in store (sizes, never payloads, reach this
-- statement), the enqueue locks, then one row ID per fresh message and destination and per
-- re-send, drawn after the locks so that ID order stays commit order. The caller seals each
-- payload for its row ID and runs store_sealed.
WITH msg AS (
    SELECT m.*
      FROM unnest(%(control_ids)s::text[], %(digests)s::bytea[], %(sizes)s::int[])
           WITH ORDINALITY AS m(control_id, digest, size, n)
),
-- include: window_prior
remembered AS (
    INSERT INTO inturn_received AS r (channel, control_id, digest, size)
    SELECT %(channel)s, control_id, digest, size FROM msg WHERE %(remember)s ORDER BY n
    -- include: window_counted
),
-- include: window_seen
-- include: window_latest
locked AS MATERIALIZED (
    -- set_config: the transaction (this and store_sealed) commits synchronously, pooler-safe
    -- include: enqueue_locks
),
drawn AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('inturn_delivery', 'id')) AS id
      FROM generate_series(1, (SELECT count(*) FROM fresh)
                              * cardinality(%(destinations)s::text[])
                              + (SELECT count(*) FROM latest WHERE copy))
     WHERE (SELECT n FROM locked) > 0
)
SELECT (SELECT array_agg(n ORDER BY n) FROM fresh) AS fresh,
       (SELECT array_agg(id ORDER BY id) FROM drawn) AS ids,
       -- include: repeat_columns

-- name: rows_store_sealed
-- The second statement: the rows reserve drew IDs for, each payload sealed for its own row
-- (inturn.worker.crypto), re-sends linked to their earlier copies, one NOTIFY per destination, and the orders a reply answers (as in
-- store; positions n are the messages' 1-based positions in the batch).
WITH inserted AS (
    INSERT INTO inturn_delivery
           (id, destination, channel, control_id, message_type, payload, size, patient_keys,
            traceparent, resent_from)
    OVERRIDING SYSTEM VALUE
    SELECT r.id, r.d, %(channel)s, r.control_id, r.message_type, r.payload, r.size,
           string_to_array(r.keys, ','), r.tp, r.resent_from
      FROM unnest(%(ids)s::bigint[], %(row_destinations)s::text[], %(row_control_ids)s::text[],
                  %(row_types)s::text[], %(row_payloads)s::bytea[], %(row_sizes)s::int[],
                  %(row_keys)s::text[], %(row_traceparents)s::text[],
                  %(row_resent_from)s::bigint[])
           AS r(id, d, control_id, message_type, payload, size, keys, tp, resent_from)
     ORDER BY r.id
    RETURNING id, resent_from
),
-- include: linked_notified
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


-- name: log_ready
-- Whether migration 0041 is applied (ingest writes the channel log then): no privilege needed.
SELECT to_regprocedure('inturn_latest_copy(text,text,text,timestamptz)') IS NOT NULL AS ready;
