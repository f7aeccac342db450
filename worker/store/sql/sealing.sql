-- Named queries of `inturn keys encrypt-existing` and of ingest's index form (issue 31):
-- sealing the rows stored in clear before payload keys were given. Loaded by
-- inturn.worker.store.sealing.

-- name: plaintext_batch
-- Rows whose payload is still in clear (stored before payload keys were given), by id after
-- a keyset bound: what `inturn keys encrypt-existing` seals next. An envelope starts with the
-- bytes 00 69 65 31 (inturn.worker.crypto.envelope.PREFIX).
SELECT id, destination, payload
  FROM inturn_delivery
 WHERE id > %(after)s AND substring(payload FROM 1 FOR 4) <> '\x00696531'::bytea
 ORDER BY id
 LIMIT %(limit)s;

-- name: seal_rows
-- Replace clear payloads by their envelopes and their index keys by the given ones, unless
-- another run sealed them first (the payload is never changed otherwise). Returns the count.
UPDATE inturn_delivery d
   SET payload = u.payload, patient_keys = string_to_array(u.keys, ',')
  FROM unnest(%(ids)s::bigint[], %(payloads)s::bytea[], %(keys)s::text[]) AS u(id, payload, keys)
 WHERE d.id = u.id AND substring(d.payload FROM 1 FOR 4) <> '\x00696531'::bytea;

-- name: plaintext_batch_message
-- The channel log's messages still in clear (migration 0033), by id after a keyset bound: each
-- is sealed once, bound to its log id and "channel:<name>" (the scope returned as destination),
-- for every destination whose slim rows read it. A log row holding another binding (seal_id)
-- is never in clear.
SELECT id, 'channel:' || channel AS destination, payload
  FROM inturn_message
 WHERE id > %(after)s AND seal_id IS NULL
   AND substring(payload FROM 1 FOR 4) <> '\x00696531'::bytea
 ORDER BY id
 LIMIT %(limit)s;

-- name: seal_rows_message
-- seal_rows for the channel log: the envelope and index keys of each message, unless another
-- run sealed it first. Returns the count.
UPDATE inturn_message m
   SET payload = u.payload, patient_keys = string_to_array(u.keys, ',')
  FROM unnest(%(ids)s::bigint[], %(payloads)s::bytea[], %(keys)s::text[]) AS u(id, payload, keys)
 WHERE m.id = u.id AND substring(m.payload FROM 1 FOR 4) <> '\x00696531'::bytea;

-- name: sealed_batch
-- Sealed rows by id after a keyset bound, with their index keys: the pass of
-- `inturn keys encrypt-existing` that drops the plain index forms once no pending row needs them.
SELECT id, destination, payload, array_to_string(patient_keys, ',') AS keys
  FROM inturn_delivery
 WHERE id > %(after)s AND substring(payload FROM 1 FOR 4) = '\x00696531'::bytea
 ORDER BY id
 LIMIT %(limit)s;

-- name: set_keys
UPDATE inturn_delivery d
   SET patient_keys = string_to_array(u.keys, ',')
  FROM unnest(%(ids)s::bigint[], %(keys)s::text[]) AS u(id, keys)
 WHERE d.id = u.id;

-- name: plaintext_pending
-- Whether any pending row still holds its payload in clear with patient index keys (plain
-- ones): while one does, ingest with payload keys writes both index forms (lanes compare
-- keys). A row naming nobody (a booking's cancellation notice, built in the database) has
-- no keys to share and does not count.
-- A pending slim row counts when its log row is in clear (the pending rows, then their
-- messages by primary key).
SELECT EXISTS (
    SELECT 1 FROM inturn_delivery
     WHERE state = 'pending' AND substring(payload FROM 1 FOR 4) <> '\x00696531'::bytea
       AND patient_keys <> '{}'
) OR EXISTS (
    SELECT 1 FROM inturn_delivery d
      JOIN inturn_message m ON m.id = d.message_id
     WHERE d.state = 'pending' AND d.payload IS NULL
       AND substring(m.payload FROM 1 FOR 4) <> '\x00696531'::bytea
       AND m.patient_keys <> '{}'
) AS found;

-- name: mark_in_use
-- Record that payloads are sealed in this database (once; later calls change nothing).
INSERT INTO inturn_payload_keys (one) VALUES (true) ON CONFLICT (one) DO NOTHING;

-- name: in_use
-- Whether payloads were ever sealed here (one row at most: an index probe).
SELECT EXISTS (SELECT 1 FROM inturn_payload_keys) AS found;

-- `inturn keys rotate-index`: every row whose payload is an envelope of its own, by id after a
-- keyset bound, with the binding it was sealed under and its index keys (the hot table, the
-- history, the channel log); then the slim rows take their log row's keys.

-- name: index_batch_delivery
SELECT id, coalesce(seal_id, id) AS seal_id, coalesce(seal_scope, destination) AS seal_scope,
       payload, array_to_string(patient_keys, ',') AS keys
  FROM inturn_delivery
 WHERE id > %(after)s AND payload IS NOT NULL
   AND substring(payload FROM 1 FOR 4) = '\x00696531'::bytea
 ORDER BY id
 LIMIT %(limit)s;

-- name: index_batch_history
SELECT id, coalesce(seal_id, id) AS seal_id, coalesce(seal_scope, destination) AS seal_scope,
       payload, array_to_string(patient_keys, ',') AS keys
  FROM inturn_history
 WHERE id > %(after)s AND payload IS NOT NULL
   AND substring(payload FROM 1 FOR 4) = '\x00696531'::bytea
 ORDER BY id
 LIMIT %(limit)s;

-- name: index_batch_message
SELECT id, coalesce(seal_id, id) AS seal_id,
       coalesce(seal_scope, 'channel:' || channel) AS seal_scope,
       payload, array_to_string(patient_keys, ',') AS keys
  FROM inturn_message
 WHERE id > %(after)s AND substring(payload FROM 1 FOR 4) = '\x00696531'::bytea
 ORDER BY id
 LIMIT %(limit)s;

-- name: set_keys_history
UPDATE inturn_history h
   SET patient_keys = string_to_array(u.keys, ',')
  FROM unnest(%(ids)s::bigint[], %(keys)s::text[]) AS u(id, keys)
 WHERE h.id = u.id;

-- name: set_keys_message
UPDATE inturn_message m
   SET patient_keys = string_to_array(u.keys, ',')
  FROM unnest(%(ids)s::bigint[], %(keys)s::text[]) AS u(id, keys)
 WHERE m.id = u.id;

-- name: slim_keys
-- Slim rows (hot and history) whose keys differ from their log row's: they take the log's.
WITH hot AS (
    UPDATE inturn_delivery d SET patient_keys = m.patient_keys
      FROM inturn_message m
     WHERE d.message_id = m.id AND d.payload IS NULL
       AND d.patient_keys IS DISTINCT FROM m.patient_keys
    RETURNING 1
), old AS (
    UPDATE inturn_history h SET patient_keys = m.patient_keys
      FROM inturn_message m
     WHERE h.message_id = m.id AND h.payload IS NULL
       AND h.patient_keys IS DISTINCT FROM m.patient_keys
    RETURNING 1
)
SELECT (SELECT count(*) FROM hot) + (SELECT count(*) FROM old) AS changed;

-- name: open_orders_before
-- Expected order replies still open that were recorded before the time given: their digests
-- may be the previous index key's, which must stay until they are answered or given up.
SELECT count(*)::int AS open
  FROM inturn_order_expectation
 WHERE answered_at IS NULL AND raised_at IS NULL AND delivered_at < %(settled)s::timestamptz;
