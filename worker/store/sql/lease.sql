-- The destination lease (inturn.worker.store.lease): acquire, renew, release, read.
-- Times on the database's clock. The statements that read the head or write a row carry the
-- same guard inline (sql/queue.sql), so the hot path costs no extra round trip.

-- name: acquire
-- Take the lease of a destination: a new row (epoch 1), an expired lease of anyone (the epoch
-- raised: the old holder's statements now match nothing), or this holder's own (after a
-- reconnect; the epoch raised too). A live lease of another holder is left alone: no row.
INSERT INTO inturn_lease AS l (destination, holder, epoch, expires_at, ttl_seconds, acquired_at)
VALUES (%(destination)s, %(holder)s, 1,
        clock_timestamp() + make_interval(secs => %(ttl_seconds)s), %(ttl_seconds)s,
        clock_timestamp())
ON CONFLICT (destination) DO UPDATE
   SET holder = excluded.holder, epoch = l.epoch + 1, expires_at = excluded.expires_at,
       ttl_seconds = excluded.ttl_seconds, acquired_at = excluded.acquired_at
 WHERE l.expires_at <= clock_timestamp() OR l.holder = excluded.holder
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
-- Who holds a destination's lease, its epoch and seconds left (negative: expired).
SELECT destination, holder, epoch,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS seconds_left
  FROM inturn_lease
 WHERE destination = %(destination)s;
