-- The destination lease (inturn.worker.store.lease): acquire, renew, release, read.
-- Times on the database's clock. The statements that read the head or write a row carry the
-- same guard inline (sql/queue.sql), so the hot path costs no extra round trip.

-- name: acquire
-- Take the lease of a destination: a new row (epoch 1), an expired lease of anyone (the epoch
-- raised: the old holder's statements now match nothing), this holder's own (after a
-- reconnect; the epoch raised too), or a lease whose holder's backend is gone: a holder on a
-- direct connection recorded its backend (backend_pid, while its session held the worker lock
-- of the destination), and that backend no longer holds the lock (its session ended: killed,
-- crashed). A live lease of another holder is left alone: no row. %(direct)s: this taker is on
-- a direct connection and holds the worker lock (then its backend is recorded; NULL behind a
-- pooler, where only the expiry lets a successor in).
INSERT INTO inturn_lease AS l
       (destination, holder, epoch, expires_at, ttl_seconds, acquired_at, backend_pid)
VALUES (%(destination)s, %(holder)s, 1,
        clock_timestamp() + make_interval(secs => %(ttl_seconds)s), %(ttl_seconds)s,
        clock_timestamp(),
        CASE WHEN %(direct)s AND inturn_worker_lock_holder(%(destination)s) = pg_backend_pid()
             THEN pg_backend_pid() END)
ON CONFLICT (destination) DO UPDATE
   SET holder = excluded.holder, epoch = l.epoch + 1, expires_at = excluded.expires_at,
       ttl_seconds = excluded.ttl_seconds, acquired_at = excluded.acquired_at,
       backend_pid = excluded.backend_pid
 WHERE l.expires_at <= clock_timestamp() OR l.holder = excluded.holder
    OR (l.backend_pid IS NOT NULL
        AND inturn_worker_lock_holder(l.destination) IS DISTINCT FROM l.backend_pid)
RETURNING epoch;

-- name: renew
-- Extend a lease still held (same holder and epoch, not expired); seconds left, or no row.
UPDATE inturn_lease
   SET expires_at = clock_timestamp() + make_interval(secs => %(ttl_seconds)s),
       ttl_seconds = %(ttl_seconds)s
 WHERE destination = %(destination)s AND holder = %(holder)s AND epoch = %(epoch)s
   AND expires_at > clock_timestamp()
RETURNING extract(epoch FROM expires_at - clock_timestamp())::float8 AS seconds_left;

-- name: release
-- Give the lease up at once (a clean stop): it expires now, the row and its epoch stay.
UPDATE inturn_lease
   SET expires_at = clock_timestamp()
 WHERE destination = %(destination)s AND holder = %(holder)s AND epoch = %(epoch)s
   AND expires_at > clock_timestamp();

-- name: holder
-- Who holds a destination's lease, its epoch, seconds left (negative: expired) and the backend
-- a holder on a direct connection recorded (NULL behind a pooler).
SELECT destination, holder, epoch, backend_pid,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS seconds_left
  FROM inturn_lease
 WHERE destination = %(destination)s;

-- name: purge_gone
-- Remove the lease rows of destinations that are gone (no registry row, or one marked deleted)
-- whose lease expired more than %(expired_seconds)s ago, at most %(batch)s (<= 5,000): through
-- the SECURITY DEFINER function of migration 0030 (the purge role may call it and has no
-- privilege on the table). The destinations whose rows went.
SELECT destination FROM inturn_purge_leases(%(expired_seconds)s, %(batch)s) AS gone(destination);

-- name: purge_gone_count
-- What purge_gone would remove (inturn purge --dry-run; migration 0031).
SELECT inturn_purge_leases_count(%(expired_seconds)s) AS n;
