-- The channel log's payloads read for less (issue 43): each delivery reads its message's
-- payload from the log in the worker's backend, and two costs of that read are cut here.
--
-- 1. inturn_log_payload_rows(id) returns the row as a set (RETURN QUERY), where
-- inturn_log_payload (migration 0049) returns OUT parameters. A composite value returned by a
-- function may hold no TOAST pointer, so the OUT form decompresses the payload into a new
-- tuple inside the function, and that tuple is copied again into the function scan's store:
-- about 100,000 of the backend's instructions a message for a sample message (callgrind,
-- Postgres 15). A set's rows keep the payload as stored, decompressed once, when the row is
-- sent. The same statement (one partition, by the id given), the same columns; no row for an
-- id no partition holds, or a NULL id (STRICT), which the statements' LEFT JOIN reads as the
-- OUT form's NULLs. It is a function of its own, made beside the old one, never in its place:
-- a statement a running worker has prepared names the old function by its OID, and a
-- function dropped and made again under it fails that statement with "cache lookup failed
-- for function" at every try until the session ends (an upgrade under traffic, clean-clone
-- CI of 846f1e0). Workers of the release before keep calling inturn_log_payload, which stays
-- as migration 0049 made it; it takes the same grants.
--
-- 2. New log payloads are compressed with lz4 where the server has it: decompressing a sample
-- message takes about 26,000 instructions against pglz's 88,000 (and compressing it at ingest
-- a fraction of pglz's cost). Values stored before keep their pglz compression and read as
-- before. Each existing log partition takes the setting (ALTER TABLE on the partitioned table
-- does not pass it down), and inturn_epoch_prepare now creates the next epoch's partitions
-- INCLUDING COMPRESSION, so they take it from their parent (the rest of the function as
-- migration 0034 made it). A server built without lz4 (default_toast_compression does not
-- offer it, as the embedded pgserver's) keeps pglz. A dump of a database with lz4 columns
-- names the method: restore it into a server without lz4 with pg_dump's
-- --no-toast-compression.
--
-- Online: catalog changes only, no rewrite (an ACCESS EXCLUSIVE lock of each log table for
-- the moment of its change, as the column added to the log in migration 0041 took).
DO $migration$
DECLARE
    acl aclitem[];
    grantee oid;
    part regclass;
BEGIN
    SELECT p.proacl INTO acl FROM pg_proc p
     WHERE p.oid = 'inturn_log_payload(bigint)'::regprocedure;
    EXECUTE format($f$
        CREATE FUNCTION inturn_log_payload_rows(log_id bigint)
            RETURNS TABLE (payload bytea, seal_id bigint, seal_scope text)
            LANGUAGE plpgsql STABLE STRICT ROWS 1 SET search_path = %1$I, pg_temp
            AS $body$
            BEGIN
                RETURN QUERY
                SELECT m.payload, coalesce(m.seal_id, m.id),
                       coalesce(m.seal_scope, 'channel:' || m.channel)
                  FROM inturn_message m
                 WHERE m.id = log_id;
            END
            $body$
    $f$, current_schema());
    IF acl IS NOT NULL THEN  -- NULL: the default privileges, which the new function has too
        REVOKE EXECUTE ON FUNCTION inturn_log_payload_rows(bigint) FROM PUBLIC;
        FOR grantee IN SELECT DISTINCT a.grantee FROM aclexplode(acl) AS a
                        WHERE a.privilege_type = 'EXECUTE' LOOP
            IF grantee = 0 THEN
                GRANT EXECUTE ON FUNCTION inturn_log_payload_rows(bigint) TO PUBLIC;
            ELSE
                EXECUTE format('GRANT EXECUTE ON FUNCTION inturn_log_payload_rows(bigint) TO %I',
                               (SELECT r.rolname FROM pg_roles r WHERE r.oid = grantee));
            END IF;
        END LOOP;
    END IF;

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
