-- Named queries of the delivery queue. Each block starts with "-- name: <query_name>".
-- Parameters use psycopg's %(name)s style. Loaded by inturn.worker.store.queries, which also
-- composes the fragments: a "-- fragment: <name>" block is no statement of its own; the loader
-- puts its text in place of every "-- include: <name>" line when the file is loaded (the
-- statements sent, and those the tests EXPLAIN, are the composed ones).

-- lease_guard is the first two CTEs of every worker statement ("WITH renewed AS (...),
-- lease AS (...)"); the statement reads "lease". The lease guard (inturn.worker.store.lease):
-- this holder's epoch of this destination; no row in "lease" when another holder took it over.
-- With "renew" the statement renews the lease (an UPDATE of its row; an expired lease nobody
-- took is renewed); without, it checks holder, epoch and expiry under a share lock of the row
-- and writes nothing to it (issue 43: the worker renews once the renewal is due, not at every
-- message). Either way the statement and a takeover (an UPDATE of the row) are serialised:
-- whichever comes second waits for the first, and a statement that waited for a takeover
-- finds the epoch raised and holds nothing. set_config: the transaction commits synchronously,
-- whatever the session (pooler-safe). The fragment is kept short, comments included: it is
-- sent with every statement, and psycopg caches the conversion of a query of 4,096 bytes at
-- most (a longer one is parsed again in Python at every execution: about 100 us a message).

-- fragment: lease_guard
renewed AS (
    UPDATE inturn_lease
       SET expires_at = clock_timestamp() + make_interval(secs => ttl_seconds)
     WHERE destination = %(destination)s AND holder = %(holder)s AND epoch = %(epoch)s
       AND %(renew)s AND set_config('synchronous_commit', 'on', true) = 'on'
    RETURNING 1 AS held
),
lease AS (
    SELECT held FROM renewed
    UNION ALL
    SELECT 1 FROM (SELECT FROM inturn_lease
                    WHERE destination = %(destination)s AND holder = %(holder)s
                      AND epoch = %(epoch)s AND expires_at > clock_timestamp() AND NOT %(renew)s
                      AND set_config('synchronous_commit', 'on', true) = 'on'
                      FOR SHARE) AS checked
)

-- fragment: own_binding
-- A row's payload and the binding it was sealed with (migration 0033), its own half, for a row
-- "d" of inturn_delivery read without its log row (issue 37, migration 0049): a row holding a
-- payload of its own (stored before the channel log, or kept when its day was dropped) was
-- sealed for its own id and destination unless seal_id/seal_scope say otherwise; a slim row's
-- payload is its log row's (log_id), sealed once for the log id and "channel:<name>". The
-- statement then calls inturn_log_payload_rows(log_id) once for the row it chose ("m") and takes
-- log_binding: a join to inturn_message on message_id, a value known only at run time, planned
-- and opened a scan of every partition of the log.
d.payload AS own_payload, coalesce(d.seal_id, d.id) AS own_seal_id,
coalesce(d.seal_scope, d.destination) AS own_seal_scope,
CASE WHEN d.payload IS NULL THEN d.message_id END AS log_id,

-- fragment: log_binding
-- A chosen row "h" (own_binding's columns) and its log message "m" (inturn_log_payload_rows): the
-- payload and the binding it was sealed with.
coalesce(h.own_payload, m.payload) AS payload,
CASE WHEN h.own_payload IS NOT NULL THEN h.own_seal_id ELSE m.seal_id END AS seal_id,
CASE WHEN h.own_payload IS NOT NULL THEN h.own_seal_scope ELSE m.seal_scope END AS seal_scope,

-- name: synchronous_commit
-- For the transaction in progress: it is durable when COMMIT returns.
SET LOCAL synchronous_commit = on;

-- name: enqueue_lock
-- Serialises enqueues per destination until COMMIT, so that id order is commit order
-- (the function of migration 0011, granted to the roles that enqueue).
SELECT inturn_enqueue_lock(%(destination)s);

-- name: enqueue_insert
-- patient_keys: the identifier index keys (inturn.worker.hl7.pid.index_keys), in the same row.
INSERT INTO inturn_delivery
       (destination, channel, control_id, message_type, payload, size, patient_keys)
VALUES (%(destination)s, %(channel)s, %(control_id)s, %(message_type)s, %(payload)s, %(size)s,
        %(patient_keys)s::text[])
RETURNING id;

-- name: draw_ids
-- Row IDs drawn ahead of the INSERT, for payloads sealed with their row ID as associated data
-- (inturn.worker.crypto). Drawn after the destinations' enqueue locks, so that ID order stays
-- commit order; an ID drawn and not used (a rollback) is a gap, as with any sequence.
SELECT nextval(pg_get_serial_sequence('inturn_delivery', 'id')) AS id
  FROM generate_series(1, %(n)s::int) AS g(n)
 ORDER BY g.n;

-- name: enqueue_insert_with_id
-- enqueue_insert with an ID drawn by draw_ids.
INSERT INTO inturn_delivery
       (id, destination, channel, control_id, message_type, payload, size, patient_keys)
OVERRIDING SYSTEM VALUE
VALUES (%(id)s, %(destination)s, %(channel)s, %(control_id)s, %(message_type)s, %(payload)s,
        %(size)s, %(patient_keys)s::text[])
RETURNING id;

-- name: notify
SELECT pg_notify(%(channel)s, %(destination)s);

-- name: pull_lock
-- The first statement of a pull's transaction (the channel log, migration 0033): this
-- destination's enqueue lock, held until COMMIT, so that a pull and anything else that adds
-- rows to its queue (a resend) do so one at a time and the queue's id order stays the order
-- messages were accepted in. Taken before the pull statement, whose snapshot is then taken
-- after the lock is held (READ COMMITTED: a snapshot per statement) and sees the cursor as the
-- previous pull left it. Guarded by the lease: no row (and no lock) when it is lost.
WITH
-- include: lease_guard
SELECT lease.held, inturn_enqueue_lock(%(destination)s) AS locked
  FROM lease;

-- name: pull
-- A destination's pull from its channel's log: the log rows past its cursor whose route set
-- names it become slim rows of its queue (no payload: they read it through message_id), in
-- log order, up to "limit"; the cursor moves to the last row pulled when the limit was
-- reached, else to the highest log id of the channel this statement's snapshot sees (every
-- lower id of the channel has committed or never will: ingest draws a channel's ids under
-- the channel's enqueue lock). It never moves back. Run under pull_lock, in its transaction.
-- Guarded by the lease: held NULL and nothing written when it is lost.
WITH
-- include: lease_guard
, cur AS (
    SELECT coalesce((SELECT c.position FROM inturn_cursor c
                      WHERE c.destination = %(destination)s), 0) AS position
      FROM lease
),
picked AS (
    SELECT m.id, m.control_id, m.message_type, m.size, m.patient_keys, m.traceparent,
           m.enqueued_at,
           -- a re-send row (migration 0045): this destination's earlier copy, by its place
           -- in the row's route set
           CASE WHEN m.resent_from IS NOT NULL
                THEN m.resent_from[(SELECT array_position(r.destinations, %(destination)s::text)
                                      FROM inturn_route r WHERE r.id = m.route)] END
               AS resent_from
      FROM cur
      JOIN inturn_message m ON m.channel = %(channel)s AND m.id > cur.position
     WHERE m.route = ANY (ARRAY(SELECT r.id FROM inturn_route r
                                 WHERE r.channel = %(channel)s
                                   AND r.destinations @> ARRAY[%(destination)s::text]))
     ORDER BY m.id
     LIMIT %(limit)s
),
pulled AS (
    INSERT INTO inturn_delivery
           (destination, channel, control_id, message_type, size, patient_keys, traceparent,
            enqueued_at, message_id, resent_from)
    SELECT %(destination)s, %(channel)s, p.control_id, p.message_type, p.size, p.patient_keys,
           p.traceparent, p.enqueued_at, p.id, p.resent_from
      FROM picked p
     ORDER BY p.id
    RETURNING id
),
moved AS (
    INSERT INTO inturn_cursor AS c (destination, channel, position)
    SELECT %(destination)s, %(channel)s,
           CASE WHEN (SELECT count(*) FROM picked) >= %(limit)s
                THEN (SELECT max(p.id) FROM picked p)
                ELSE greatest(cur.position,
                              coalesce((SELECT max(m.id) FROM inturn_message m
                                         WHERE m.channel = %(channel)s), 0))
           END
      FROM cur
    ON CONFLICT (destination) DO UPDATE
       SET position = greatest(c.position, EXCLUDED.position), channel = EXCLUDED.channel
    RETURNING c.position
)
SELECT (SELECT held FROM lease) AS held, (SELECT count(*) FROM pulled) AS pulled,
       (SELECT position FROM moved) AS position;

-- name: pull_unlinked
-- The pull as it was before migration 0041 (no re-send links: the log has no resent_from
-- column yet, and no ingest writes a re-send row before it): a worker started before
-- `inturn migrate` pulls with it while the column is missing (inturn.worker.store.delivery.pull).
-- A destination's pull from its channel's log: the log rows past its cursor whose route set
-- names it become slim rows of its queue (no payload: they read it through message_id), in
-- log order, up to "limit"; the cursor moves to the last row pulled when the limit was
-- reached, else to the highest log id of the channel this statement's snapshot sees (every
-- lower id of the channel has committed or never will: ingest draws a channel's ids under
-- the channel's enqueue lock). It never moves back. Run under pull_lock, in its transaction.
-- Guarded by the lease: held NULL and nothing written when it is lost.
WITH
-- include: lease_guard
, cur AS (
    SELECT coalesce((SELECT c.position FROM inturn_cursor c
                      WHERE c.destination = %(destination)s), 0) AS position
      FROM lease
),
picked AS (
    SELECT m.id, m.control_id, m.message_type, m.size, m.patient_keys, m.traceparent,
           m.enqueued_at
      FROM cur
      JOIN inturn_message m ON m.channel = %(channel)s AND m.id > cur.position
     WHERE m.route = ANY (ARRAY(SELECT r.id FROM inturn_route r
                                 WHERE r.channel = %(channel)s
                                   AND r.destinations @> ARRAY[%(destination)s::text]))
     ORDER BY m.id
     LIMIT %(limit)s
),
pulled AS (
    INSERT INTO inturn_delivery
           (destination, channel, control_id, message_type, size, patient_keys, traceparent,
            enqueued_at, message_id)
    SELECT %(destination)s, %(channel)s, p.control_id, p.message_type, p.size, p.patient_keys,
           p.traceparent, p.enqueued_at, p.id
      FROM picked p
     ORDER BY p.id
    RETURNING id
),
moved AS (
    INSERT INTO inturn_cursor AS c (destination, channel, position)
    SELECT %(destination)s, %(channel)s,
           CASE WHEN (SELECT count(*) FROM picked) >= %(limit)s
                THEN (SELECT max(p.id) FROM picked p)
                ELSE greatest(cur.position,
                              coalesce((SELECT max(m.id) FROM inturn_message m
                                         WHERE m.channel = %(channel)s), 0))
           END
      FROM cur
    ON CONFLICT (destination) DO UPDATE
       SET position = greatest(c.position, EXCLUDED.position), channel = EXCLUDED.channel
    RETURNING c.position
)
SELECT (SELECT held FROM lease) AS held, (SELECT count(*) FROM pulled) AS pulled,
       (SELECT position FROM moved) AS position;

-- name: blocked
SELECT EXISTS (
    SELECT 1 FROM inturn_delivery WHERE destination = %(destination)s AND state = 'pending'
) AS blocked;

-- name: head
-- The head is the oldest pending item, due or not: nothing overtakes an item backing off.
-- "after" is a keyset bound (0 for none): the worker passes the id it finished last, so the
-- scan starts there instead of stepping over every row delivered since the statistics were
-- taken (the planner may walk the primary key when it believes every row is pending).
-- A destination on hold (held_at set by `queue suspend`, the console or a restore found) has
-- no head; on_hold says so, so that its worker measures its depth instead of calling it empty.
-- Guarded by the lease: no row at all when it is lost; "held" and NULL columns when nothing
-- is pending. The columns are what a send and its marks need (model.Sendable), no more.
-- A slim row's payload is its log message's, read from that message's partition only
-- (inturn_log_payload_rows, once, for the row chosen): the cost does not follow the days kept.
WITH
-- include: lease_guard
SELECT lease.held, h.id, h.channel, h.control_id, h.message_type, h.attempts,
       -- include: log_binding
       h.traceparent, h.wait_seconds,
       EXISTS (SELECT 1 FROM inturn_destination held
                WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
           AS on_hold
  FROM lease
  LEFT JOIN LATERAL (
       SELECT d.id, d.channel, d.control_id, d.message_type, d.attempts,
              -- include: own_binding
              d.traceparent,
              greatest(0, extract(epoch FROM d.next_attempt - clock_timestamp()))::float8
                  AS wait_seconds
         FROM inturn_delivery d
        WHERE d.destination = %(destination)s AND d.state = 'pending' AND d.id > %(after)s
          AND NOT EXISTS (SELECT 1 FROM inturn_destination held
                           WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
        ORDER BY d.id
        LIMIT 1) AS h ON TRUE
  LEFT JOIN LATERAL inturn_log_payload_rows(h.log_id) AS m ON TRUE;

-- name: poll_head
-- A pooled worker's wake-up probe (no LISTEN behind a transaction pooler): the head's id and
-- whether it is due, nothing else (no payload, no write). A destination on hold has no head.
-- With nothing pending in its queue, a message of the channel log routed to it past its
-- cursor (migration 0033) is a due head too (its log id): the worker wakes and pulls it.
SELECT p.id, p.due
  FROM ((SELECT d.id, d.next_attempt <= clock_timestamp() AS due, 1 AS part
           FROM inturn_delivery d
          WHERE d.destination = %(destination)s AND d.state = 'pending'
          ORDER BY d.id
          LIMIT 1)
        UNION ALL
        (SELECT m.id, true AS due, 2 AS part
           FROM inturn_cursor c
           JOIN inturn_message m ON m.channel = c.channel AND m.id > c.position
          WHERE c.destination = %(destination)s
            AND m.route = ANY (ARRAY(SELECT r.id FROM inturn_route r
                                      WHERE r.channel = c.channel
                                        AND r.destinations @> ARRAY[%(destination)s::text]))
          ORDER BY m.id
          LIMIT 1)) AS p
 WHERE NOT EXISTS (SELECT 1 FROM inturn_destination held
                    WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
 ORDER BY p.part
 LIMIT 1;

-- fragment: next_head_after_mark
-- The next head above the one just marked (the snapshot is from before the mark, in which it
-- is still pending), only while the lease holds; NULL columns when nothing is pending, and
-- on_hold true when the destination is on hold (as in head).
-- The payload as in head: from the log message's own partition (inturn_log_payload_rows).
SELECT (SELECT held FROM lease) AS held, (SELECT waited_seconds FROM done) AS waited_seconds,
       h.id, h.channel, h.control_id, h.message_type, h.attempts,
       -- log_binding's text (a fragment includes no other)
       coalesce(h.own_payload, m.payload) AS payload,
       CASE WHEN h.own_payload IS NOT NULL THEN h.own_seal_id ELSE m.seal_id END AS seal_id,
       CASE WHEN h.own_payload IS NOT NULL THEN h.own_seal_scope ELSE m.seal_scope END
           AS seal_scope,
       h.traceparent, h.wait_seconds,
       EXISTS (SELECT 1 FROM inturn_destination held
                WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
           AS on_hold
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
       SELECT d.id, d.channel, d.control_id, d.message_type, d.attempts,
              -- own_binding's text
              d.payload AS own_payload, coalesce(d.seal_id, d.id) AS own_seal_id,
              coalesce(d.seal_scope, d.destination) AS own_seal_scope,
              CASE WHEN d.payload IS NULL THEN d.message_id END AS log_id,
              d.traceparent,
              greatest(0, extract(epoch FROM d.next_attempt - clock_timestamp()))::float8
                  AS wait_seconds
         FROM inturn_delivery d
        WHERE d.destination = %(destination)s AND d.state = 'pending' AND d.id > %(id)s
          AND EXISTS (SELECT 1 FROM lease)
          AND NOT EXISTS (SELECT 1 FROM inturn_destination held
                           WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
        ORDER BY d.id
        LIMIT 1) AS h ON TRUE
  LEFT JOIN LATERAL inturn_log_payload_rows(h.log_id) AS m ON TRUE;

-- name: succeeded_next
-- Mark the head delivered and read the next head, in one round trip and one commit. The SELECT
-- sees the snapshot from before the UPDATE, in which the head is still pending: "id > head"
-- skips it. A skip or drain that landed while the head was being sent lost the race: the
-- receiver has it, so it is marked delivered (decided_by keeps who tried). waited_seconds is
-- NULL when the head is gone (erased); held is NULL when the lease is lost (nothing changed).
-- A message the packs record nothing for (every message but spec.replies' orders) takes this
-- one; succeeded_next_expecting is the same with the replies the order now waits for.
WITH
-- include: lease_guard
, done AS (
    UPDATE inturn_delivery
       SET state = 'delivered', attempts = %(attempts)s,
           last_attempt = clock_timestamp(), finished_at = clock_timestamp()
     WHERE id = %(id)s AND destination = %(destination)s AND state IN ('pending', 'skipped')
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING extract(epoch FROM finished_at - enqueued_at)::float8 AS waited_seconds
)
-- include: next_head_after_mark

-- name: succeeded_next_expecting
-- succeeded_next, recording in the same statement the replies the delivered order now waits
-- for (spec.replies), so only if the mark is written. reply_types: comma-separated patterns.
WITH
-- include: lease_guard
, done AS (
    UPDATE inturn_delivery
       SET state = 'delivered', attempts = %(attempts)s,
           last_attempt = clock_timestamp(), finished_at = clock_timestamp()
     WHERE id = %(id)s AND destination = %(destination)s AND state IN ('pending', 'skipped')
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING id, control_id, message_type,
              extract(epoch FROM finished_at - enqueued_at)::float8 AS waited_seconds
),
expected AS (
    INSERT INTO inturn_order_expectation
           (destination, delivery_id, control_id, message_type, order_key, key_digest,
            reply_channel, reply_types, due_at)
    SELECT %(destination)s, done.id, done.control_id, done.message_type, e.k, e.d, e.c,
           string_to_array(e.t, ','), clock_timestamp() + make_interval(secs => e.w)
      FROM done
     CROSS JOIN unnest(%(keys)s::text[], %(digests)s::text[], %(channels)s::text[],
                       %(types)s::text[], %(within)s::int[]) AS e(k, d, c, t, w)
)
-- include: next_head_after_mark

-- name: retry
-- Touches no indexed column, so the update can stay heap-only. The attempt is kept in the item's
-- history (inturn_attempt) by the same statement. Guarded by the lease: held 0 when it is lost
-- (nothing changed); changed 0 when the item is no longer pending.
WITH
-- include: lease_guard
, failed AS (
    UPDATE inturn_delivery
       SET attempts = %(attempts)s,
           next_attempt = clock_timestamp() + make_interval(secs => %(delay_seconds)s),
           last_attempt = clock_timestamp(),
           last_error = %(cause)s,
           reason = coalesce(reason, %(cause)s)
     WHERE id = %(id)s AND destination = %(destination)s AND state = 'pending'
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING id
),
history AS (
    INSERT INTO inturn_attempt (item_id, attempt, outcome, error)
    SELECT id, %(attempts)s, 'retry', %(cause)s FROM failed
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM history) AS changed;

-- name: reserve_sequence
-- The MSH-13 sequence number of a pending message (migration 0045): the one it was given at an
-- earlier attempt, else the destination's next (its counter moves on in the same statement).
-- Guarded by the lease: held 0 when it is lost (nothing changed); number NULL when the message
-- is no longer pending (skipped or erased meanwhile).
WITH
-- include: lease_guard
, item AS (
    SELECT d.id FROM inturn_delivery d
     WHERE d.id = %(id)s AND d.destination = %(destination)s AND d.state = 'pending'
       AND EXISTS (SELECT 1 FROM lease)
),
had AS (
    SELECT s.number FROM inturn_sequence_number s JOIN item ON item.id = s.item_id
),
bumped AS (
    INSERT INTO inturn_sequence AS q (destination, last)
    SELECT %(destination)s, 1 FROM item WHERE NOT EXISTS (SELECT 1 FROM had)
    ON CONFLICT (destination) DO UPDATE SET last = q.last + 1
    RETURNING last
),
given AS (
    INSERT INTO inturn_sequence_number (item_id, destination, number)
    SELECT %(id)s, %(destination)s, last FROM bumped
    RETURNING number
)
SELECT (SELECT count(*) FROM lease) AS held,
       coalesce((SELECT number FROM had), (SELECT number FROM given)) AS number;

-- name: make_due_unreachable
-- Every pending row of a destination held for an unreachable receiver is due now (the lanes: a
-- probe found the receiver accepting connections again); a row backing off after a receiver's
-- refusal keeps its backoff. No attempt is recorded; guarded by the lease.
WITH
-- include: lease_guard
, due AS (
    UPDATE inturn_delivery
       SET next_attempt = clock_timestamp()
     WHERE destination = %(destination)s AND state = 'pending'
       AND next_attempt > clock_timestamp() AND starts_with(last_error, 'unreachable:')
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING id
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT array_agg(id) FROM due) AS ids;

-- name: make_due
-- The head held for an unreachable receiver is due now: a probe found the receiver accepting
-- connections again (inturn.worker.drain.stream). Touches only the head's next_attempt (no
-- attempt is recorded); guarded by the lease: held 0 when it is lost (nothing changed).
WITH
-- include: lease_guard
, due AS (
    UPDATE inturn_delivery
       SET next_attempt = clock_timestamp()
     WHERE id = (SELECT id FROM inturn_delivery
                  WHERE destination = %(destination)s AND state = 'pending'
                  ORDER BY id LIMIT 1)
       AND next_attempt > clock_timestamp()
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING id
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM due) AS changed;

-- name: succeeded
-- As succeeded_next: a skip that raced with the send loses, the item was delivered. Guarded by
-- the lease: held 0 when it is lost; waited_seconds NULL when the item is gone.
WITH
-- include: lease_guard
, done AS (
    UPDATE inturn_delivery
       SET state = 'delivered', attempts = %(attempts)s,
           last_attempt = clock_timestamp(), finished_at = clock_timestamp()
     WHERE id = %(id)s AND destination = %(destination)s AND state IN ('pending', 'skipped')
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING extract(epoch FROM finished_at - enqueued_at)::float8 AS waited_seconds
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT waited_seconds FROM done) AS waited_seconds;

-- name: gave_up
-- Guarded by the lease like retry: held 0 when it is lost; changed 0 when no longer pending.
WITH
-- include: lease_guard
, failed AS (
    UPDATE inturn_delivery
       SET state = 'failed', attempts = %(attempts)s,
           last_attempt = clock_timestamp(), finished_at = clock_timestamp(),
           last_error = %(cause)s, reason = coalesce(reason, %(cause)s)
     WHERE id = %(id)s AND destination = %(destination)s AND state = 'pending'
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING id
),
history AS (
    INSERT INTO inturn_attempt (item_id, attempt, outcome, error)
    SELECT id, %(attempts)s, 'failed', %(cause)s FROM failed
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) AS held, (SELECT count(*) FROM history) AS changed;

-- name: retry_now_one
UPDATE inturn_delivery
   SET attempts = 0, next_attempt = clock_timestamp()
 WHERE id = %(id)s AND state = 'pending'
RETURNING id, destination;

-- name: retry_now_all
UPDATE inturn_delivery
   SET attempts = 0, next_attempt = clock_timestamp()
 WHERE destination = %(destination)s AND state = 'pending'
RETURNING id, destination;

-- name: skip
UPDATE inturn_delivery
   SET state = 'skipped', decided_by = %(who)s, finished_at = clock_timestamp()
 WHERE id = %(id)s AND state = 'pending'
RETURNING id, destination;

-- name: pull_for
-- One batch of a destination's pull from its channel's log on behalf of a person or the
-- sweeper (inturn_pull_for, migration 0038: no lease; the destination's enqueue lock is held
-- until COMMIT). The rows pulled; fewer than "limit": nothing more was there.
SELECT inturn_pull_for(%(destination)s, %(limit)s) AS pulled;

-- name: drain
UPDATE inturn_delivery
   SET state = 'skipped', decided_by = %(who)s, finished_at = clock_timestamp()
 WHERE destination = %(destination)s AND state = 'pending'
RETURNING id;

-- name: remove
DELETE FROM inturn_delivery
 WHERE id = ANY(%(ids)s) AND state <> 'pending'
RETURNING id, destination, state;

-- name: erase_scope
-- What an erasure reaches (the channel log, migration 0033: a message is stored once for
-- every destination): the log messages of the items named ("ids": their message_id; a
-- negative id, as the lookups list a message not pulled yet: minus its log id) and, by
-- patient ("keys": every stored form of the patient's key, or NULL), the log messages that
-- name the patient, pulled or not; and the destinations whose enqueue locks the erasure takes
-- first, sorted (those of the items, and every destination the messages' route sets name), so
-- that no pull copies a message while it is being erased.
WITH named AS (
    SELECT message_id, destination FROM inturn_delivery WHERE id = ANY(%(ids)s::bigint[])
    UNION
    SELECT message_id, destination FROM inturn_history WHERE id = ANY(%(ids)s::bigint[])
),
messages AS (
    SELECT m.id, m.route
      FROM inturn_message m
     WHERE m.id IN (SELECT message_id FROM named WHERE message_id IS NOT NULL)
        OR m.id IN (SELECT -i FROM unnest(%(ids)s::bigint[]) AS i WHERE i < 0)
        OR (%(keys)s::text[] IS NOT NULL AND m.patient_keys && %(keys)s::text[])
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM messages) AS messages,
       (SELECT coalesce(array_agg(d ORDER BY d), '{}')
          FROM (SELECT destination AS d FROM named
                UNION
                SELECT u.d FROM inturn_route r
                 CROSS JOIN LATERAL unnest(r.destinations) AS u(d)
                 WHERE r.id IN (SELECT route FROM messages)) AS x) AS destinations;

-- name: erase_locks
-- erase_scope's enqueue locks, in its (sorted) order, by a statement of their own: the erase
-- statement that follows sees every pull that committed before them.
SELECT count(inturn_enqueue_lock(d)) AS locked
  FROM unnest(%(destinations)s::text[]) WITH ORDINALITY AS u(d, n);

-- name: erase
-- The messages, and what was recorded of them: the replies an erased order expected; in the
-- hot table and in history (migration 0034: by the id index of each history partition); and,
-- for the channel log (migration 0033), each message once: its log row and every
-- destination's row that names it ("messages", from erase_scope).
-- A message's rows are found by its MSH-10 (the hash indexes; in a day of history made since
-- migration 0056, its GIN over ARRAY[left(control_id, 200)]) and its id.
WITH msg AS (
    SELECT id, control_id FROM inturn_message WHERE id = ANY(%(messages)s::bigint[])
),
rows AS (
    SELECT id FROM inturn_delivery WHERE id = ANY(%(ids)s::bigint[])
    UNION
    SELECT d.id FROM msg
      JOIN inturn_delivery d ON d.control_id = msg.control_id AND d.message_id = msg.id
    UNION
    SELECT id FROM inturn_history WHERE id = ANY(%(ids)s::bigint[])
    UNION
    SELECT h.id FROM msg
      JOIN inturn_history h ON h.control_id = msg.control_id AND h.message_id = msg.id
                           -- a day made since migration 0056 indexes MSH-10 so (GIN)
                           AND ARRAY[left(h.control_id, 200)] @> ARRAY[left(msg.control_id, 200)]
),
expectations AS (
    DELETE FROM inturn_order_expectation WHERE delivery_id IN (SELECT id FROM rows)
),
hot AS (
    DELETE FROM inturn_delivery
     WHERE id IN (SELECT id FROM rows)
    RETURNING id, destination, state, message_id
),
moved AS (
    DELETE FROM inturn_history
     WHERE id IN (SELECT id FROM rows)
    RETURNING id, destination, state, message_id
),
logged AS (
    DELETE FROM inturn_message
     WHERE id = ANY(%(messages)s::bigint[])
    RETURNING id, route
)
-- every row deleted, and each log message deleted that no deleted row named (no destination
-- had pulled it), as minus its log id with the destinations its route set names
SELECT id, destination, state FROM hot
UNION ALL
SELECT id, destination, state FROM moved
UNION ALL
SELECT -l.id, r.destinations[1], 'pending'
  FROM logged l
  JOIN inturn_route r ON r.id = l.route
 WHERE NOT EXISTS (SELECT 1 FROM hot WHERE hot.message_id = l.id)
   AND NOT EXISTS (SELECT 1 FROM moved WHERE moved.message_id = l.id);

-- name: purge_batch
-- One batch of finished items older than the cutoff, in one short transaction, deleted by the
-- function of migration 0011 (the purge role may call it, and has no DELETE of its own).
-- Since migration 0031 it keeps a row a pending worklist item names (a given-up message still
-- to resend, an expired one) and an order whose reply is still awaited or raised.
SELECT id FROM inturn_purge_deliveries(%(state)s, %(cutoff)s, %(batch)s) AS deleted(id);

-- name: purge_count
-- What purge_batch would remove of one state, all batches together (inturn purge --dry-run).
SELECT inturn_purge_deliveries_count(%(state)s, %(cutoff)s) AS n;

-- name: audit
INSERT INTO inturn_audit (who, action, destination, item_ids, why)
VALUES (%(who)s, %(action)s, %(destination)s, %(ids)s, %(why)s);

-- name: list_items
-- A page of items newest first, never payloads. Every filter is optional (NULL: not filtered);
-- "before" is a keyset cursor (the last id of the previous page);
-- run unprepared, so that each call is planned with its filters and control_id uses its index.
-- It reads no patient key, so the reader role may run it (list_items_by_patient does).
-- Finished items moved to history (migration 0034) are listed with the hot table's: each part
-- gives its own first page, the parts are merged. By MSH-10 or by destination, a message of
-- the channel log (migration 0033) that a destination its route set names has not pulled yet
-- is listed too, once per such destination, pending, with the negative of its log id as its
-- id (after every row: ids below 0 are not items of the queue yet; the log's hash index on
-- MSH-10 finds it, or the range past the destination's cursor).
-- The page is cut by rank, never between the lines of one message (which share their id): a
-- page may hold more than "limit" lines, and "before" then moves past the message whole.
SELECT id, channel, destination, control_id, message_type, size, state, attempts,
       enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
       resent_as, resent_from
  FROM (SELECT x.*, rank() OVER (ORDER BY x.id DESC) AS rk
          FROM (
        (SELECT id, channel, destination, control_id, message_type, size, state, attempts,
                enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
                resent_as, resent_from
           FROM inturn_delivery
          WHERE (%(destination)s::text IS NULL OR destination = %(destination)s::text)
            AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
            AND (%(state)s::text IS NULL OR state = %(state)s::text)
            AND (%(control_id)s::text IS NULL OR control_id = %(control_id)s::text)
            AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
          -- With an identifier filter, "id + 0" keeps the planner from walking the primary key
          -- backwards in the hope of meeting the few matches early (it reads the whole table when they
          -- are old): the identifier index finds them and they are sorted. The CASE folds away.
          ORDER BY CASE WHEN %(control_id)s::text IS NULL THEN id ELSE id + 0 END DESC
          LIMIT %(limit)s::bigint + %(offset)s::bigint)
        UNION ALL
        (SELECT id, channel, destination, control_id, message_type, size, state, attempts,
                enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
                resent_as, resent_from
           FROM inturn_history
          WHERE (%(destination)s::text IS NULL OR destination = %(destination)s::text)
            AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
            AND (%(state)s::text IS NULL OR state = %(state)s::text)
            AND (%(control_id)s::text IS NULL
                 OR (control_id = %(control_id)s::text
                     AND ARRAY[left(control_id, 200)] @> ARRAY[left(%(control_id)s::text, 200)]))
            AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
          ORDER BY CASE WHEN %(control_id)s::text IS NULL THEN id ELSE id + 0 END DESC
          LIMIT %(limit)s::bigint + %(offset)s::bigint)
        UNION ALL
        (SELECT -m.id AS id, m.channel, u.d AS destination, m.control_id, m.message_type, m.size,
                'pending' AS state, 0 AS attempts, m.enqueued_at, m.enqueued_at AS next_attempt,
                NULL::timestamptz AS last_attempt, NULL::text AS last_error, NULL::text AS reason,
                NULL::text AS decided_by, NULL::timestamptz AS finished_at,
                NULL::bigint AS resent_as, NULL::bigint AS resent_from
           FROM inturn_message m
           JOIN inturn_route r ON r.id = m.route
          CROSS JOIN LATERAL unnest(r.destinations) AS u(d)
          WHERE (%(control_id)s::text IS NOT NULL OR %(destination)s::text IS NOT NULL)
            AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                  WHERE c.destination = u.d), 0)
            -- one destination's: the log past its cursor only (an index range)
            AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                  WHERE c.destination = %(destination)s::text), 0)
            AND (%(destination)s::text IS NULL OR u.d = %(destination)s::text)
            AND (%(channel)s::text IS NULL OR m.channel = %(channel)s::text)
            AND (%(state)s::text IS NULL OR %(state)s::text = 'pending')
            AND (%(control_id)s::text IS NULL OR m.control_id = %(control_id)s::text)
            AND (%(before)s::bigint IS NULL OR -m.id < %(before)s::bigint)
          ORDER BY m.id
          -- one line a message for one destination: its page bound is safe there
          LIMIT CASE WHEN %(destination)s::text IS NOT NULL
                     THEN %(limit)s::bigint + %(offset)s::bigint END)
        ) AS x) AS y
 WHERE rk > %(offset)s AND rk <= %(limit)s::bigint + %(offset)s::bigint
 ORDER BY id DESC, destination;

-- name: count_items
-- How many items list_items would find without its page bounds (hot table, history, and by
-- MSH-10 the log's messages not pulled yet).
SELECT (SELECT count(*)
          FROM inturn_delivery
         WHERE (%(destination)s::text IS NULL OR destination = %(destination)s::text)
           AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
           AND (%(state)s::text IS NULL OR state = %(state)s::text)
           AND (%(control_id)s::text IS NULL OR control_id = %(control_id)s::text))
     + (SELECT count(*)
          FROM inturn_history
         WHERE (%(destination)s::text IS NULL OR destination = %(destination)s::text)
           AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
           AND (%(state)s::text IS NULL OR state = %(state)s::text)
           AND (%(control_id)s::text IS NULL
                OR (control_id = %(control_id)s::text
                    AND ARRAY[left(control_id, 200)] @> ARRAY[left(%(control_id)s::text, 200)])))
     + (SELECT count(*)
          FROM inturn_message m
          JOIN inturn_route r ON r.id = m.route
         CROSS JOIN LATERAL unnest(r.destinations) AS u(d)
         WHERE (%(control_id)s::text IS NOT NULL OR %(destination)s::text IS NOT NULL)
           AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                 WHERE c.destination = u.d), 0)
           AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                 WHERE c.destination = %(destination)s::text), 0)
           AND (%(destination)s::text IS NULL OR u.d = %(destination)s::text)
           AND (%(channel)s::text IS NULL OR m.channel = %(channel)s::text)
           AND (%(state)s::text IS NULL OR %(state)s::text = 'pending')
           AND (%(control_id)s::text IS NULL OR m.control_id = %(control_id)s::text)) AS total;

-- name: list_items_by_patient
-- list_items of one patient identifier index key (its GIN index finds them; "id + 0" as above).
-- patient_key: the key's forms, comma-separated (plain and blind while both exist; any matches).
-- also: ids found by reading the payloads of rows the index could not answer for (capped_batch,
-- unindexed_batch), which the primary key finds. A message of the channel log naming the
-- patient that a destination has not pulled yet is listed as list_items lists it by MSH-10
-- (the log's GIN index finds it).
SELECT id, channel, destination, control_id, message_type, size, state, attempts,
       enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at
  FROM (SELECT x.*, rank() OVER (ORDER BY x.id DESC) AS rk
          FROM (
        (SELECT id, channel, destination, control_id, message_type, size, state, attempts,
                enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at
           FROM inturn_delivery
          WHERE (patient_keys && string_to_array(%(patient_key)s::text, ',')
                 OR id = ANY(%(also)s::bigint[]))
            AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
            AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
            AND (%(state)s::text IS NULL OR state = %(state)s::text)
            AND (%(control_id)s::text IS NULL OR control_id = %(control_id)s::text)
            AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
          ORDER BY id + 0 DESC
          LIMIT %(limit)s::bigint + %(offset)s::bigint)
        UNION ALL
        (SELECT id, channel, destination, control_id, message_type, size, state, attempts,
                enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at
           FROM inturn_history
          WHERE (patient_keys && string_to_array(%(patient_key)s::text, ',')
                 OR id = ANY(%(also)s::bigint[]))
            AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
            AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
            AND (%(state)s::text IS NULL OR state = %(state)s::text)
            AND (%(control_id)s::text IS NULL OR control_id = %(control_id)s::text)
            AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
          ORDER BY id + 0 DESC
          LIMIT %(limit)s::bigint + %(offset)s::bigint)
        UNION ALL
        (SELECT -m.id AS id, m.channel, u.d AS destination, m.control_id, m.message_type, m.size,
                'pending' AS state, 0 AS attempts, m.enqueued_at, m.enqueued_at AS next_attempt,
                NULL::timestamptz AS last_attempt, NULL::text AS last_error, NULL::text AS reason,
                NULL::text AS decided_by, NULL::timestamptz AS finished_at
           FROM inturn_message m
           JOIN inturn_route r ON r.id = m.route
          CROSS JOIN LATERAL unnest(r.destinations) AS u(d)
          WHERE m.patient_keys && string_to_array(%(patient_key)s::text, ',')
            AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                  WHERE c.destination = u.d), 0)
            AND (%(destination)s::text IS NULL OR u.d = %(destination)s::text)
            AND (%(channel)s::text IS NULL OR m.channel = %(channel)s::text)
            AND (%(state)s::text IS NULL OR %(state)s::text = 'pending')
            AND (%(control_id)s::text IS NULL OR m.control_id = %(control_id)s::text)
            AND (%(before)s::bigint IS NULL OR -m.id < %(before)s::bigint))
        ) AS x) AS y
 WHERE rk > %(offset)s AND rk <= %(limit)s::bigint + %(offset)s::bigint
 ORDER BY id DESC, destination;

-- name: count_items_by_patient
SELECT (SELECT count(*)
          FROM inturn_delivery
         WHERE (patient_keys && string_to_array(%(patient_key)s::text, ',')
                OR id = ANY(%(also)s::bigint[]))
           AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
           AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
           AND (%(state)s::text IS NULL OR state = %(state)s::text)
           AND (%(control_id)s::text IS NULL OR control_id = %(control_id)s::text))
     + (SELECT count(*)
          FROM inturn_history
         WHERE (patient_keys && string_to_array(%(patient_key)s::text, ',')
                OR id = ANY(%(also)s::bigint[]))
           AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
           AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
           AND (%(state)s::text IS NULL OR state = %(state)s::text)
           AND (%(control_id)s::text IS NULL OR control_id = %(control_id)s::text))
     + (SELECT count(*)
          FROM inturn_message m
          JOIN inturn_route r ON r.id = m.route
         CROSS JOIN LATERAL unnest(r.destinations) AS u(d)
         WHERE m.patient_keys && string_to_array(%(patient_key)s::text, ',')
           AND m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                 WHERE c.destination = u.d), 0)
           AND (%(destination)s::text IS NULL OR u.d = %(destination)s::text)
           AND (%(channel)s::text IS NULL OR m.channel = %(channel)s::text)
           AND (%(state)s::text IS NULL OR %(state)s::text = 'pending')
           AND (%(control_id)s::text IS NULL OR m.control_id = %(control_id)s::text)) AS total;

-- name: scan_payloads
-- Keyset pages of every held item with its payload (a data-subject search without the index);
-- a slim row reads its log row's, with the binding each was sealed under (payload_binding).
SELECT d.id, d.destination, d.channel, d.state, d.message_type,
       coalesce(d.payload, m.payload) AS payload,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_id, d.id)
            ELSE coalesce(m.seal_id, m.id) END AS seal_id,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_scope, d.destination)
            ELSE coalesce(m.seal_scope, 'channel:' || m.channel) END AS seal_scope
  FROM inturn_delivery d
  LEFT JOIN inturn_message m ON m.id = d.message_id AND d.payload IS NULL
 WHERE d.id > %(after)s
 ORDER BY d.id
 LIMIT %(batch)s;

-- name: scan_log_payloads
-- scan_payloads for the channel log (migration 0033): keyset pages of its messages that some
-- destination has not pulled yet (those pulled are read through their rows), each as get_item
-- shows it (minus its log id, the first such destination) with its payload and binding.
SELECT -m.id AS id, w.d AS destination, m.channel, 'pending' AS state, m.message_type,
       m.payload, coalesce(m.seal_id, m.id) AS seal_id,
       coalesce(m.seal_scope, 'channel:' || m.channel) AS seal_scope, m.id AS log_id
  FROM inturn_message m
  JOIN inturn_route r ON r.id = m.route
 CROSS JOIN LATERAL (
       SELECT u.d FROM unnest(r.destinations) AS u(d)
        WHERE m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                WHERE c.destination = u.d), 0)
        ORDER BY u.d LIMIT 1) AS w
 WHERE m.id > %(after)s
 ORDER BY m.id
 LIMIT %(batch)s;

-- name: get_item
-- The hot table's row, else the history's (a finished item moved there). A negative id names
-- a message of the channel log not pulled yet, as the lookups list it (migration 0038): it is
-- shown pending for the first destination its route set names that has not pulled it.
(SELECT id, channel, destination, control_id, message_type, size, state, attempts,
        enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
        resent_as, resent_from
   FROM inturn_delivery WHERE id = %(id)s)
UNION ALL
(SELECT id, channel, destination, control_id, message_type, size, state, attempts,
        enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
        resent_as, resent_from
   FROM inturn_history WHERE id = %(id)s)
UNION ALL
(SELECT -m.id, m.channel, w.d, m.control_id, m.message_type, m.size, 'pending', 0,
        m.enqueued_at, m.enqueued_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL
   FROM inturn_message m
   JOIN inturn_route r ON r.id = m.route
  CROSS JOIN LATERAL (
        SELECT u.d FROM unnest(r.destinations) AS u(d)
         WHERE m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                 WHERE c.destination = u.d), 0)
         ORDER BY u.d LIMIT 1) AS w
  WHERE %(id)s::bigint < 0 AND m.id = -%(id)s::bigint)
LIMIT 1;

-- name: get_for_resend
-- The items to resend, oldest first (original order), locked against a second resend racing,
-- from the hot table and from history; a slim row's payload is its log row's, each with the
-- binding it was sealed under.
WITH hot AS (
    SELECT id, channel, destination, control_id, message_type, payload, state, resent_as,
           seal_id, seal_scope, message_id
      FROM inturn_delivery WHERE id = ANY(%(ids)s::bigint[])
       FOR UPDATE
), old AS (
    SELECT id, channel, destination, control_id, message_type, payload, state, resent_as,
           seal_id, seal_scope, message_id
      FROM inturn_history WHERE id = ANY(%(ids)s::bigint[])
       FOR UPDATE
)
SELECT o.id, o.channel, o.destination, o.control_id, o.message_type,
       coalesce(o.payload, m.payload) AS payload, o.state, o.resent_as,
       CASE WHEN o.payload IS NOT NULL THEN coalesce(o.seal_id, o.id)
            ELSE coalesce(m.seal_id, m.id) END AS seal_id,
       CASE WHEN o.payload IS NOT NULL THEN coalesce(o.seal_scope, o.destination)
            ELSE coalesce(m.seal_scope, 'channel:' || m.channel) END AS seal_scope
  FROM (SELECT * FROM hot UNION ALL SELECT * FROM old) AS o
  LEFT JOIN inturn_message m ON m.id = o.message_id AND o.payload IS NULL
 ORDER BY o.id;

-- name: lock_and_draw_ids
-- A resend's first write: the enqueue locks of its destinations (sorted, as every enqueue takes
-- them), then n row IDs drawn under them, so that ID order stays commit order.
WITH locked AS MATERIALIZED (
    SELECT count(inturn_enqueue_lock(s.d)) AS n
      FROM (SELECT d FROM unnest(%(destinations)s::text[]) AS d ORDER BY d) AS s
)
SELECT nextval(pg_get_serial_sequence('inturn_delivery', 'id')) AS id
  FROM generate_series(1, %(n)s) AS g(i)
 WHERE (SELECT n FROM locked) >= 0
 ORDER BY g.i;

-- name: resend_copies
-- Every copy of a resend in ONE statement: the copies inserted with their drawn IDs (each
-- pointing at its original), each original pointing at its copy, one NOTIFY per destination.
-- keys: each copy's identifier index keys, one comma-separated string per copy. Each original
-- is pointed at its copy by the insertion (migration 0032's trigger); this transaction's own
-- audit row names them all, so the trigger writes none (inturn.resend_audited).
WITH audited AS MATERIALIZED (
    SELECT set_config('inturn.resend_audited', 'on', true) AS flag
),
copy AS (
    SELECT c.id, c.original, c.payload, c.size, c.keys
      FROM unnest(%(ids)s::bigint[], %(originals)s::bigint[], %(payloads)s::bytea[],
                  %(sizes)s::int[], %(keys)s::text[]) AS c(id, original, payload, size, keys)
),
inserted AS (
    INSERT INTO inturn_delivery
           (id, destination, channel, control_id, message_type, payload, size, patient_keys,
            resent_from)
    OVERRIDING SYSTEM VALUE
    SELECT c.id, o.destination, o.channel, o.control_id, o.message_type, c.payload, c.size,
           string_to_array(c.keys, ','), c.original
      FROM copy c
      JOIN (SELECT id, destination, channel, control_id, message_type FROM inturn_delivery
             WHERE id = ANY(%(originals)s::bigint[])
            UNION ALL
            SELECT id, destination, channel, control_id, message_type FROM inturn_history
             WHERE id = ANY(%(originals)s::bigint[])) AS o ON o.id = c.original
     WHERE (SELECT flag FROM audited) = 'on'
     ORDER BY c.id
    RETURNING id
),
notified AS (
    SELECT count(pg_notify(u.c, u.d)) AS n
      FROM unnest(%(channels)s::text[], %(destinations)s::text[]) AS u(c, d)
)
SELECT (SELECT count(*) FROM inserted) AS inserted, (SELECT n FROM notified) AS notified;

-- name: oldest_pending
-- A destination's head as a person sees it: its oldest pending item (on hold or not), with the
-- seconds until its next attempt. Never the payload. With no pending row, the first message of
-- its channel's log it has not pulled yet (migration 0038), as the lookups list one: pending,
-- the negative of its log id as its id.
(SELECT id, channel, destination, control_id, message_type, size, state, attempts,
        enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
        resent_as, resent_from,
        greatest(0, extract(epoch FROM next_attempt - clock_timestamp()))::float8 AS wait_seconds
   FROM inturn_delivery
  WHERE destination = %(destination)s AND state = 'pending'
  ORDER BY id
  LIMIT 1)
UNION ALL
(SELECT -m.id, m.channel, u.destination, m.control_id, m.message_type, m.size, 'pending', 0,
        m.enqueued_at, m.enqueued_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0::float8
   FROM inturn_unpulled(%(destination)s) AS u
   JOIN inturn_message m ON m.id = u.first_id)
LIMIT 1;

-- name: resend_candidates
-- The failed items of a destination that still need a person (never resent), oldest first,
-- optionally only those whose MSH-9 matches a LIKE pattern; at most %(limit)s.
SELECT id
  FROM inturn_delivery
 WHERE destination = %(destination)s AND state = 'failed' AND resent_as IS NULL
   AND (%(type_like)s::text IS NULL OR message_type LIKE %(type_like)s::text)
 ORDER BY id
 LIMIT %(limit)s;

-- name: resent_delivered
-- Pending delivery-failed worklist items whose message was resent and whose latest copy (at
-- the end of the chain of resends) was delivered: nothing is left for a person to do.
WITH RECURSIVE chain AS (
    SELECT w.record_key, d.resent_as AS next, d.state, 0 AS depth
      FROM inturn_worklist_item w
      JOIN inturn_delivery d ON d.id = w.record_key::bigint
     WHERE w.queue = 'delivery-failed' AND w.record_kind = 'delivery' AND w.state = 'pending'
       AND d.resent_as IS NOT NULL
    UNION ALL
    SELECT chain.record_key, d.resent_as, d.state, chain.depth + 1
      FROM chain
      JOIN inturn_delivery d ON d.id = chain.next
     WHERE chain.depth < 100
)
SELECT record_key
  FROM chain
 WHERE next IS NULL AND state = 'delivered'
 ORDER BY record_key::bigint
 LIMIT %(limit)s;

-- name: payload
-- One item's stored bytes: its own, or (a slim row) its log row's; the hot table's, else
-- history's; a negative id: the log message not pulled yet that get_item shows.
SELECT coalesce(d.payload, m.payload) AS payload
  FROM ((SELECT payload, message_id FROM inturn_delivery WHERE id = %(id)s)
        UNION ALL
        (SELECT payload, message_id FROM inturn_history WHERE id = %(id)s)
        UNION ALL
        (SELECT NULL::bytea, -%(id)s::bigint WHERE %(id)s::bigint < 0)
        LIMIT 1) AS d
  LEFT JOIN inturn_message m ON m.id = d.message_id AND d.payload IS NULL
 WHERE coalesce(d.payload, m.payload) IS NOT NULL;

-- name: payload_of
-- payload, with the item's destination and the binding its envelope was sealed under (its own
-- id and destination unless seal_id/seal_scope say otherwise; a log row's id and channel).
SELECT coalesce(d.payload, m.payload) AS payload, d.destination,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_id, d.id)
            ELSE coalesce(m.seal_id, m.id) END AS seal_id,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_scope, d.destination)
            ELSE coalesce(m.seal_scope, 'channel:' || m.channel) END AS seal_scope
  FROM ((SELECT id, destination, payload, seal_id, seal_scope, message_id
           FROM inturn_delivery WHERE id = %(id)s)
        UNION ALL
        (SELECT id, destination, payload, seal_id, seal_scope, message_id
           FROM inturn_history WHERE id = %(id)s)
        UNION ALL
        -- a negative id: a log message not pulled yet, its channel as the destination named
        (SELECT %(id)s::bigint, 'channel:' || x.channel, NULL::bytea, NULL::bigint, NULL::text,
                x.id
           FROM inturn_message x
          WHERE %(id)s::bigint < 0 AND x.id = -%(id)s::bigint)
        LIMIT 1) AS d
  LEFT JOIN inturn_message m ON m.id = d.message_id AND d.payload IS NULL;

-- name: receiver_view
-- What shows a message as sent to its destination's receiver (issue 42): the destination's
-- profile as registered (spec.profile; NULL: none), the MSH-13 number the message was given
-- (migration 0045; NULL: none yet) and the number the destination's next message would get.
SELECT r.profile, s.number AS sequence_number,
       coalesce((SELECT q.last FROM inturn_sequence q WHERE q.destination = %(destination)s), 0)
           + 1 AS next_number
  FROM (SELECT 1) AS one
  LEFT JOIN inturn_destination r ON r.destination = %(destination)s
  LEFT JOIN inturn_sequence_number s ON s.item_id = %(id)s;

-- name: depth
-- Per destination with anything pending or failed, or on hold (held_at: a person or a restore
-- found suspended it; listed even when its queue is empty): the numbers to alert on, its
-- delivery window (spec.schedule) so that a reader can say until when it is held, when it was
-- suspended, and whether it is registered (not: an orphaned queue). Pending counts the
-- channel log's messages routed to it and not pulled yet (inturn_unpulled, migration 0038)
-- beside its rows: the queue a person means, whether or not its worker has pulled.
WITH q AS (
    SELECT destination,
           max(channel) AS channel,
           count(*) FILTER (WHERE state = 'pending') AS pending,
           count(*) FILTER (WHERE state = 'failed' AND resent_as IS NULL) AS failed,
           min(enqueued_at) FILTER (WHERE state = 'pending') AS oldest,
           coalesce(max(attempts) FILTER (WHERE state = 'pending'), 0) AS max_attempts
      FROM inturn_delivery
     WHERE state IN ('pending', 'failed')
       AND (%(destination)s::text IS NULL OR destination = %(destination)s::text)
     GROUP BY destination
),
u AS (
    SELECT destination, channel, pending, oldest FROM inturn_unpulled(%(destination)s::text)
),
t AS (
    SELECT coalesce(q.destination, u.destination) AS destination,
           coalesce(q.channel, u.channel) AS channel,
           coalesce(q.pending, 0) + coalesce(u.pending, 0) AS pending,
           coalesce(q.failed, 0) AS failed,
           least(q.oldest, u.oldest) AS oldest,
           coalesce(q.max_attempts, 0) AS max_attempts
      FROM q FULL JOIN u ON u.destination = q.destination
),
h AS (
    SELECT r.destination, r.channel
      FROM inturn_destination r
     WHERE r.held_at IS NOT NULL AND r.deleted_at IS NULL
       AND (%(destination)s::text IS NULL OR r.destination = %(destination)s::text)
),
a AS (
    SELECT coalesce(t.destination, h.destination) AS destination,
           coalesce(t.channel, h.channel) AS channel,
           coalesce(t.pending, 0) AS pending, coalesce(t.failed, 0) AS failed, t.oldest,
           coalesce(t.max_attempts, 0) AS max_attempts
      FROM t FULL JOIN h ON h.destination = t.destination
)
SELECT a.destination, a.channel, a.pending, a.failed, a.oldest,
       coalesce(extract(epoch FROM clock_timestamp() - a.oldest), 0)::float8 AS oldest_seconds,
       a.max_attempts, r.schedule, coalesce(r.lanes, 1) AS lanes, r.held_at,
       r.destination IS NOT NULL AS registered
  FROM a
  LEFT JOIN inturn_destination r ON r.destination = a.destination AND r.deleted_at IS NULL
 ORDER BY a.destination;

-- name: holds
-- The destinations suspended (queue suspend, the console, a restore found): when and by whom,
-- for people's reads of the depth (a worker's login may not read held_by).
SELECT destination, held_at, held_by
  FROM inturn_destination
 WHERE held_at IS NOT NULL AND deleted_at IS NULL;

-- name: pending_destinations
-- Every destination with a pending row or a message of its channel's log not pulled yet.
SELECT destination FROM inturn_delivery WHERE state = 'pending'
UNION
SELECT destination FROM inturn_unpulled(NULL)
 ORDER BY destination;

-- name: audit_list
-- Newest first; optional filters (NULL: any): one destination, one item, entries below a cursor.
SELECT id, at, who, action, destination, item_ids, why
  FROM inturn_audit
 WHERE (%(destination)s::text IS NULL OR destination = %(destination)s::text)
   AND (%(item_id)s::bigint IS NULL OR %(item_id)s::bigint = ANY (item_ids))
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
 ORDER BY id DESC LIMIT %(limit)s;

-- name: attempts
-- One item's failed attempts, oldest first (a delivery is the item's own state).
SELECT attempt, at, outcome, error FROM inturn_attempt WHERE item_id = %(id)s ORDER BY id;

-- name: destination_attempts
-- One destination's failed attempts of the last %(seconds)s seconds, newest first, at most
-- %(limit)s: when and the outcome (retry or failed), never the error text. Reads the day's
-- attempts by inturn_attempt_at, each joined to its item by primary key.
SELECT a.at, a.outcome
  FROM inturn_attempt a
  JOIN inturn_delivery d ON d.id = a.item_id
 WHERE a.at >= clock_timestamp() - make_interval(secs => %(seconds)s)
   AND d.destination = %(destination)s
 ORDER BY a.at DESC
 LIMIT %(limit)s;

-- name: heads
-- The head of each given destination (oldest pending item, due or not), one index probe each:
-- its id, attempts, seconds until its next attempt (0 when due) and last error. A destination
-- with no pending row whose channel's log holds messages for it not pulled yet (migration
-- 0038) has the first of them as its head: the negative of its log id, no attempt, due.
SELECT d.destination, coalesce(h.id, -u.first_id) AS id, coalesce(h.attempts, 0) AS attempts,
       coalesce(greatest(0, extract(epoch FROM h.next_attempt - clock_timestamp())), 0)::float8
           AS wait_seconds,
       h.last_error
  FROM unnest(%(destinations)s::text[]) AS d(destination)
  LEFT JOIN LATERAL (
       SELECT id, attempts, next_attempt, last_error
         FROM inturn_delivery
        WHERE destination = d.destination AND state = 'pending'
        ORDER BY id
        LIMIT 1) AS h ON TRUE
  LEFT JOIN (SELECT x.destination, x.first_id FROM inturn_unpulled(NULL) AS x) AS u
    ON u.destination = d.destination AND h.id IS NULL
 WHERE h.id IS NOT NULL OR u.first_id IS NOT NULL;

-- name: find_patient
-- Every held item whose identifier index holds the key (GIN), oldest first, in the hot table
-- and in history (each history partition's GIN index), and the log's messages not pulled by
-- some destination. Never a payload.
-- key: the key's forms, comma-separated (plain and blind while both exist; any matches).
SELECT id, channel, destination, control_id, message_type, size, state, attempts,
       enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at
  FROM inturn_delivery
 WHERE patient_keys && string_to_array(%(key)s::text, ',')
UNION ALL
SELECT id, channel, destination, control_id, message_type, size, state, attempts,
       enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at
  FROM inturn_history
 WHERE patient_keys && string_to_array(%(key)s::text, ',')
UNION ALL
-- a message of the channel log that a destination has not pulled yet (the log's GIN index),
-- as get_item shows it: minus its log id, pending for the first such destination
SELECT -m.id, m.channel, w.d, m.control_id, m.message_type, m.size, 'pending', 0,
       m.enqueued_at, m.enqueued_at, NULL, NULL, NULL, NULL, NULL
  FROM inturn_message m
  JOIN inturn_route r ON r.id = m.route
 CROSS JOIN LATERAL (
       SELECT u.d FROM unnest(r.destinations) AS u(d)
        WHERE m.id > coalesce((SELECT c.position FROM inturn_cursor c
                                WHERE c.destination = u.d), 0)
        ORDER BY u.d LIMIT 1) AS w
 WHERE m.patient_keys && string_to_array(%(key)s::text, ',')
 ORDER BY id;

-- name: capped_batch
-- Rows whose message named more patient identifiers than ingest indexed (the 'capped' key,
-- inturn.worker.hl7.pid.CAPPED_KEY, found by the same GIN index) and whose indexed keys do not
-- hold the key searched: the few rows a lookup by patient reads the payloads of, so that an
-- identifier past the cap is found. Oldest first, keyset pages ("after": the last id).
-- key: the key's forms, comma-separated (as find_patient). A slim row reads its log row's
-- payload, each with the binding it was sealed under (payload_binding).
SELECT d.id, d.channel, d.destination, d.control_id, d.message_type, d.size, d.state,
       d.attempts, d.enqueued_at, d.next_attempt, d.last_attempt, d.last_error, d.reason,
       d.decided_by, d.finished_at,
       coalesce(d.payload, m.payload) AS payload,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_id, d.id)
            ELSE coalesce(m.seal_id, m.id) END AS seal_id,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_scope, d.destination)
            ELSE coalesce(m.seal_scope, 'channel:' || m.channel) END AS seal_scope
  FROM inturn_delivery d
  LEFT JOIN inturn_message m ON m.id = d.message_id AND d.payload IS NULL
 WHERE d.patient_keys @> ARRAY['capped']::text[]
   AND NOT d.patient_keys && string_to_array(%(key)s::text, ',')
   AND d.id > %(after)s
 ORDER BY d.id
 LIMIT %(batch)s;

-- name: unindexed_batch
-- Rows not indexed yet (stored before migration 0004 or by an older ingest), oldest first,
-- found by the partial index inturn_delivery_unindexed. Keyset pages: "after" is the last id.
-- A slim row reads its log row's payload (capped_batch).
SELECT d.id, d.channel, d.destination, d.control_id, d.message_type, d.size, d.state,
       d.attempts, d.enqueued_at, d.next_attempt, d.last_attempt, d.last_error, d.reason,
       d.decided_by, d.finished_at,
       coalesce(d.payload, m.payload) AS payload,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_id, d.id)
            ELSE coalesce(m.seal_id, m.id) END AS seal_id,
       CASE WHEN d.payload IS NOT NULL THEN coalesce(d.seal_scope, d.destination)
            ELSE coalesce(m.seal_scope, 'channel:' || m.channel) END AS seal_scope
  FROM inturn_delivery d
  LEFT JOIN inturn_message m ON m.id = d.message_id AND d.payload IS NULL
 WHERE d.patient_keys IS NULL AND d.id > %(after)s
 ORDER BY d.id
 LIMIT %(batch)s;

-- name: unindexed_count
SELECT count(*) AS unindexed FROM inturn_delivery WHERE patient_keys IS NULL;

-- name: set_patient_keys
-- Fill in the index keys of rows read by unindexed_batch (keys: one comma-separated string per
-- id). Touches no row already indexed.
UPDATE inturn_delivery d
   SET patient_keys = string_to_array(u.keys, ',')
  FROM unnest(%(ids)s::bigint[], %(keys)s::text[]) AS u(id, keys)
 WHERE d.id = u.id AND d.patient_keys IS NULL;

-- name: scan_estimate
-- What a payload scan would read, from the planner's statistics (no table read): rows and bytes
-- of the table with its TOAST (the payloads).
SELECT greatest(c.reltuples, 0)::bigint AS rows, pg_total_relation_size(c.oid) AS bytes
  FROM pg_class c
 WHERE c.oid = 'inturn_delivery'::regclass;

-- name: sender_changed
-- Record the sender fingerprint a starting worker uses. When an earlier worker of the
-- destination recorded another one, or when this worker process takes the destination for the
-- first time (starting: the backoff was persisted by a process that stopped or died), its
-- pending items waiting out a backoff become due now: the head is tried at once (attempts,
-- last_error and reason are kept).
-- Returns whether the fingerprint changed and how many items were made due; guarded by the
-- lease (held 0 when it is lost: nothing recorded, nothing made due).
WITH
-- include: lease_guard
, previous AS (
    SELECT fingerprint FROM inturn_worker_sender WHERE destination = %(destination)s
),
recorded AS (
    INSERT INTO inturn_worker_sender AS w (destination, fingerprint)
    SELECT %(destination)s, %(fingerprint)s WHERE EXISTS (SELECT 1 FROM lease)
    ON CONFLICT (destination) DO UPDATE
       SET fingerprint = excluded.fingerprint, changed_at = now()
     WHERE w.fingerprint IS DISTINCT FROM excluded.fingerprint
    RETURNING 1
),
due AS (
    UPDATE inturn_delivery
       SET next_attempt = clock_timestamp()
     WHERE destination = %(destination)s AND state = 'pending'
       AND next_attempt > clock_timestamp()
       AND (%(starting)s OR EXISTS (SELECT 1 FROM previous WHERE fingerprint <> %(fingerprint)s))
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING id
)
SELECT (SELECT count(*) FROM lease) AS held,
       EXISTS (SELECT 1 FROM previous WHERE fingerprint <> %(fingerprint)s) AS changed,
       (SELECT count(*) FROM due) AS made_due,
       (SELECT count(*) FROM recorded) AS recorded;

-- name: pending_window
-- Lanes (spec.lanes.count > 1): the oldest pending items of a destination, due or not, with
-- their lane keys and no payload, for the scheduler (inturn.worker.drain.lanes). "after" is a
-- keyset bound as in head (0 for none). A destination on hold has no window. Guarded by the
-- lease as head is: no row at all when it is lost; one row of NULLs when nothing is pending.
WITH
-- include: lease_guard
SELECT lease.held, w.*
  FROM lease
  LEFT JOIN LATERAL (
       SELECT id, patient_keys, attempts, size,
              greatest(0, extract(epoch FROM next_attempt - clock_timestamp()))::float8
                  AS wait_seconds
         FROM inturn_delivery
        WHERE destination = %(destination)s AND state = 'pending' AND id > %(after)s
          AND NOT EXISTS (SELECT 1 FROM inturn_destination held
                           WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
        ORDER BY id
        LIMIT %(limit)s) AS w ON TRUE;

-- name: take
-- Lanes, one round trip per turn: mark the answers of the turn delivered (and record the replies
-- they expect, spec.replies), then read the chosen items, with their payloads, if they are
-- still pending (a skip or an erasure since the window was read leaves one out) and the
-- destination is not on hold. The marks commit with the statement, before any chosen item is
-- sent. A skip that raced with a send loses, as in succeeded. Guarded by the lease: no row at
-- all when it is lost (nothing marked); else one row per chosen item, or one row of NULLs, each
-- with "done" (id, waited seconds) of the items marked.
WITH
-- include: lease_guard
, done AS (
    UPDATE inturn_delivery d
       SET state = 'delivered', attempts = m.attempts,
           last_attempt = clock_timestamp(), finished_at = clock_timestamp()
      FROM unnest(%(done_ids)s::bigint[], %(done_attempts)s::int[]) AS m(id, attempts)
     WHERE d.id = m.id AND d.destination = %(destination)s AND d.state IN ('pending', 'skipped')
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING d.id, d.control_id, d.message_type,
              extract(epoch FROM d.finished_at - d.enqueued_at)::float8 AS waited_seconds
),
expected AS (
    INSERT INTO inturn_order_expectation
           (destination, delivery_id, control_id, message_type, order_key, key_digest,
            reply_channel, reply_types, due_at)
    SELECT %(destination)s, done.id, done.control_id, done.message_type, e.k, e.d, e.c,
           string_to_array(e.t, ','), clock_timestamp() + make_interval(secs => e.w)
      FROM done
      JOIN unnest(%(exp_ids)s::bigint[], %(keys)s::text[], %(digests)s::text[],
                  %(channels)s::text[], %(types)s::text[], %(within)s::int[])
           AS e(i, k, d, c, t, w) ON e.i = done.id
)
SELECT lease.held,
       (SELECT coalesce(json_agg(json_build_array(done.id, done.waited_seconds)), '[]'::json)
          FROM done) AS done,
       h.id, h.channel, h.destination, h.control_id, h.message_type, h.size, h.state,
       h.attempts, h.enqueued_at, h.next_attempt, h.last_attempt, h.last_error, h.reason,
       h.decided_by, h.finished_at,
       -- include: log_binding
       h.traceparent, h.patient_keys
  FROM lease
  LEFT JOIN LATERAL (
       SELECT d.id, d.channel, d.destination, d.control_id, d.message_type, d.size, d.state,
              d.attempts, d.enqueued_at, d.next_attempt, d.last_attempt, d.last_error,
              d.reason, d.decided_by, d.finished_at,
              -- include: own_binding
              d.traceparent, d.patient_keys
         FROM inturn_delivery d
        WHERE d.id = ANY(%(ids)s::bigint[]) AND d.destination = %(destination)s
          AND d.state = 'pending'
          AND NOT EXISTS (SELECT 1 FROM inturn_destination held
                           WHERE held.destination = %(destination)s AND held.held_at IS NOT NULL)
        ) AS h ON TRUE
  LEFT JOIN LATERAL inturn_log_payload_rows(h.log_id) AS m ON TRUE
 ORDER BY h.id;

-- name: mark_remembered
-- The delivered marks a worker process remembered across a lost session (issue 40): messages
-- its receiver acknowledged whose mark did not commit (the database restarted or failed over,
-- or its connection was cut, in between), written in one batch once the worker holds its lease
-- again and before it sends anything, so that none of them is sent twice. Only rows still
-- pending: one already marked (the commit was lost only to the worker's eyes) or skipped,
-- drained or erased by a person meanwhile is left as it is. Records the replies each one now
-- waits for (spec.replies), as the other marks do. Guarded by the lease: no row when it is
-- lost (nothing marked); else one row whose "done" lists (id, waited seconds) of the rows
-- marked.
WITH
-- include: lease_guard
, done AS (
    UPDATE inturn_delivery d
       SET state = 'delivered', attempts = m.attempts,
           last_attempt = clock_timestamp(), finished_at = clock_timestamp()
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS m(id, attempts)
     WHERE d.id = m.id AND d.destination = %(destination)s AND d.state = 'pending'
       AND EXISTS (SELECT 1 FROM lease)
    RETURNING d.id, d.control_id, d.message_type,
              extract(epoch FROM d.finished_at - d.enqueued_at)::float8 AS waited_seconds
),
expected AS (
    INSERT INTO inturn_order_expectation
           (destination, delivery_id, control_id, message_type, order_key, key_digest,
            reply_channel, reply_types, due_at)
    SELECT %(destination)s, done.id, done.control_id, done.message_type, e.k, e.d, e.c,
           string_to_array(e.t, ','), clock_timestamp() + make_interval(secs => e.w)
      FROM done
      JOIN unnest(%(exp_ids)s::bigint[], %(keys)s::text[], %(digests)s::text[],
                  %(channels)s::text[], %(types)s::text[], %(within)s::int[])
           AS e(i, k, d, c, t, w) ON e.i = done.id
)
SELECT lease.held,
       (SELECT coalesce(json_agg(json_build_array(done.id, done.waited_seconds)), '[]'::json)
          FROM done) AS done
  FROM lease;

-- name: lane_window
-- What a destination's lanes hold, for people (the console, `queue depth`, the status): its
-- oldest pending items, no payload, read-only, their keys replaced by numbers equal where the
-- keys are (inturn_lane_window, migration 0020: readers may not read patient keys). The
-- worker's own window is pending_window, guarded by its lease.
SELECT id, lane_keys AS patient_keys, attempts, size, wait_seconds
  FROM inturn_lane_window(%(destination)s, %(limit)s);

-- name: local_statement_timeout
-- The statement timeout of the rest of the transaction, or of the savepoint it is set in (a
-- bounded read of one destination's lanes, reads.lane_window_within).
SELECT set_config('statement_timeout', %(ms)s, true);

-- name: log_payload_joined
-- The log lookup of a database migration 0057 has not reached yet (an upgrade in place: a new
-- worker started before `inturn migrate`): the join on the log id that head, succeeded_next,
-- succeeded_next_expecting and take made before migration 0049, every partition planned. The
-- worker (inturn.worker.store.delivery) puts its LEFT JOIN LATERAL in place of their
-- inturn_log_payload_rows call when the function does not exist yet; the statement itself is run
-- only by the tests (it plans).
SELECT m.payload, m.seal_id, m.seal_scope
  FROM (SELECT %(log_id)s::bigint AS log_id) AS h
  LEFT JOIN LATERAL (SELECT x.payload, coalesce(x.seal_id, x.id) AS seal_id,
                            coalesce(x.seal_scope, 'channel:' || x.channel) AS seal_scope
                       FROM inturn_message x WHERE x.id = h.log_id) AS m ON TRUE;
