-- Advisory locks. The components' locks are taken through the functions of migration 0011
-- (worker, enqueue, purge, sweep: each granted only to the roles that take it); the owner's own
-- locks (migrate, roles, local) take a key defined in inturn.worker.store.locks as %(key)s.

-- name: lock
-- Wait for the session lock (the migration run).
SELECT pg_advisory_lock(hashtextextended(%(key)s, 0));

-- name: xact_lock
-- Wait for the transaction lock (creating the component roles); released at COMMIT.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: try_lock
-- Take the session lock if free (the local runner's registry).
SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0)) AS locked;

-- name: unlock
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS unlocked;

-- name: blockers
-- The sessions a waiting backend (pid) waits for, with what a person needs to find them; never
-- their query text (it may hold a payload). state, times and client are NULL for a role that
-- may not see them (pg_read_all_stats).
SELECT b.pid, b.application_name, b.usename AS user_name, host(b.client_addr) AS client,
       b.state, coalesce(b.xact_start, b.state_change) AS since,
       extract(epoch FROM clock_timestamp() - coalesce(b.xact_start, b.state_change))::float8
           AS held_seconds
  FROM pg_stat_activity b
 WHERE b.pid = ANY (pg_blocking_pids(%(pid)s))
 ORDER BY coalesce(b.xact_start, b.state_change) NULLS LAST, b.pid;

-- name: worker_lock
-- The worker lock of a destination, if free (a worker role's session keeps it while it runs).
SELECT inturn_worker_lock(%(destination)s) AS locked;

-- name: worker_unlock
SELECT inturn_worker_unlock(%(destination)s) AS unlocked;

-- name: purge_lock
SELECT inturn_purge_lock() AS locked;

-- name: purge_unlock
SELECT inturn_purge_unlock() AS unlocked;

-- name: sweep_lock
SELECT inturn_sweep_lock() AS locked;

-- name: sweep_unlock
SELECT inturn_sweep_unlock() AS unlocked;

-- name: purge_lease
-- The purge singleton as a lease row (pooler-safe): the epoch, or NULL when another purge holds
-- it (the functions of migration 0019).
SELECT inturn_purge_lease(%(holder)s, %(ttl_seconds)s) AS epoch;

-- name: purge_release
SELECT inturn_purge_release(%(holder)s, %(epoch)s);

-- name: sweep_lease
SELECT inturn_sweep_lease(%(holder)s, %(ttl_seconds)s) AS epoch;

-- name: sweep_release
SELECT inturn_sweep_release(%(holder)s, %(epoch)s);

-- name: local_lease
-- The one inturn local of a database (it owns the destination registry), renewed while it runs.
SELECT inturn_local_lease(%(holder)s, %(ttl_seconds)s) AS epoch;

-- name: local_release
SELECT inturn_local_release(%(holder)s, %(epoch)s);
