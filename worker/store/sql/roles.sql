-- Named queries of `inturn migrate --create-roles` (inturn.worker.store.roles): catalog reads.
-- The CREATE ROLE / GRANT / REVOKE statements name roles and tables, so they are composed in
-- Python with psycopg.sql identifiers.

-- name: tables
-- inturn's tables in the current schema (a partitioned table once: its partitions are reached
-- through it, with its privileges, and get none of their own).
SELECT c.relname::text AS tablename
  FROM pg_class c
 WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind IN ('r', 'p')
   AND NOT c.relispartition AND starts_with(c.relname, 'inturn_')
   -- a day's log or history partition detached and not dropped yet (migration 0034): the
   -- maintenance job's alone, nobody is granted it
   AND c.relname !~ '^inturn_(message|history)_e[0-9]+$'
 ORDER BY 1;

-- name: columns
-- A table's live columns, in order.
SELECT attname
  FROM pg_attribute
 WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped
 ORDER BY attnum;

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s) AS present;

-- name: current_schema
SELECT current_schema() AS schema;

-- name: functions
-- inturn's functions in the current schema, as signatures (regprocedure text, unqualified).
SELECT p.oid::regprocedure::text AS signature
  FROM pg_proc p
 WHERE p.pronamespace = to_regnamespace(current_schema()) AND starts_with(p.proname, 'inturn_')
 ORDER BY 1;

-- name: function_owner
-- The role owning a function (the tables' owner, who migrated).
SELECT pg_get_userbyid(proowner) AS owner FROM pg_proc WHERE oid = to_regprocedure(%(signature)s);

-- name: public_executes
-- Which of the given functions PUBLIC may still execute.
SELECT f AS signature
  FROM unnest(%(signatures)s::text[]) AS f
 WHERE has_function_privilege('public', f::regprocedure, 'EXECUTE');

-- name: record_worker_role
-- The worker role's name, for the per-destination login functions (migration 0036).
INSERT INTO inturn_role_setting (name, value) VALUES ('worker_role', %(role)s)
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- The worker role's restrictive row policies (migration 0036), one per table it reads or
-- writes: a login scoped to one destination (inturn_worker_scope) reaches that destination's
-- rows only; a login that is not scoped ('*') reaches what its grants give. `{role}` is the
-- worker role, composed in as an identifier; the scope is read once per statement.

-- name: worker_policy_inturn_delivery
CREATE POLICY {policy} ON inturn_delivery AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) IN ('*', destination))
    WITH CHECK ((SELECT inturn_worker_destination()) IN ('*', destination));

-- name: worker_pull_policy
-- The only row a worker inserts is its pull's slim row: a scoped login's must name a log
-- message it may read (inturn_message's own policy: routed to its destination), so it can
-- neither make a row of nothing nor point one at another destination's message. Insertions
-- only: the delivered mark (an UPDATE) pays nothing for it.
CREATE POLICY {policy} ON inturn_delivery AS RESTRICTIVE FOR INSERT TO {role}
    WITH CHECK ((SELECT inturn_worker_destination()) = '*'
                OR EXISTS (SELECT 1 FROM inturn_message m WHERE m.id = message_id));

-- name: worker_policy_inturn_cursor
CREATE POLICY {policy} ON inturn_cursor AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) IN ('*', destination))
    WITH CHECK ((SELECT inturn_worker_destination()) IN ('*', destination));

-- name: worker_policy_inturn_lease
CREATE POLICY {policy} ON inturn_lease AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) IN ('*', destination))
    WITH CHECK ((SELECT inturn_worker_destination()) IN ('*', destination));

-- name: worker_policy_inturn_worker_sender
CREATE POLICY {policy} ON inturn_worker_sender AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) IN ('*', destination))
    WITH CHECK ((SELECT inturn_worker_destination()) IN ('*', destination));

-- name: worker_policy_inturn_order_expectation
CREATE POLICY {policy} ON inturn_order_expectation AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) IN ('*', destination))
    WITH CHECK ((SELECT inturn_worker_destination()) IN ('*', destination));

-- name: worker_policy_inturn_message
-- A log row is the worker's when one of its route sets names the destination.
CREATE POLICY {policy} ON inturn_message AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) = '*'
           OR route = ANY (ARRAY(SELECT r.id FROM inturn_route r
                                  WHERE r.destinations @> ARRAY[inturn_worker_destination()])));

-- name: worker_policy_inturn_attempt
-- An attempt is the worker's when its delivery row is (that row's own policy decides).
CREATE POLICY {policy} ON inturn_attempt AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) = '*'
           OR EXISTS (SELECT 1 FROM inturn_delivery d WHERE d.id = item_id))
    WITH CHECK ((SELECT inturn_worker_destination()) = '*'
                OR EXISTS (SELECT 1 FROM inturn_delivery d WHERE d.id = item_id));

-- name: worker_policy_inturn_worklist_item
-- The worker places and reads items about its own delivery rows only.
CREATE POLICY {policy} ON inturn_worklist_item AS RESTRICTIVE FOR ALL TO {role}
    USING ((SELECT inturn_worker_destination()) = '*'
           OR (record_kind = 'delivery'
               AND CASE WHEN record_key ~ '^[0-9]{{1,18}}$'
                        THEN EXISTS (SELECT 1 FROM inturn_delivery d
                                      WHERE d.id = record_key::bigint)
                        ELSE false END))
    WITH CHECK ((SELECT inturn_worker_destination()) = '*'
                OR (record_kind = 'delivery'
                    AND CASE WHEN record_key ~ '^[0-9]{{1,18}}$'
                             THEN EXISTS (SELECT 1 FROM inturn_delivery d
                                           WHERE d.id = record_key::bigint)
                             ELSE false END));

-- name: drop_worker_policy
DROP POLICY IF EXISTS {policy} ON {table};
