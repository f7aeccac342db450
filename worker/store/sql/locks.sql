-- Advisory locks. The keys (texts hashed into the bigint lock key) are defined once, in
-- inturn.worker.store.locks, and passed as %(key)s.

-- name: lock
-- Wait for the session lock (the migration run).
SELECT pg_advisory_lock(hashtextextended(%(key)s, 0));

-- name: xact_lock
-- Wait for the transaction lock (creating the component roles); released at COMMIT.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: try_lock
-- Take the session lock if free (the worker lock, the purge singleton).
SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0)) AS locked;

-- name: unlock
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS unlocked;
