-- A route set never changes once made (issue 41, part 1).
--
-- Ingest upserts a re-send's route set (ON CONFLICT ... DO UPDATE SET channel = excluded.channel,
-- a change of nothing that returns the id of a set that exists), for which it holds UPDATE on
-- inturn_route.channel. That privilege alone let an ingest credential move any route set to
-- another channel: every log message of the set would stop being pulled by the destinations it
-- names (the pull reads the sets of its own channel), accepted and never delivered, with no
-- person deciding. Now no update may change a route set (its id, channel or destinations), the
-- owner's included; the upsert's change of nothing still returns its id. Online: a trigger.
CREATE FUNCTION inturn_route_fixed() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
    AS $$
    BEGIN
        IF NEW IS DISTINCT FROM OLD THEN
            RAISE EXCEPTION 'route set % cannot change (its messages are routed by it)', OLD.id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    END
    $$;
REVOKE EXECUTE ON FUNCTION inturn_route_fixed() FROM PUBLIC;

CREATE TRIGGER inturn_route_fixed BEFORE UPDATE ON inturn_route
    FOR EACH ROW EXECUTE FUNCTION inturn_route_fixed();
