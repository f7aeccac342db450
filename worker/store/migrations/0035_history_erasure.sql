-- Erasure reaches the days being dropped (issue 37). Between a day's DETACH and its DROP (one
-- run of `inturn purge`: normally a moment, longer only when the drop failed and waits for
-- the next run), its log and history partitions are tables of their own that no statement on
-- inturn_message or inturn_history sees. An erasure by patient deletes their rows that name
-- the patient there too (every stored form of the key, as the identifier index holds it), so
-- that nothing inturn still holds escapes it. SECURITY DEFINER: the admin role (which erases)
-- is granted nothing on those tables. Returns the rows deleted.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_erase_detached(keys text[]) RETURNS bigint
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %1$I, pg_temp
            AS $body$
            DECLARE
                ep record;
                part text;
                n bigint;
                total bigint := 0;
            BEGIN
                FOR ep IN SELECT e.n FROM inturn_epoch e
                           WHERE e.detached_at IS NOT NULL AND e.dropped_at IS NULL
                           ORDER BY e.n LOOP
                    FOREACH part IN ARRAY ARRAY['inturn_history_e' || ep.n,
                                                'inturn_message_e' || ep.n] LOOP
                        IF to_regclass(part) IS NOT NULL THEN
                            EXECUTE format('DELETE FROM %%I WHERE patient_keys && $1', part)
                              USING keys;
                            GET DIAGNOSTICS n = ROW_COUNT;
                            total := total + n;
                        END IF;
                    END LOOP;
                END LOOP;
                RETURN total;
            END
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_erase_detached(text[]) FROM PUBLIC;
