-- A role does its own job down to the row (issue 41).
--
-- 1. The singletons' lease rows ('inturn:purge', 'inturn:sweep', 'inturn:local') are written
--    only through their components' SECURITY DEFINER functions (migration 0019): row-level
--    security keeps every other role (the worker's above all) to the destinations' rows, whose
--    names (namespace/name) never hold a colon. The table's owner, and so those functions, are
--    not subject to the policies.
ALTER TABLE inturn_lease ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_lease_read ON inturn_lease FOR SELECT USING (true);
CREATE POLICY inturn_lease_insert ON inturn_lease FOR INSERT
    WITH CHECK (strpos(destination, ':') = 0);
CREATE POLICY inturn_lease_update ON inturn_lease FOR UPDATE
    USING (strpos(destination, ':') = 0) WITH CHECK (strpos(destination, ':') = 0);
CREATE POLICY inturn_lease_delete ON inturn_lease FOR DELETE
    USING (strpos(destination, ':') = 0);

-- 2. A resend link (resent_as: "this message was queued again as that row") is written by the
--    insertion of the copy itself, never by a role's UPDATE: the copy must be a new row of the
--    same destination, channel and MSH-10 that names the original in resent_from. Every link
--    is audited (the resend command writes one audit row for all its copies; a repeat that
--    ingest queues again gets one here). Ingest (a sender's repeat of a failed message) and the
--    resend command both queue copies this way; no role may UPDATE resent_as any more.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION inturn_link_resend() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            BEGIN
                UPDATE inturn_delivery o SET resent_as = NEW.id
                 WHERE o.id = NEW.resent_from AND o.id < NEW.id
                   AND o.destination = NEW.destination AND o.channel = NEW.channel
                   AND o.control_id = NEW.control_id
                   AND (o.resent_as IS NULL OR o.resent_as < NEW.id);
                -- the resend command audits every copy itself (one row for the lot)
                IF FOUND AND coalesce(current_setting('inturn.resend_audited', true), '') <> 'on'
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

CREATE TRIGGER inturn_delivery_resend_link
    AFTER INSERT ON inturn_delivery
    FOR EACH ROW WHEN (NEW.resent_from IS NOT NULL)
    EXECUTE FUNCTION inturn_link_resend();
