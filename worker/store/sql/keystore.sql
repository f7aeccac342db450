-- Named queries of the key store: a database apart from the queue's (--key-dsn), holding the
-- patients' and destinations' keys wrapped by a master key (inturn.worker.crypto). Nothing
-- here is ever unwrapped: the store keeps bytes. Loaded by inturn.worker.store.keystore.

-- name: schema
-- The key store's tables, made by `inturn migrate --key-dsn` and `inturn local` (idempotent).
-- inturn_key: one row per key; ref names it in envelopes; lookups are the blind index keys
-- that find a patient's key for erasure (empty for a destination's key). inturn_key_erasure:
-- what each erasure destroyed, without identifiers. inturn_key_setting: the master key the
-- blind index derives from, and its check value.
CREATE TABLE IF NOT EXISTS inturn_key (
    ref bytea PRIMARY KEY CHECK (length(ref) = 16),
    lookups text[] NOT NULL DEFAULT '{}',
    master_id text NOT NULL,
    wrapped bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    rewrapped_at timestamptz
);
CREATE INDEX IF NOT EXISTS inturn_key_lookups ON inturn_key USING gin (lookups);
CREATE INDEX IF NOT EXISTS inturn_key_master ON inturn_key (master_id, ref);
CREATE TABLE IF NOT EXISTS inturn_key_setting (
    name text PRIMARY KEY,
    value text NOT NULL
);
-- The blind index generation a key's lookups were last computed under (`inturn keys
-- rotate-index`); NULL for a key made before the first rotation or not reached by one.
ALTER TABLE inturn_key ADD COLUMN IF NOT EXISTS index_generation integer;
CREATE TABLE IF NOT EXISTS inturn_key_erasure (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    erased_at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    reason text NOT NULL,
    keys integer NOT NULL
);

-- name: database_exists
-- (run on the queue's server, by inturn local --encrypt, before it makes the key store)
SELECT 1 AS found FROM pg_database WHERE datname = %(name)s;

-- name: setting
-- Record the default when the setting has none, and return what is recorded (one statement:
-- two processes starting together agree).
WITH ins AS (
    INSERT INTO inturn_key_setting (name, value) VALUES (%(name)s, %(value)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING value
)
SELECT value FROM ins
UNION ALL
SELECT value FROM inturn_key_setting WHERE name = %(name)s
LIMIT 1;

-- name: fetch
SELECT ref, master_id, wrapped FROM inturn_key WHERE ref = ANY (%(refs)s::bytea[]);

-- name: lock
-- The keys one seal uses, kept from erasure until the seal's transaction on the key store ends
-- (after the queue's COMMIT of the message sealed under them): the erase statement's DELETE
-- waits for it (PgKeyStore.hold). For this transaction only (pooler-safe: nothing stays on the
-- session), before the rows are locked: how long a lock waits, and no wait for the WAL flush at
-- COMMIT (a hold writes nothing but row locks, which a crash releases anyway; the locks give
-- the transaction an xid, so its COMMIT would otherwise wait for a flush, about 1 ms a batch).
SELECT ref, master_id, wrapped FROM inturn_key
 WHERE ref = ANY (%(refs)s::bytea[])
   AND set_config('lock_timeout', %(ms)s::text || 'ms', true) IS NOT NULL
   AND set_config('synchronous_commit', 'off', true) = 'off'
   FOR SHARE;

-- name: create
-- Keys for references that have none; then every reference's stored key (the winner's when
-- another process stored one first: this statement's snapshot does not see a concurrent
-- insert, so the caller reads again for those, see PgKeyStore.create).
WITH ins AS (
    INSERT INTO inturn_key (ref, master_id, wrapped, lookups)
    SELECT k.ref, k.master_id, k.wrapped, string_to_array(k.lookups, ',')
      FROM unnest(%(refs)s::bytea[], %(masters)s::text[], %(wrapped)s::bytea[],
                  %(lookups)s::text[]) AS k(ref, master_id, wrapped, lookups)
     -- durable before the message sealed under it is acknowledged (no startup options: a
     -- pooler may refuse them), as the queue's own writes
     WHERE set_config('synchronous_commit', 'on', true) = 'on'
    ON CONFLICT (ref) DO NOTHING
    RETURNING ref, master_id, wrapped
)
SELECT ref, master_id, wrapped FROM ins;

-- name: erase
-- Destroy every key a lookup finds, and record how many, who and why (no identifier).
WITH gone AS (
    DELETE FROM inturn_key
     WHERE lookups && %(lookups)s::text[]
       AND set_config('synchronous_commit', 'on', true) = 'on'
    RETURNING ref
)
INSERT INTO inturn_key_erasure (actor, reason, keys)
SELECT %(actor)s, %(reason)s, count(*) FROM gone
RETURNING keys;

-- name: not_under
SELECT ref, master_id, wrapped
  FROM inturn_key
 WHERE master_id <> %(master_id)s AND ref > %(after)s
 ORDER BY ref
 LIMIT %(limit)s;

-- name: rewrap
UPDATE inturn_key
   SET master_id = %(master_id)s, wrapped = %(wrapped)s, rewrapped_at = now()
 WHERE ref = %(ref)s AND master_id = %(old_master)s AND wrapped = %(old_wrapped)s
   AND set_config('synchronous_commit', 'on', true) = 'on';

-- name: masters
SELECT master_id, count(*)::int AS keys FROM inturn_key GROUP BY master_id ORDER BY master_id;

-- name: erasures
SELECT id, erased_at, actor, reason, keys FROM inturn_key_erasure ORDER BY id DESC LIMIT %(limit)s;

-- name: ping
-- One round trip: whether the key store answers (ingest's readiness, after a failure).
SELECT 1 AS one;

-- name: replace_setting
-- Compare and set: the setting takes the new value only if it still holds the expected one.
UPDATE inturn_key_setting SET value = %(value)s
 WHERE name = %(name)s AND value = %(expected)s
RETURNING value;

-- name: settings
-- Several settings at once (absent ones are not returned).
SELECT name, value FROM inturn_key_setting WHERE name = ANY (%(names)s::text[]);

-- name: begin_index_rotation
-- `inturn keys rotate-index`, its first step, in one statement: the new index key becomes the
-- current one and the old one the previous, only if the current one is still the expected one
-- (two runs at once: one wins). Returns how many settings were written (0: lost the race).
WITH cur AS (
    SELECT value FROM inturn_key_setting
     WHERE name = 'index_wrapped' AND value = %(old)s
       AND set_config('synchronous_commit', 'on', true) = 'on'
       FOR UPDATE
), put AS (
    INSERT INTO inturn_key_setting (name, value)
    SELECT s.name, s.value
      FROM cur, (VALUES ('index_wrapped', %(new)s::text), ('index_check', %(check)s::text),
                        ('index_previous', %(old)s::text), ('index_rotation', 'dual'),
                        ('index_generation', %(generation)s::text),
                        ('index_rotation_started', now()::text)) AS s(name, value)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value
    RETURNING 1
)
SELECT count(*)::int AS changed FROM put;

-- name: set_lookups
-- A patient key's erasure lookups, recomputed under the index generation given.
UPDATE inturn_key
   SET lookups = string_to_array(%(lookups)s, ','), index_generation = %(generation)s
 WHERE ref = %(ref)s AND set_config('synchronous_commit', 'on', true) = 'on';

-- name: unreached
-- Patient keys made before the rotation settled whose lookups it has not recomputed: no stored
-- message names them any more (their messages were purged), so only the previous index key
-- finds them for an erasure.
SELECT count(*)::int AS keys
  FROM inturn_key
 WHERE lookups <> '{}' AND created_at < %(settled)s::timestamptz
   AND coalesce(index_generation, 1) < %(generation)s;

-- name: end_index_rotation
-- The previous index key destroyed: nothing needs it any more.
DELETE FROM inturn_key_setting
 WHERE name IN ('index_previous', 'index_rotation', 'index_rotation_started',
                'index_rotation_settled')
   AND set_config('synchronous_commit', 'on', true) = 'on'
RETURNING name;
