-- The login's scope costs a lock call microseconds, not a plan (issue 41, part 1).
--
-- inturn_worker_destination() (migration 0036) was a SQL function: Postgres plans a SQL
-- function's body again for every statement that calls it, about 60 us of server CPU, paid by
-- every call of the worker, unlock and enqueue locks (ingest takes the enqueue lock with every
-- batch it stores). A PL/pgSQL body keeps its plans for the session. Same answer: the session's
-- destination, '' for a destination's login whose mapping is gone, '*' for a login that is
-- not scoped. Online: one function replaced (the row policies spell the scope out themselves,
-- sql/roles.sql, and do not call it).
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION inturn_worker_destination() RETURNS text
            LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %I, pg_temp
            AS $body$
            BEGIN
                RETURN coalesce(
                    (SELECT s.destination FROM inturn_worker_scope s WHERE s.role = session_user),
                    -- a destination's login whose mapping is gone reaches nothing
                    (SELECT '' FROM inturn_role_setting b
                      WHERE b.name = 'worker_role'
                        AND session_user::text ~ ('^' || b.value || '_[0-9a-f]{12}$')),
                    '*');
            END
            $body$
    $f$, current_schema());
END
$migration$;
