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
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- the backend of the singletons' holder (below); NULL for a destination's lease
    backend_pid integer
);

-- The singletons (one purge, one sweep, one inturn local per database at a time) as lease rows
-- too ('inturn:purge', 'inturn:sweep', 'inturn:local': a destination is namespace/name and never
-- has a colon), through functions
-- granted only to their component, as the session locks of migration 0011 were: a session lock
-- behind a transaction-mode pooler belongs to whichever backend ran it, and outlives the run.
-- Take: the epoch, or NULL when another holder's lease is live, unless the session that took
-- it is gone (a killed run on a direct connection is replaced at once; behind a pooler, whose
-- server connection lives on, after the lease's ttl). Release: expire it now.
-- The search_path names the schema being migrated.
DO $migration$
DECLARE
    component text;
BEGIN
    FOREACH component IN ARRAY ARRAY['purge', 'sweep', 'local'] LOOP
        EXECUTE format($f$
            CREATE FUNCTION inturn_%s_lease(holder text, ttl_seconds float8) RETURNS bigint
                LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
                AS $body$
                    INSERT INTO inturn_lease AS l
                           (destination, holder, epoch, expires_at, ttl_seconds, backend_pid)
                    VALUES (%L, holder, 1,
                            clock_timestamp() + make_interval(secs => ttl_seconds), ttl_seconds,
                            pg_backend_pid())
                    ON CONFLICT (destination) DO UPDATE
                       SET holder = excluded.holder, epoch = l.epoch + 1,
                           expires_at = excluded.expires_at, ttl_seconds = excluded.ttl_seconds,
                           acquired_at = clock_timestamp(), backend_pid = excluded.backend_pid
                     WHERE l.expires_at <= clock_timestamp() OR l.holder = excluded.holder
                        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                                        WHERE a.pid = l.backend_pid)
                    RETURNING epoch
                $body$
        $f$, component, current_schema(), 'inturn:' || component);
        EXECUTE format($f$
            CREATE FUNCTION inturn_%s_release(holder text, epoch bigint) RETURNS void
                LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
                AS $body$
                    UPDATE inturn_lease l SET expires_at = clock_timestamp()
                     WHERE l.destination = %L AND l.holder = $1 AND l.epoch = $2
                $body$
        $f$, component, current_schema(), 'inturn:' || component);
    END LOOP;
END
$migration$;

REVOKE EXECUTE ON FUNCTION
    inturn_purge_lease(text, float8), inturn_purge_release(text, bigint),
    inturn_sweep_lease(text, float8), inturn_sweep_release(text, bigint),
    inturn_local_lease(text, float8), inturn_local_release(text, bigint)
  FROM PUBLIC;
