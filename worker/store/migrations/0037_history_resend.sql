-- A finished item moved to history can be resent (issue 37): the copy's insertion links its
-- original wherever the original lies, the hot table or history (migration 0032's trigger
-- looked in the hot table only), with the same checks and the same audit.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_link_resend() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            DECLARE linked boolean;
            BEGIN
                UPDATE inturn_delivery o SET resent_as = NEW.id
                 WHERE o.id = NEW.resent_from AND o.id < NEW.id
                   AND o.destination = NEW.destination AND o.channel = NEW.channel
                   AND o.control_id = NEW.control_id
                   AND (o.resent_as IS NULL OR o.resent_as < NEW.id);
                linked := FOUND;
                IF NOT linked THEN
                    UPDATE inturn_history o SET resent_as = NEW.id
                     WHERE o.id = NEW.resent_from AND o.id < NEW.id
                       AND o.destination = NEW.destination AND o.channel = NEW.channel
                       AND o.control_id = NEW.control_id
                       AND (o.resent_as IS NULL OR o.resent_as < NEW.id);
                    linked := FOUND;
                END IF;
                -- the resend command audits every copy itself (one row for the lot)
                IF linked AND coalesce(current_setting('inturn.resend_audited', true), '') <> 'on'
                THEN
                    INSERT INTO inturn_audit (who, action, destination, item_ids, why)
                    VALUES (session_user, 'resend-linked', NEW.destination,
                            ARRAY[NEW.resent_from, NEW.id], 'a copy was queued');
                END IF;
                RETURN NULL;
            END
            $body$
    $f$, current_schema());
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_link_resend() FROM PUBLIC;
