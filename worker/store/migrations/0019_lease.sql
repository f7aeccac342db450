-- Who holds a destination: a lease with an epoch (fencing that does not depend on the session,
-- so that it holds behind a connection pooler; inturn.worker.store.lease).
-- holder: the worker instance that holds it (host:pid:random), for diagnostics and the guard.
-- epoch: raised on every acquisition, never lowered; a row is kept when released, so that a
--        destination's epochs only grow and a stale holder's statements match nothing.
-- expires_at: on the database's clock (clock_timestamp()), never a worker's.
-- ttl_seconds: the lifetime every guarded statement renews the lease for (set at acquire and
--        renew), so that the statements the worker already runs renew it with no extra argument.
CREATE TABLE inturn_lease (
    destination text PRIMARY KEY,
    holder text NOT NULL,
    epoch bigint NOT NULL CHECK (epoch > 0),
    expires_at timestamptz NOT NULL,
    ttl_seconds double precision NOT NULL CHECK (ttl_seconds > 0),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
