-- A head reads its log message's payload from that message's own partition (issue 37): the
-- head, the next head after a delivered mark and the lanes' take called the log through a
-- join on the row's message_id, a value Postgres knows only while it runs, so it planned and
-- opened an index scan of every partition of inturn_message, one per day kept (planning 0.18
-- ms with one partition, 1.56 ms with 92; a prepared statement's generic plan still opens
-- them all at each run). inturn_log_payload(id) looks the message up with its id as a
-- parameter of its own statement: PL/pgSQL plans it for the value given, the planner prunes
-- to the one partition that holds it, and the cost no longer follows the days kept. It
-- returns the payload and the binding the log row was sealed with (its id and
-- "channel:<name>" unless seal_id/seal_scope say otherwise); no row for a NULL id (STRICT:
-- a row holding a payload of its own is not looked up) or an id no partition holds.
-- Online: a new function, nothing else changed.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_log_payload(log_id bigint,
                                                      OUT payload bytea,
                                                      OUT seal_id bigint,
                                                      OUT seal_scope text)
            LANGUAGE plpgsql STABLE STRICT SET search_path = %1$I, pg_temp
            AS $body$
            BEGIN
                SELECT m.payload, coalesce(m.seal_id, m.id),
                       coalesce(m.seal_scope, 'channel:' || m.channel)
                  INTO payload, seal_id, seal_scope
                  FROM inturn_message m
                 WHERE m.id = log_id;
            END
            $body$
    $f$, current_schema());
END
$migration$;
