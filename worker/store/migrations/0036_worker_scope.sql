-- A worker works for the destination it was started for, and the database enforces it (issue 41).
--
-- Every worker used to log in as the one worker role, so any worker could lease, pull, mark or
-- read any destination's rows. Now a login may be scoped to one destination:
--
-- * inturn_worker_scope maps a login role (session_user, which SET ROLE cannot change) to the
--   one destination it works for. A login that is not in it (the shared worker role, the
--   tables' owner, every other component) is not scoped: '*'.
-- * Row-level security: a permissive policy lets every role keep the table privileges it has
--   (roles.py), and `inturn migrate --create-roles` adds a RESTRICTIVE policy for the worker
--   role (its name depends on the role prefix, so it is made there) that keeps a scoped login
--   to its destination's rows. The owner, and so our SECURITY DEFINER functions, are exempt.
-- * The worker's lock functions refuse another destination's lock to a scoped login.
-- * inturn_worker_login(destination, verifier) makes (or re-keys) the login of one destination,
--   a member of the worker role, and maps it; inturn_worker_logout drops it. The operator calls
--   them for each Destination when it runs with --worker-logins=per-destination.

CREATE TABLE inturn_worker_scope (
    role         name        PRIMARY KEY,
    destination  text        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- What `inturn migrate --create-roles` was run with (the worker role's name): the login
-- functions make members of that role and no other.
CREATE TABLE inturn_role_setting (
    name   text PRIMARY KEY,
    value  text NOT NULL
);

DO $migration$
DECLARE
    schema text := current_schema();
BEGIN
    -- The destination the session's login works for, or '*' for a login that is not scoped.
    EXECUTE format($f$
        CREATE FUNCTION inturn_worker_destination() RETURNS text
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
                SELECT coalesce(
                    (SELECT s.destination FROM inturn_worker_scope s WHERE s.role = session_user),
                    -- a destination's login whose mapping is gone reaches nothing
                    (SELECT '' FROM inturn_role_setting b
                      WHERE b.name = 'worker_role'
                        AND session_user::text ~ ('^' || b.value || '_[0-9a-f]{12}$')),
                    '*')
            $body$
    $f$, schema);

    -- The worker's session lock, its release, and the enqueue lock: another destination's is
    -- refused to a scoped login (an error, not a "not taken": it is never a race).
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_worker_lock(destination text) RETURNS boolean
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_catalog, pg_temp
            AS $body$
            DECLARE scope text := inturn_worker_destination();
            BEGIN
                IF scope <> '*' AND scope <> destination THEN
                    RAISE EXCEPTION 'this login works for %%, not %%', scope, destination
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                RETURN pg_try_advisory_lock(hashtextextended('inturn:worker:' || destination, 0));
            END
            $body$
    $f$, schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_worker_unlock(destination text) RETURNS boolean
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_catalog, pg_temp
            AS $body$
            DECLARE scope text := inturn_worker_destination();
            BEGIN
                IF scope <> '*' AND scope <> destination THEN
                    RAISE EXCEPTION 'this login works for %%, not %%', scope, destination
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                RETURN pg_advisory_unlock(hashtextextended('inturn:worker:' || destination, 0));
            END
            $body$
    $f$, schema);
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_enqueue_lock(destination text) RETURNS boolean
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_catalog, pg_temp
            AS $body$
            DECLARE scope text := inturn_worker_destination();
            BEGIN
                IF scope <> '*' AND scope <> destination THEN
                    RAISE EXCEPTION 'this login works for %%, not %%', scope, destination
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                PERFORM pg_advisory_xact_lock(hashtextextended('inturn:enqueue:' || destination, 0));
                RETURN true;
            END
            $body$
    $f$, schema);

    -- The login of one destination's worker: created when missing (LOGIN, a member of the
    -- worker role that --create-roles recorded), mapped to the destination, its password set
    -- from a verifier (a SCRAM-SHA-256 verifier, never a clear password: the call may be
    -- logged) when one is given. Its name is the worker role's followed by 12 hex digits of a
    -- digest of the database, schema and destination (roles are shared by the whole server).
    EXECUTE format($f$
        CREATE FUNCTION inturn_worker_login(destination text, verifier text) RETURNS text
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            DECLARE
                base text := (SELECT value FROM inturn_role_setting WHERE name = 'worker_role');
                login text;
            BEGIN
                IF base IS NULL THEN
                    RAISE EXCEPTION 'no worker role recorded: run inturn migrate --create-roles first'
                        USING ERRCODE = 'object_not_in_prerequisite_state';
                END IF;
                IF destination IS NULL OR destination !~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$' THEN
                    RAISE EXCEPTION 'not a destination name (namespace/name): %%', destination
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF verifier IS NOT NULL AND verifier !~ '^SCRAM-SHA-256\$[0-9]+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+$' THEN
                    RAISE EXCEPTION 'a password is given as a SCRAM-SHA-256 verifier'
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                login := base || '_' || left(md5(current_database() || ':' || current_schema()
                                                 || ':' || destination), 12);
                PERFORM pg_advisory_xact_lock(hashtextextended('inturn:login:' || login, 0));
                IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = login) THEN
                    IF NOT EXISTS (SELECT 1 FROM inturn_worker_scope s
                                    WHERE s.role = login AND s.destination = inturn_worker_login.destination) THEN
                        RAISE EXCEPTION 'role %% exists and is not the worker login of %%', login, destination
                            USING ERRCODE = 'duplicate_object';
                    END IF;
                ELSE
                    EXECUTE format('CREATE ROLE %%I LOGIN IN ROLE %%I', login, base);
                    INSERT INTO inturn_worker_scope (role, destination) VALUES (login, destination)
                    ON CONFLICT ON CONSTRAINT inturn_worker_scope_destination_key DO UPDATE SET role = excluded.role, created_at = now();
                END IF;
                IF verifier IS NOT NULL THEN
                    EXECUTE format('ALTER ROLE %%I PASSWORD %%L', login, verifier);
                END IF;
                RETURN login;
            END
            $body$
    $f$, schema);

    -- A deleted Destination's login goes with it (its mapping first: a login that is not
    -- mapped would not be scoped, so both go in one transaction or neither).
    EXECUTE format($f$
        CREATE FUNCTION inturn_worker_logout(destination text) RETURNS boolean
            LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            DECLARE login text;
            BEGIN
                DELETE FROM inturn_worker_scope s WHERE s.destination = inturn_worker_logout.destination
                RETURNING s.role INTO login;
                IF login IS NULL THEN
                    RETURN false;
                END IF;
                IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = login) THEN
                    EXECUTE format('DROP ROLE %%I', login);
                END IF;
                RETURN true;
            END
            $body$
    $f$, schema);
END
$migration$;

REVOKE EXECUTE ON FUNCTION inturn_worker_destination() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION inturn_worker_login(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION inturn_worker_logout(text) FROM PUBLIC;

-- Row-level security on what a worker reads and writes: every role keeps what its grants give
-- it (the permissive policy), and --create-roles adds the worker's restrictive one.
ALTER TABLE inturn_delivery ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_delivery USING (true) WITH CHECK (true);
ALTER TABLE inturn_message ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_message USING (true) WITH CHECK (true);
ALTER TABLE inturn_cursor ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_cursor USING (true) WITH CHECK (true);
ALTER TABLE inturn_worker_sender ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_worker_sender USING (true) WITH CHECK (true);
ALTER TABLE inturn_attempt ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_attempt USING (true) WITH CHECK (true);
ALTER TABLE inturn_worklist_item ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_worklist_item USING (true) WITH CHECK (true);
ALTER TABLE inturn_order_expectation ENABLE ROW LEVEL SECURITY;
CREATE POLICY inturn_granted ON inturn_order_expectation USING (true) WITH CHECK (true);
