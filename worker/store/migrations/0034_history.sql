-- History that leaves by the partition (issue 37; docs/explanation/storage-layout.md).
--
-- A finished delivery row (delivered, failed, skipped) stays in the hot table inturn_delivery
-- for a short while (the hot window of `inturn purge`), then moves, in bounded batches, into
-- inturn_history: partitioned like the channel log by ranges of message ids, one partition per
-- epoch beside the log's, with the same bounds. Retention drops an epoch's log and history
-- partitions together, after moving out of them what a person still needs. The functions
-- below are the maintenance job's (`inturn purge`, the purge role, which has no table
-- privilege of its own): each is one short transaction under a lock_timeout.
--
-- Online: a new partitioned table with one empty partition, three nullable columns on
-- inturn_epoch, its opened_at made nullable (a prepared epoch is not open yet), a settings
-- table: catalog changes only. The delivery table is not touched.

ALTER TABLE inturn_epoch ALTER COLUMN opened_at DROP NOT NULL;
ALTER TABLE inturn_epoch ALTER COLUMN opened_at DROP DEFAULT;
ALTER TABLE inturn_epoch ADD COLUMN detached_at timestamptz;  -- partitions detached (not dropped)
ALTER TABLE inturn_epoch ADD COLUMN dropped_at timestamptz;   -- partitions dropped

-- A finished delivery row as it left the hot table: the same columns (a test keeps them so),
-- its failed attempts folded into attempt_log (inturn_attempt's rows go with the hot row, ON
-- DELETE CASCADE), and when it moved. message_id is the partition key: the row's log message,
-- or, for a row that holds its own payload (stored before the channel log, or one whose day was
-- dropped while it was still hot), an id drawn from the log's sequence that no log row has,
-- which places it in the epoch it moved in.
CREATE TABLE inturn_history (
    id            bigint      NOT NULL,            -- the item's id, as it was in inturn_delivery
    message_id    bigint      NOT NULL,
    destination   text        NOT NULL,
    channel       text        NOT NULL,
    control_id    text        NOT NULL,            -- MSH-10
    message_type  text        NOT NULL,            -- MSH-9
    payload       bytea,                           -- NULL: the log row's (message_id)
    size          integer     NOT NULL,
    state         text        NOT NULL CHECK (state IN ('delivered', 'failed', 'skipped')),
    attempts      integer     NOT NULL,
    enqueued_at   timestamptz NOT NULL,
    next_attempt  timestamptz NOT NULL,
    last_attempt  timestamptz,
    last_error    text,
    reason        text,
    decided_by    text,
    finished_at   timestamptz NOT NULL,
    patient_keys  text[],
    traceparent   text,
    resent_as     bigint,
    resent_from   bigint,
    seal_id       bigint,
    seal_scope    text,
    attempt_log   jsonb,                           -- [{attempt, at, outcome, error}], oldest first
    moved_at      timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (message_id);

CREATE TABLE inturn_history_e1 PARTITION OF inturn_history
    FOR VALUES FROM (1) TO (1099511627776);

-- Per partition: an item by its id (lookups, resend, erasure by id), MSH-10, patients (lookups
-- and erasure), a destination's items newest first (listings).
CREATE INDEX inturn_history_id ON inturn_history (id);
CREATE INDEX inturn_history_control_id ON inturn_history USING hash (control_id);
CREATE INDEX inturn_history_patient ON inturn_history USING gin (patient_keys);
CREATE INDEX inturn_history_destination ON inturn_history (destination, id DESC);

-- What the maintenance job was last told and did (one row): the console, `inturn queue depth`
-- and /metrics read it to say when an epoch was not turned or a drop is overdue.
CREATE TABLE inturn_maintenance (
    one                boolean     PRIMARY KEY DEFAULT true CHECK (one),
    retention_seconds  float8      NOT NULL,
    epoch_seconds      float8      NOT NULL,
    hot_seconds        float8      NOT NULL,
    ran_at             timestamptz NOT NULL,
    turned_at          timestamptz,
    dropped_at         timestamptz
);

DO $migration$
DECLARE
    -- the rule of migration 0031 (what a person still needs), for a row "x": a pending
    -- worklist item names it, or its order reply is awaited; and, so that a resend's chain
    -- stays where the sweeper follows it, a copy whose original a pending item names
    keep text := $k$
        (EXISTS (SELECT 1 FROM inturn_worklist_item w
                  WHERE w.state = 'pending' AND w.record_kind = 'delivery'
                    AND w.record_key = x.id::text)
         OR EXISTS (SELECT 1 FROM inturn_order_expectation e
                     WHERE e.delivery_id = x.id AND e.answered_at IS NULL
                       AND (e.due_at > now()
                            OR EXISTS (SELECT 1 FROM inturn_worklist_item o
                                        WHERE o.state = 'pending' AND o.record_kind = 'order'
                                          AND o.record_key = e.id::text)))
         OR (x.resent_from IS NOT NULL
             AND EXISTS (SELECT 1 FROM inturn_worklist_item w
                          WHERE w.state = 'pending' AND w.record_kind = 'delivery'
                            AND w.record_key = x.resent_from::text)))
    $k$;
    -- the columns a row keeps between the hot table and history
    cols text := $c$
        id, destination, channel, control_id, message_type, size, state, attempts,
        enqueued_at, next_attempt, last_attempt, last_error, reason, decided_by, finished_at,
        patient_keys, traceparent, resent_as, resent_from
    $c$;
BEGIN
    -- The hot window's move: one batch of finished rows older than hot_seconds, oldest first,
    -- rows a person still needs left where they are; locked rows skipped (a racing mark).
    -- A row holding its own payload keeps it (and its binding); a slim row's message stays
    -- where it is in the log. Returns the rows moved.
    EXECUTE format($f$
        CREATE FUNCTION inturn_history_move(hot_seconds float8, batch integer) RETURNS integer
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                moved integer;
            BEGIN
                WITH live AS (
                    SELECT min(lo) AS lo FROM inturn_epoch WHERE detached_at IS NULL
                ),
                picked AS (
                    SELECT x.id FROM inturn_delivery x
                     WHERE x.state <> 'pending'
                       AND x.finished_at
                           < clock_timestamp() - make_interval(secs => hot_seconds)
                       AND NOT %2$s
                     ORDER BY x.finished_at
                     LIMIT least(batch, 5000)
                       FOR UPDATE SKIP LOCKED
                ),
                gone AS (
                    DELETE FROM inturn_delivery d USING picked p
                     WHERE d.id = p.id AND d.state <> 'pending'
                    RETURNING d.*
                ),
                put AS (
                    INSERT INTO inturn_history (%3$s, message_id, payload, seal_id, seal_scope,
                                                attempt_log)
                    SELECT %4$s,
                           CASE WHEN g.message_id IS NULL OR g.message_id < live.lo
                                THEN nextval('inturn_message_id_seq')
                                ELSE g.message_id END,
                           g.payload, g.seal_id, g.seal_scope,
                           (SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt,
                                                                'at', a.at,
                                                                'outcome', a.outcome,
                                                                'error', a.error)
                                             ORDER BY a.id)
                              FROM inturn_attempt a WHERE a.item_id = g.id)
                      FROM gone g CROSS JOIN live
                    RETURNING 1
                )
                SELECT count(*) INTO moved FROM put;
                RETURN moved;
            END
            $body$
    $f$, current_schema(), keep, cols, regexp_replace(cols, '(\w+)', 'g.\1', 'g'));

    -- What the move would take now, all batches together (inturn purge --dry-run).
    EXECUTE format($f$
        CREATE FUNCTION inturn_history_movable(hot_seconds float8) RETURNS bigint
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
                SELECT count(*) FROM inturn_delivery x
                 WHERE x.state <> 'pending'
                   AND x.finished_at < clock_timestamp() - make_interval(secs => hot_seconds)
                   AND NOT %2$s
            $body$
    $f$, current_schema(), keep);

    -- Create the next epoch's log and history partitions ahead (empty tables, a CHECK of their
    -- range, ATTACH: a SHARE UPDATE EXCLUSIVE lock on the parents, which ingest's and the
    -- workers' statements do not conflict with), and record the epoch, not yet open. Returns
    -- its number, or 0 when the next epoch was prepared already.
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_prepare(lock_ms integer) RETURNS integer
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
                                   ' INCLUDING CONSTRAINTS INCLUDING STORAGE)', part, parent);
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

    -- Turn the epoch when the open one is older than epoch_seconds and the next is prepared:
    -- the log's sequence moves to the next range's start (only forward: setval is not undone
    -- by a rollback, and a turn interrupted after it is finished by the next call), the open
    -- epoch is closed and the next opened. Returns the epoch opened, or 0.
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_turn(epoch_seconds float8) RETURNS integer
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                cur inturn_epoch;
                nxt inturn_epoch;
                at_value bigint;
            BEGIN
                SELECT * INTO cur FROM inturn_epoch
                 WHERE opened_at IS NOT NULL AND closed_at IS NULL
                 ORDER BY n DESC LIMIT 1 FOR UPDATE;
                IF NOT FOUND
                   OR cur.opened_at > clock_timestamp() - make_interval(secs => epoch_seconds) THEN
                    RETURN 0;
                END IF;
                SELECT * INTO nxt FROM inturn_epoch WHERE n = cur.n + 1 FOR UPDATE;
                IF NOT FOUND THEN
                    RETURN 0;
                END IF;
                SELECT last_value INTO at_value FROM inturn_message_id_seq;
                IF at_value < nxt.lo THEN
                    PERFORM setval('inturn_message_id_seq', nxt.lo, false);
                END IF;
                UPDATE inturn_epoch SET closed_at = clock_timestamp() WHERE n = cur.n;
                UPDATE inturn_epoch SET opened_at = clock_timestamp() WHERE n = nxt.n;
                RETURN nxt.n;
            END
            $body$
    $f$, current_schema());

    -- Before a day goes, each destination whose cursor is behind in it: one batch of its pull
    -- (the worker's pull, statement for statement, under the same enqueue lock taken by a
    -- statement of its own, without a lease: the rows are the destination's whoever pulls
    -- them). Returns the destination (for its worker's wake-up) and the rows pulled; no row
    -- when no destination is behind in the epoch.
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_pull(epoch integer, lim integer)
            RETURNS TABLE (destination text, pulled integer)
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                ep inturn_epoch;
                dest text;
                chan text;
                pulled_n integer;
            BEGIN
                SELECT * INTO ep FROM inturn_epoch e WHERE e.n = epoch;
                SELECT u.dest, r.channel INTO dest, chan
                  FROM inturn_route r
                 CROSS JOIN LATERAL unnest(r.destinations) AS u(dest)
                  LEFT JOIN inturn_cursor c ON c.destination = u.dest
                 WHERE coalesce(c.position, 0) < ep.hi - 1
                   AND EXISTS (SELECT 1 FROM inturn_message m
                                WHERE m.channel = r.channel AND m.route = r.id
                                  AND m.id > greatest(coalesce(c.position, 0), ep.lo - 1)
                                  AND m.id < ep.hi)
                 ORDER BY u.dest
                 LIMIT 1;
                IF dest IS NULL THEN
                    RETURN;
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
                RETURN QUERY SELECT dest, pulled_n;
            END
            $body$
    $f$, current_schema());

    -- Hot rows whose message is in the epoch and that hold no payload of their own get a copy
    -- of it, with the binding it was sealed under (the log row's), so that it opens and is
    -- sent after the log's partition is gone: one keyset page of the hot table (ids after
    -- "after", "batch" of them), read from the epoch's own log partition (attached or
    -- detached). Returns the last id looked at (NULL: the end) and the rows given a payload.
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_copy(epoch integer, after bigint, batch integer)
            RETURNS TABLE (last_id bigint, copied integer)
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                ep inturn_epoch;
            BEGIN
                SELECT * INTO ep FROM inturn_epoch WHERE n = epoch;
                RETURN QUERY EXECUTE format($q$
                    WITH page AS (
                        SELECT d.id FROM inturn_delivery d
                         WHERE d.id > $1 ORDER BY d.id LIMIT least($2, 10000)
                    ),
                    given AS (
                        UPDATE inturn_delivery d
                           SET payload = m.payload,
                               seal_id = coalesce(m.seal_id, m.id),
                               seal_scope = coalesce(m.seal_scope, 'channel:' || m.channel)
                          FROM page p, %%I m
                         WHERE d.id = p.id AND d.payload IS NULL
                           AND d.message_id >= $3 AND d.message_id < $4
                           AND m.id = d.message_id
                        RETURNING 1
                    )
                    SELECT (SELECT max(id) FROM page), (SELECT count(*)::integer FROM given)
                $q$, 'inturn_message_e' || epoch)
                USING after, batch, ep.lo, ep.hi;
            END
            $body$
    $f$, current_schema());

    -- Finished rows of the epoch's history that a person still needs (the rule above: a pending
    -- worklist item names them, their order reply is awaited; and the copy a kept row was
    -- resent as) go back to the hot table with their payload and binding and their attempts,
    -- ids unchanged. Driven by the pending items and expectations (few), each found by the
    -- history partition's id index. Returns the rows put back.
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_keep(epoch integer) RETURNS integer
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
                RETURN back;
            END
            $body$
    $f$, current_schema(), cols, regexp_replace(cols, '(\w+)', 'o.\1', 'g'));
END
$migration$;

-- Detach an epoch's log and history partitions (a plain DETACH: a function runs inside a
-- transaction, where DETACH ... CONCURRENTLY cannot; the ACCESS EXCLUSIVE lock on the parents
-- lasts as long as the catalog update, and a caller's lock_timeout bounds its wait, so that
-- ingest and the workers queue behind it no longer than that) and record it. Returns true when
-- both are detached (now or before).
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_detach(epoch integer, lock_ms integer) RETURNS boolean
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            #variable_conflict use_column
            DECLARE
                parent text;
                part text;
            BEGIN
                PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
                FOREACH parent IN ARRAY ARRAY['inturn_message', 'inturn_history'] LOOP
                    part := parent || '_e' || epoch;
                    IF EXISTS (SELECT 1 FROM pg_inherits i
                                WHERE i.inhrelid = to_regclass(part)
                                  AND i.inhparent = to_regclass(parent)) THEN
                        EXECUTE format('ALTER TABLE %%I DETACH PARTITION %%I', parent, part);
                    END IF;
                END LOOP;
                UPDATE inturn_epoch SET detached_at = coalesce(detached_at, clock_timestamp())
                 WHERE n = epoch;
                RETURN true;
            END
            $body$
    $f$, current_schema());

    -- Drop an epoch's detached partitions, once no hot row still reads a payload from its log
    -- (inturn_epoch_copy gave them theirs): returns the rows and bytes dropped, or NULL rows
    -- (nothing dropped) when a hot row still needs the log partition.
    EXECUTE format($f$
        CREATE FUNCTION inturn_epoch_drop(epoch integer, lock_ms integer)
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
                    EXECUTE format('SELECT count(*) FROM %%I', 'inturn_message_e' || epoch)
                       INTO lr;
                    b := b + pg_total_relation_size(to_regclass('inturn_message_e' || epoch));
                    EXECUTE format('DROP TABLE %%I', 'inturn_message_e' || epoch);
                END IF;
                IF to_regclass('inturn_history_e' || epoch) IS NOT NULL THEN
                    EXECUTE format('SELECT count(*) FROM %%I', 'inturn_history_e' || epoch)
                       INTO hr;
                    b := b + pg_total_relation_size(to_regclass('inturn_history_e' || epoch));
                    EXECUTE format('DROP TABLE %%I', 'inturn_history_e' || epoch);
                END IF;
                UPDATE inturn_epoch SET dropped_at = clock_timestamp() WHERE n = epoch;
                RETURN QUERY SELECT lr, hr, b;
            END
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION
    inturn_history_move(float8, integer), inturn_history_movable(float8),
    inturn_epoch_prepare(integer), inturn_epoch_turn(float8),
    inturn_epoch_pull(integer, integer), inturn_epoch_copy(integer, bigint, integer),
    inturn_epoch_keep(integer), inturn_epoch_detach(integer, integer),
    inturn_epoch_drop(integer, integer)
  FROM PUBLIC;
