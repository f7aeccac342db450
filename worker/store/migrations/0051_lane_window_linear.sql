-- The lane window in time linear in its limit (fix of migration 0020): the numbers that stand
-- for the keys were looked up per message by a join of the message's keys with every distinct
-- key of the window, planned as a scan of that set for each message, so a window of n messages
-- of n patients cost n * n rows (5.4 s at 1,000 pending: `inturn queue depth` and the console's
-- destination page hit the read statement timeout). Here the keys are unnested once, joined
-- once with their numbers (a hash join), and gathered back per message in their order. What it
-- returns is the same: each message's keys replaced by numbers equal where the keys are equal
-- ('capped' kept as it is), NULL keys left NULL. Same signature, so the grants stay as they are.
-- Online: a function replaced, nothing else changed.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_lane_window(dest text, lim integer)
            RETURNS TABLE (id bigint, lane_keys text[], attempts integer, size integer,
                           wait_seconds float8)
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                WITH w AS MATERIALIZED (
                    SELECT d.id, d.patient_keys, d.attempts, d.size,
                           greatest(0, extract(epoch FROM d.next_attempt - clock_timestamp()))
                               ::float8 AS wait_seconds
                      FROM inturn_delivery d
                     WHERE d.destination = dest AND d.state = 'pending'
                     ORDER BY d.id
                     LIMIT least(lim, 10000)
                ),
                x AS MATERIALIZED (
                    SELECT w.id, u.key, u.ord
                      FROM w, unnest(w.patient_keys) WITH ORDINALITY AS u(key, ord)
                ),
                k AS MATERIALIZED (
                    SELECT s.key, dense_rank() OVER (ORDER BY s.key) AS n
                      FROM (SELECT DISTINCT x.key FROM x WHERE x.key IS NOT NULL) s
                ),
                m AS (
                    SELECT x.id,
                           array_agg(CASE WHEN k.key = 'capped' THEN 'capped' ELSE k.n::text END
                                     ORDER BY x.ord) AS lane_keys
                      FROM x JOIN k ON k.key = x.key
                     GROUP BY x.id
                )
                SELECT w.id,
                       CASE WHEN w.patient_keys IS NULL THEN NULL
                            ELSE coalesce(m.lane_keys, '{}'::text[]) END,
                       w.attempts, w.size, w.wait_seconds
                  FROM w LEFT JOIN m ON m.id = w.id
                 ORDER BY w.id
            $body$
    $f$, current_schema());
END
$migration$;
