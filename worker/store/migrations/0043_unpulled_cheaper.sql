-- inturn_unpulled (migration 0038) reads the log only for a destination whose route sets name
-- it (issue 43): a destination that no message was ever routed to (a channel's holder of
-- unrouted messages that never held one, a registered destination no filter passed yet) costs
-- one look at the route sets, not a scan of its channel's log from position 0; the check is a
-- one-time filter of the log's scan. And the function never pays for JIT compilation (its
-- generic plan's estimate passes jit_above_cost with 200 destinations; the query reads a few
-- index pages per destination). Online: the function replaced, nothing else touched.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_unpulled(dest text)
            RETURNS TABLE (destination text, channel text, pending bigint, oldest timestamptz,
                           first_id bigint)
            LANGUAGE sql STABLE SET search_path = %1$I, pg_temp SET jit = off
            AS $body$
                SELECT k.destination, k.channel, n.pending, n.oldest, n.first_id
                  FROM (SELECT coalesce(c.destination, r.destination) AS destination,
                               coalesce(c.channel, r.channel) AS channel,
                               coalesce(c.position, 0) AS position
                          FROM (SELECT x.destination, x.channel, x.position FROM inturn_cursor x
                                 WHERE dest IS NULL OR x.destination = dest) AS c
                          FULL JOIN (SELECT x.destination, x.channel FROM inturn_destination x
                                      WHERE dest IS NULL OR x.destination = dest
                                     UNION
                                     SELECT '_unrouted/' || x.channel, x.channel
                                       FROM (SELECT DISTINCT channel FROM inturn_route) AS x
                                      WHERE dest IS NULL OR '_unrouted/' || x.channel = dest
                                    ) AS r
                            ON r.destination = c.destination) AS k
                 CROSS JOIN LATERAL (
                       SELECT ARRAY(SELECT x.id FROM inturn_route x
                                     WHERE x.channel = k.channel
                                       AND x.destinations @> ARRAY[k.destination]) AS ids
                       ) AS routes
                 CROSS JOIN LATERAL (
                       SELECT count(*) AS pending, min(m.enqueued_at) AS oldest,
                              min(m.id) AS first_id
                         FROM inturn_message m
                        WHERE cardinality(routes.ids) > 0
                          AND m.channel = k.channel AND m.id > k.position
                          AND m.route = ANY (routes.ids)) AS n
                 WHERE n.pending > 0
            $body$
    $f$, current_schema());
END
$migration$;
