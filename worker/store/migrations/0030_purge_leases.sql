-- Lease rows of deleted destinations go with purge. A lease row is kept when released, so that a
-- destination's epochs only grow while it exists (0019); once its destination is gone (no row
-- in the registry, or one marked deleted) and the lease expired longer ago than purge's
-- retention, nobody holds it (every guarded statement needs a live lease of the same holder and
-- epoch) and nobody will take it but a new worker of a re-created destination, whose holder is
-- new: its epoch may start again at 1. The singletons' rows ('inturn:purge', ...: a destination
-- never has a colon) are never removed. At most 5,000 rows per call, oldest expiry first; the
-- purge role has no privilege on inturn_lease of its own. The search_path names the schema
-- being migrated.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_purge_leases(expired_seconds float8, batch integer)
            RETURNS SETOF text
            LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                DELETE FROM inturn_lease
                 WHERE destination IN (
                       SELECT l.destination FROM inturn_lease l
                        WHERE position(':' in l.destination) = 0
                          AND l.expires_at
                              < clock_timestamp() - make_interval(secs => expired_seconds)
                          AND NOT EXISTS (SELECT 1 FROM inturn_destination d
                                           WHERE d.destination = l.destination
                                             AND d.deleted_at IS NULL)
                        ORDER BY l.expires_at
                        LIMIT least(batch, 5000))
                RETURNING destination
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_purge_leases(float8, integer) FROM PUBLIC;
