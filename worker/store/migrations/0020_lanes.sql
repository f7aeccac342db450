-- Lanes (spec.lanes.count): the registry carries how many messages each destination may have
-- in flight at once, so that the console, `inturn queue depth` and the sweeper can show what
-- its lanes hold. 1 is the single stream. A constant default: no table rewrite.
ALTER TABLE inturn_destination ADD COLUMN lanes integer NOT NULL DEFAULT 1
    CHECK (lanes BETWEEN 1 AND 32);

-- What a destination's lanes hold, for roles that may not read patient keys (the console's and
-- the command line's reader, the operator): its oldest pending items with their keys replaced
-- by numbers that are equal where the keys are equal, within this one call ('capped', ingest's
-- mark of identifiers past its cap, is kept as it is). It says which of these messages share a
-- patient, never which patient.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_lane_window(dest text, lim integer)
            RETURNS TABLE (id bigint, lane_keys text[], attempts integer, size integer,
                           wait_seconds float8)
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                WITH w AS (
                    SELECT d.id, d.patient_keys, d.attempts, d.size,
                           greatest(0, extract(epoch FROM d.next_attempt - clock_timestamp()))
                               ::float8 AS wait_seconds
                      FROM inturn_delivery d
                     WHERE d.destination = dest AND d.state = 'pending'
                     ORDER BY d.id
                     LIMIT least(lim, 10000)
                ),
                k AS (
                    SELECT u.key, dense_rank() OVER (ORDER BY u.key) AS n
                      FROM (SELECT DISTINCT unnest(w.patient_keys) AS key FROM w) u
                )
                SELECT w.id,
                       CASE WHEN w.patient_keys IS NULL THEN NULL ELSE ARRAY(
                           SELECT CASE WHEN k.key = 'capped' THEN 'capped' ELSE k.n::text END
                             FROM unnest(w.patient_keys) AS x(key) JOIN k ON k.key = x.key)
                       END,
                       w.attempts, w.size, w.wait_seconds
                  FROM w
                 ORDER BY w.id
            $body$
    $f$, current_schema());
END
$migration$;
REVOKE EXECUTE ON FUNCTION inturn_lane_window(text, integer) FROM PUBLIC;
