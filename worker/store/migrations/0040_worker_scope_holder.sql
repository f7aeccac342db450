-- A worker login scoped to one destination (migration 0036) learns nothing of another's lock
-- either (issue 41, part 1): inturn_worker_lock_holder, which names the backend holding a
-- destination's worker lock (the lease's fast takeover, migration 0025), refuses another
-- destination to a scoped login, as the lock functions do. The shared worker role ('*') and
-- every caller it answered before get the same answer. Online: one function replaced.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_worker_lock_holder(destination text) RETURNS integer
            LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %I, pg_catalog, pg_temp
            AS $body$
            DECLARE scope text := inturn_worker_destination();
            BEGIN
                IF scope <> '*' AND scope <> destination THEN
                    RAISE EXCEPTION 'this login works for %%, not %%', scope, destination
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                RETURN (SELECT min(l.pid)
                          FROM pg_locks l
                         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                           AND l.database = (SELECT oid FROM pg_database
                                              WHERE datname = current_database())
                           AND ((l.classid::int8 << 32) | l.objid::int8)
                               = hashtextextended('inturn:worker:' || destination, 0));
            END
            $body$
    $f$, current_schema());
END
$migration$;
