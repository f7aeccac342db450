-- Ingest writes the channel log (issue 43, "stored once, delivered to many";
-- docs/explanation/storage-layout.md): a message is one inturn_message row, whatever the
-- number of its destinations. A message received again and queued again (a re-send: its
-- earlier copy failed, was skipped, or was delivered before the lost-ACK window) is one more
-- log row, routed to the destinations that queue it again, and names, in its route set's
-- order, the earlier copy each of them follows: each destination's pull links its slim row to
-- its own (resent_from, migration 0032's trigger).
--
-- A message received again asks, per destination, for its latest copy there since the
-- window row's time: a log row routed to it past its cursor (not pulled yet: pending, the log
-- id), else its newest row of the channel and MSH-10 (inturn_latest_copy; the caller's
-- snapshot, being STABLE).
--
-- Online: one nullable column without a default on the partitioned log (catalog only), and
-- the lease-less pull of migration 0038 replaced by the same with the links.
ALTER TABLE inturn_message ADD COLUMN resent_from bigint[];

DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_pull_for(dest text, lim integer) RETURNS integer
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                chan text;
                pulled_n integer;
            BEGIN
                -- its channel: its registration's (a destination moved to another channel
                -- pulls the new one's log; a deleted one its last), else its cursor's
                SELECT coalesce((SELECT r.channel FROM inturn_destination r
                                  WHERE r.destination = dest),
                                (SELECT c.channel FROM inturn_cursor c
                                  WHERE c.destination = dest),
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
                           m.traceparent, m.enqueued_at,
                           CASE WHEN m.resent_from IS NOT NULL
                                THEN m.resent_from[(SELECT array_position(r.destinations, dest)
                                                      FROM inturn_route r
                                                     WHERE r.id = m.route)] END AS resent_from
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
                            traceparent, enqueued_at, message_id, resent_from)
                    SELECT dest, chan, p.control_id, p.message_type, p.size, p.patient_keys,
                           p.traceparent, p.enqueued_at, p.id, p.resent_from
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

DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_latest_copy(chan text, msh10 text, dest text, since timestamptz)
            RETURNS TABLE (id bigint, state text, finished_at timestamptz)
            LANGUAGE sql STABLE SET search_path = %1$I, pg_temp
            AS $body$
                (SELECT l.id, 'pending'::text, NULL::timestamptz FROM inturn_message l
                  WHERE l.control_id = msh10 AND l.channel = chan AND l.enqueued_at >= since
                    AND l.id > coalesce((SELECT c.position FROM inturn_cursor c
                                          WHERE c.destination = dest), 0)
                    AND EXISTS (SELECT 1 FROM inturn_route r
                                 WHERE r.id = l.route AND r.destinations @> ARRAY[dest])
                  ORDER BY l.id DESC LIMIT 1)
                UNION ALL
                (SELECT o.id, o.state, o.finished_at FROM inturn_delivery o
                  WHERE o.control_id = msh10 AND o.channel = chan AND o.destination = dest
                    AND o.enqueued_at >= since
                  ORDER BY o.id DESC LIMIT 1)
                LIMIT 1
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_latest_copy(text, text, text, timestamptz) FROM PUBLIC;
