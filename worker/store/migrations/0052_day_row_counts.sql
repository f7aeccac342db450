-- A day's rows counted as they are written, so that its drop does not scan them (issue 37;
-- docs/explanation/storage-layout.md). Until now inturn_epoch_drop audited a drop with a
-- count(*) of the day's log and history partitions: 114 ms for a day of 55,000 rows and 519 ms
-- for one of 550,000 in the 5-million-row run, a time that follows the rows.
--
-- inturn_epoch_rows holds each epoch's rows of the log and of history, as sums of counters:
-- statement-level triggers with transition tables on the two parents add what a statement
-- inserted and take off what it deleted, one counter row per epoch (and, for the log, per
-- channel) and statement, never per row. Ingest's counter is its channel's (shard: the channel),
-- written under the channel's enqueue lock that ingest holds until COMMIT anyway, so that two
-- channels never wait for each other's counter; the move (one statement per batch), erasure
-- and the rest write shard ''. The two functions that change a partition by its own name
-- (inturn_epoch_keep, inturn_erase_detached: a statement on a partition fires no trigger of
-- its parent) count what they delete themselves. The drop reads the sums.
--
-- An epoch whose partitions already held rows when this ran (rows stored before the
-- triggers existed) is marked not counted (inturn_epoch.counted false): its drop counts its
-- partitions as before. Every epoch prepared later, and one still empty now, is counted.
--
-- Online: a new table, a column with a constant default on the small inturn_epoch (no
-- rewrite), functions, and four statement triggers, whose CREATE takes a SHARE ROW EXCLUSIVE
-- lock on inturn_message and inturn_history (ingest's and the move's inserts wait for this
-- transaction: catalog changes and an EXISTS per partition, milliseconds; reads do not).

CREATE TABLE inturn_epoch_rows (
    epoch  integer NOT NULL,
    part   text    NOT NULL CHECK (part IN ('log', 'history')),
    shard  text    NOT NULL,               -- the log's channel for ingest's counts; '' else
    rows   bigint  NOT NULL,
    PRIMARY KEY (epoch, part, shard)
);

ALTER TABLE inturn_epoch ADD COLUMN counted boolean NOT NULL DEFAULT true;

DO $migration$
BEGIN
    -- What a statement inserted into or deleted from the log: inserts per channel (ingest's
    -- statements, each under its channel's lock), deletions on shard ''.
    EXECUTE format($f$
        CREATE FUNCTION inturn_count_log() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    INSERT INTO inturn_epoch_rows AS r (epoch, part, shard, rows)
                    SELECT e.n, 'log', x.channel, count(*)
                      FROM changed x JOIN inturn_epoch e ON x.id >= e.lo AND x.id < e.hi
                     GROUP BY e.n, x.channel
                     ORDER BY e.n, x.channel
                    ON CONFLICT (epoch, part, shard) DO UPDATE SET rows = r.rows + excluded.rows;
                ELSE
                    INSERT INTO inturn_epoch_rows AS r (epoch, part, shard, rows)
                    SELECT e.n, 'log', '', -count(*)
                      FROM changed x JOIN inturn_epoch e ON x.id >= e.lo AND x.id < e.hi
                     GROUP BY e.n
                     ORDER BY e.n
                    ON CONFLICT (epoch, part, shard) DO UPDATE SET rows = r.rows + excluded.rows;
                END IF;
                RETURN NULL;
            END
            $body$
    $f$, current_schema());

    -- What a statement inserted into or deleted from history (the move: one batch, one
    -- statement; erasure), shard ''.
    EXECUTE format($f$
        CREATE FUNCTION inturn_count_history() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            BEGIN
                INSERT INTO inturn_epoch_rows AS r (epoch, part, shard, rows)
                SELECT e.n, 'history', '',
                       CASE TG_OP WHEN 'INSERT' THEN count(*) ELSE -count(*) END
                  FROM changed x
                  JOIN inturn_epoch e ON x.message_id >= e.lo AND x.message_id < e.hi
                 GROUP BY e.n
                 ORDER BY e.n
                ON CONFLICT (epoch, part, shard) DO UPDATE SET rows = r.rows + excluded.rows;
                RETURN NULL;
            END
            $body$
    $f$, current_schema());
END
$migration$;

CREATE TRIGGER inturn_log_inserted AFTER INSERT ON inturn_message
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION inturn_count_log();
CREATE TRIGGER inturn_log_deleted AFTER DELETE ON inturn_message
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION inturn_count_log();
CREATE TRIGGER inturn_history_inserted AFTER INSERT ON inturn_history
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION inturn_count_history();
CREATE TRIGGER inturn_history_deleted AFTER DELETE ON inturn_history
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION inturn_count_history();

-- The epochs that hold rows stored before the triggers (the locks above taken: no insert is
-- in flight) are not counted; their drop counts them.
DO $migration$
DECLARE
    ep record;
    part text;
    held boolean;
BEGIN
    FOR ep IN SELECT n FROM inturn_epoch WHERE dropped_at IS NULL ORDER BY n LOOP
        held := false;
        FOREACH part IN ARRAY ARRAY['inturn_message_e' || ep.n, 'inturn_history_e' || ep.n] LOOP
            IF NOT held AND to_regclass(part) IS NOT NULL THEN
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', part) INTO held;
            END IF;
        END LOOP;
        IF held THEN
            UPDATE inturn_epoch SET counted = false WHERE n = ep.n;
        END IF;
    END LOOP;
END
$migration$;

DO $migration$
DECLARE
    -- the columns a row keeps between the hot table and history (as migration 0034)
    cols text := $c$
        id, destination, channel, control_id, message_type, size, state, attempts,
        enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
        patient_keys, traceparent, resent_as, resent_from
    $c$;
BEGIN
    -- inturn_epoch_keep of migration 0034, its deletion from the history partition (by name:
    -- no trigger of the parent fires) counted.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_epoch_keep(epoch integer) RETURNS integer
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                wanted bigint[];
                back integer;
            BEGIN
                SELECT array_agg(DISTINCT k.id) INTO wanted FROM (
                    SELECT w.record_key::bigint AS id FROM inturn_worklist_item w
                     WHERE w.state = 'pending' AND w.record_kind = 'delivery'
                       AND w.record_key ~ '^[0-9]{1,18}$'
                    UNION ALL
                    SELECT e.delivery_id FROM inturn_order_expectation e
                     WHERE e.answered_at IS NULL
                       AND (e.due_at > now()
                            OR EXISTS (SELECT 1 FROM inturn_worklist_item o
                                        WHERE o.state = 'pending' AND o.record_kind = 'order'
                                          AND o.record_key = e.id::text))) AS k;
                IF wanted IS NULL THEN
                    RETURN 0;
                END IF;
                -- and the copies they were resent as, wherever those are
                wanted := wanted || ARRAY(
                    SELECT d.resent_as FROM inturn_delivery d
                     WHERE d.id = ANY (wanted) AND d.resent_as IS NOT NULL
                    UNION
                    SELECT h.resent_as FROM inturn_history h
                     WHERE h.id = ANY (wanted) AND h.resent_as IS NOT NULL);
                EXECUTE format($q$
                    WITH out AS (
                        DELETE FROM %%1$I h WHERE h.id = ANY ($1) RETURNING h.*
                    ),
                    hot AS (
                        INSERT INTO inturn_delivery (%2$s, message_id, payload, seal_id,
                                                     seal_scope)
                        OVERRIDING SYSTEM VALUE
                        SELECT %3$s, o.message_id, coalesce(o.payload, m.payload),
                               CASE WHEN o.payload IS NOT NULL THEN o.seal_id
                                    ELSE coalesce(m.seal_id, m.id) END,
                               CASE WHEN o.payload IS NOT NULL THEN o.seal_scope
                                    ELSE coalesce(m.seal_scope, 'channel:' || m.channel) END
                          FROM out o LEFT JOIN %%2$I m ON m.id = o.message_id
                        RETURNING id
                    ),
                    tried AS (
                        INSERT INTO inturn_attempt (item_id, attempt, at, outcome, error)
                        SELECT o.id, (a.value ->> 'attempt')::integer,
                               (a.value ->> 'at')::timestamptz, a.value ->> 'outcome',
                               a.value ->> 'error'
                          FROM out o,
                               jsonb_array_elements(coalesce(o.attempt_log, '[]'))
                                   WITH ORDINALITY AS a (value, ordinality)
                         ORDER BY o.id, a.ordinality
                        RETURNING 1
                    )
                    SELECT count(*)::integer FROM hot
                $q$, 'inturn_history_e' || epoch, 'inturn_message_e' || epoch)
                INTO back USING wanted;
                IF back > 0 THEN
                    INSERT INTO inturn_epoch_rows AS r (epoch, part, shard, rows)
                    VALUES (epoch, 'history', '', -back)
                    ON CONFLICT (epoch, part, shard) DO UPDATE SET rows = r.rows + excluded.rows;
                END IF;
                RETURN back;
            END
            $body$
    $f$, current_schema(), cols, regexp_replace(cols, '(\w+)', 'o.\1', 'g'));

    -- inturn_erase_detached of migration 0035, what it deletes from a detached table counted.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_erase_detached(keys text[]) RETURNS bigint
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            DECLARE
                ep record;
                kind text;
                n bigint;
                total bigint := 0;
            BEGIN
                FOR ep IN SELECT e.n FROM inturn_epoch e
                           WHERE e.detached_at IS NOT NULL AND e.dropped_at IS NULL
                           ORDER BY e.n LOOP
                    FOREACH kind IN ARRAY ARRAY['history', 'log'] LOOP
                        IF to_regclass(CASE kind WHEN 'log' THEN 'inturn_message_e'
                                                 ELSE 'inturn_history_e' END || ep.n)
                           IS NOT NULL THEN
                            EXECUTE format('DELETE FROM %%I WHERE patient_keys && $1',
                                           CASE kind WHEN 'log' THEN 'inturn_message_e'
                                                     ELSE 'inturn_history_e' END || ep.n)
                              USING keys;
                            GET DIAGNOSTICS n = ROW_COUNT;
                            IF n > 0 THEN
                                INSERT INTO inturn_epoch_rows AS r (epoch, part, shard, rows)
                                VALUES (ep.n, kind, '', -n)
                                ON CONFLICT (epoch, part, shard)
                                DO UPDATE SET rows = r.rows + excluded.rows;
                            END IF;
                            total := total + n;
                        END IF;
                    END LOOP;
                END LOOP;
                RETURN total;
            END
            $body$
    $f$, current_schema());

    -- inturn_epoch_drop of migration 0034, its counts read from inturn_epoch_rows (a counted
    -- epoch) instead of a count(*) of each partition; the epoch's counter rows go with it.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_epoch_drop(epoch integer, lock_ms integer)
            RETURNS TABLE (log_rows bigint, history_rows bigint, bytes bigint)
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                ep inturn_epoch;
                lr bigint := 0;
                hr bigint := 0;
                b bigint := 0;
            BEGIN
                PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
                SELECT * INTO ep FROM inturn_epoch WHERE n = epoch FOR UPDATE;
                IF ep.detached_at IS NULL THEN
                    RETURN;
                END IF;
                IF EXISTS (SELECT 1 FROM inturn_delivery d
                            WHERE d.payload IS NULL
                              AND d.message_id >= ep.lo AND d.message_id < ep.hi) THEN
                    RETURN;
                END IF;
                IF to_regclass('inturn_message_e' || epoch) IS NOT NULL THEN
                    IF NOT ep.counted THEN
                        EXECUTE format('SELECT count(*) FROM %%I', 'inturn_message_e' || epoch)
                           INTO lr;
                    END IF;
                    b := b + pg_total_relation_size(to_regclass('inturn_message_e' || epoch));
                    EXECUTE format('DROP TABLE %%I', 'inturn_message_e' || epoch);
                END IF;
                IF to_regclass('inturn_history_e' || epoch) IS NOT NULL THEN
                    IF NOT ep.counted THEN
                        EXECUTE format('SELECT count(*) FROM %%I', 'inturn_history_e' || epoch)
                           INTO hr;
                    END IF;
                    b := b + pg_total_relation_size(to_regclass('inturn_history_e' || epoch));
                    EXECUTE format('DROP TABLE %%I', 'inturn_history_e' || epoch);
                END IF;
                -- read after the DROPs: their locks waited for any erasure still deleting
                -- from the detached tables, whose counts this statement then sees
                IF ep.counted THEN
                    SELECT coalesce(sum(r.rows) FILTER (WHERE r.part = 'log'), 0),
                           coalesce(sum(r.rows) FILTER (WHERE r.part = 'history'), 0)
                      INTO lr, hr
                      FROM inturn_epoch_rows r WHERE r.epoch = ep.n;
                END IF;
                DELETE FROM inturn_epoch_rows r WHERE r.epoch = ep.n;
                UPDATE inturn_epoch SET dropped_at = clock_timestamp() WHERE n = epoch;
                RETURN QUERY SELECT lr, hr, b;
            END
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_count_log(), inturn_count_history() FROM PUBLIC;
