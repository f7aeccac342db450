-- A destination's unpulled messages are counted on the channel it pulls (issue 43): its
-- registration's channel, else its cursor's, as inturn_pull_for chooses since migration 0041
-- (a destination moved to another channel pulls the new channel's log; migration 0043 counted
-- the cursor's, the old one, until its first pull there). Online: the function replaced.
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
                               coalesce(r.channel, c.channel) AS channel,
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
