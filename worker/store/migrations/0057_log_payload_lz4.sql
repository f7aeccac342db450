-- The channel log's payloads compressed with lz4 where the server has it (issue 43). Each
-- delivery reads its message's payload from the log (inturn_log_payload, migration 0049),
-- and Postgres decompresses it there: with pglz, the default, about 88,000 of the backend's
-- instructions for a sample message, lz4 about 26,000 (callgrind, Postgres 15; lz4 also
-- compresses at ingest for a fraction of pglz's cost). Values stored before keep their pglz
-- compression and read as before; a new value is compressed with lz4. Each existing log
-- partition takes the setting (ALTER TABLE on the partitioned table does not pass it down),
-- and inturn_epoch_prepare now creates the next epoch's partitions INCLUDING COMPRESSION, so
-- they take it from their parent (the rest of the function as migration 0034 made it). A
-- server built without lz4 (default_toast_compression does not offer it) keeps pglz: this
-- migration then changes nothing. A dump of a database with lz4 columns names the method;
-- restore it into a server without lz4 with pg_dump's --no-toast-compression.
-- Online: catalog changes only, no rewrite (an ACCESS EXCLUSIVE lock of each log table for
-- the moment of the change, as a column added to the log in migration 0041 took).
DO $migration$
DECLARE
    part regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_settings
                    WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RETURN;
    END IF;
    ALTER TABLE inturn_message ALTER COLUMN payload SET COMPRESSION lz4;
    FOR part IN SELECT i.inhrelid::regclass FROM pg_inherits i
                 WHERE i.inhparent = 'inturn_message'::regclass LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN payload SET COMPRESSION lz4', part);
    END LOOP;

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_epoch_prepare(lock_ms integer) RETURNS integer
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                last inturn_epoch;
                nxt integer;
                lo bigint;
                hi bigint;
                parent text;
                key text;
                part text;
            BEGIN
                PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
                SELECT * INTO last FROM inturn_epoch ORDER BY n DESC LIMIT 1 FOR UPDATE;
                IF last.opened_at IS NULL THEN
                    RETURN 0;
                END IF;
                nxt := last.n + 1;
                lo := last.hi;
                hi := last.hi + 1099511627776;
                FOREACH parent IN ARRAY ARRAY['inturn_message', 'inturn_history'] LOOP
                    key := CASE parent WHEN 'inturn_message' THEN 'id' ELSE 'message_id' END;
                    part := parent || '_e' || nxt;
                    EXECUTE format('CREATE TABLE %%I (LIKE %%I INCLUDING DEFAULTS'
                                   ' INCLUDING CONSTRAINTS INCLUDING STORAGE'
                                   ' INCLUDING COMPRESSION)', part, parent);
                    EXECUTE format('ALTER TABLE %%I ADD CONSTRAINT %%I CHECK (%%I >= %%s AND %%I < %%s)',
                                   part, part || '_range', key, lo, key, hi);
                    EXECUTE format('ALTER TABLE %%I ATTACH PARTITION %%I FOR VALUES FROM (%%s) TO (%%s)',
                                   parent, part, lo, hi);
                END LOOP;
                INSERT INTO inturn_epoch (n, lo, hi, opened_at) VALUES (nxt, lo, hi, NULL);
                RETURN nxt;
            END
            $body$
    $f$, current_schema());
END
$migration$;
