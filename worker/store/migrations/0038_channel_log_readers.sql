-- Readers and people's actions on the channel log (issue 43; docs/explanation/storage-layout.md).
--
-- A destination's queue is its rows of inturn_delivery (slim rows that name their log message,
-- rows stored before the log with a payload of their own) and the messages of its channel's log
-- past its cursor that its route sets name, not pulled yet: normally none, since a live worker
-- pulls at every wake-up, but a destination whose worker is stopped, missing or behind holds
-- them there. Two functions answer for those:
--
--   inturn_unpulled(destination)  the log rows each destination (NULL: every one) has not
--                                 pulled: how many and the oldest's enqueue time. Read by
--                                 depth, the operator's status, the console and /metrics.
--   inturn_pull_for(destination, limit)
--                                 the worker's pull without a lease, for people's actions and
--                                 the sweeper: an erasure, a drain, a resend, a stuck or silent
--                                 destination first turn the log rows into rows of the queue
--                                 (ids, states), then act on rows as before.
--
-- Online: two new functions, no table touched.
DO $migration$
BEGIN
    -- Which destinations: those with a cursor, those registered and each channel's holder of
    -- unrouted messages ("_unrouted/<channel>", inturn.worker.ingest.routing, which no worker
    -- pulls); a destination that never pulled starts at position 0. The count reads the log's (channel, id) index past the
    -- cursor, the route sets only where a row lies there: with every worker live, one index
    -- probe per destination.
    EXECUTE format($f$
        CREATE FUNCTION inturn_unpulled(dest text)
            RETURNS TABLE (destination text, channel text, pending bigint, oldest timestamptz,
                           first_id bigint)
            LANGUAGE sql STABLE SET search_path = %1$I, pg_temp
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
                       SELECT count(*) AS pending, min(m.enqueued_at) AS oldest,
                              min(m.id) AS first_id
                         FROM inturn_message m
                        WHERE m.channel = k.channel AND m.id > k.position
                          AND m.route = ANY (ARRAY(
                                  SELECT x.id FROM inturn_route x
                                   WHERE x.channel = k.channel
                                     AND x.destinations @> ARRAY[k.destination]))) AS n
                 WHERE n.pending > 0
            $body$
    $f$, current_schema());

    -- The pull of queue.sql (statement for statement), without a lease: the rows are the
    -- destination's whoever pulls them. The destination's enqueue lock is taken by a statement
    -- of its own first (the pull's snapshot then sees the cursor the previous pull left) and
    -- held until the caller's COMMIT, so a caller that acts on the rows in the same
    -- transaction (a drain, an erasure) races with no pull. Its channel: its cursor's, else its
    -- registration's. Returns the rows pulled (at most lim; fewer: nothing more was there).
    EXECUTE format($f$
        CREATE FUNCTION inturn_pull_for(dest text, lim integer) RETURNS integer
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                chan text;
                pulled_n integer;
            BEGIN
                SELECT coalesce((SELECT c.channel FROM inturn_cursor c
                                  WHERE c.destination = dest),
                                (SELECT r.channel FROM inturn_destination r
                                  WHERE r.destination = dest),
                                CASE WHEN starts_with(dest, '_unrouted/')
                                     THEN substr(dest, length('_unrouted/') + 1) END)
                  INTO chan;
                IF chan IS NULL THEN
                    RETURN 0;
                END IF;
                PERFORM inturn_enqueue_lock(dest);
                WITH cur AS (
                    SELECT coalesce((SELECT c.position FROM inturn_cursor c
                                      WHERE c.destination = dest), 0) AS position
                ),
                picked AS (
                    SELECT m.id, m.control_id, m.message_type, m.size, m.patient_keys,
                           m.traceparent, m.enqueued_at
                      FROM cur
                      JOIN inturn_message m ON m.channel = chan AND m.id > cur.position
                     WHERE m.route = ANY (ARRAY(SELECT r.id FROM inturn_route r
                                                 WHERE r.channel = chan
                                                   AND r.destinations @> ARRAY[dest]))
                     ORDER BY m.id
                     LIMIT lim
                ),
                pulled AS (
                    INSERT INTO inturn_delivery
                           (destination, channel, control_id, message_type, size, patient_keys,
                            traceparent, enqueued_at, message_id)
                    SELECT dest, chan, p.control_id, p.message_type, p.size, p.patient_keys,
                           p.traceparent, p.enqueued_at, p.id
                      FROM picked p
                     ORDER BY p.id
                    RETURNING id
                ),
                moved AS (
                    INSERT INTO inturn_cursor AS c (destination, channel, position)
                    SELECT dest, chan,
                           CASE WHEN (SELECT count(*) FROM picked) >= lim
                                THEN (SELECT max(p.id) FROM picked p)
                                ELSE greatest(cur.position,
                                              coalesce((SELECT max(m.id) FROM inturn_message m
                                                         WHERE m.channel = chan), 0))
                           END
                      FROM cur
                    ON CONFLICT (destination) DO UPDATE
                       SET position = greatest(c.position, EXCLUDED.position),
                           channel = EXCLUDED.channel
                    RETURNING c.position
                )
                SELECT (SELECT count(*) FROM pulled) INTO pulled_n FROM moved;
                RETURN pulled_n;
            END
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_unpulled(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION inturn_pull_for(text, integer) FROM PUBLIC;
