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
-- worker role, composed in as an identifier.

-- fragment: worker_scope
-- The destination the session's login works for; '' for a destination's login whose mapping is
-- gone (it reaches nothing); '*' for a login that is not scoped. inturn_worker_destination()'s
-- answer, written out so that the planner makes it two init plans, evaluated once per
-- statement (a PK probe, a cached regular expression), where a call of the function costs
-- one of its SECURITY DEFINER calls per policy per statement. The worker role reads both tables.
coalesce((SELECT s.destination FROM inturn_worker_scope s WHERE s.role = session_user),
         (SELECT '' FROM inturn_role_setting b
           WHERE b.name = 'worker_role'
             AND session_user::text ~ ('^' || b.value || '_[0-9a-f]{{12}}$')),
         '*')

-- name: worker_policy_inturn_delivery
CREATE POLICY {policy} ON inturn_delivery AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination);

-- name: worker_pull_policy
-- The only row a worker inserts is its pull's slim row: it must name a log message whose route
-- set names the row's destination (and that the login may read: inturn_message's own policy),
-- so no worker, the shared role included, makes a row of nothing or hands a destination a
-- message not routed to it. Insertions only: the delivered mark (an UPDATE) pays nothing.
CREATE POLICY {policy} ON inturn_delivery AS RESTRICTIVE FOR INSERT TO {role}
    WITH CHECK (EXISTS (SELECT 1 FROM inturn_message m JOIN inturn_route r ON r.id = m.route
                         WHERE m.id = inturn_delivery.message_id
                           AND r.destinations @> ARRAY[inturn_delivery.destination]));

-- name: worker_policy_inturn_cursor
CREATE POLICY {policy} ON inturn_cursor AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination);

-- name: worker_policy_inturn_lease
CREATE POLICY {policy} ON inturn_lease AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination);

-- name: worker_policy_inturn_worker_sender
CREATE POLICY {policy} ON inturn_worker_sender AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination);

-- name: worker_policy_inturn_order_expectation
CREATE POLICY {policy} ON inturn_order_expectation AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination);

-- name: worker_policy_inturn_sequence
CREATE POLICY {policy} ON inturn_sequence AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination);

-- name: worker_policy_inturn_sequence_number
-- A number is the worker's when its destination is, and it numbers a delivery row of that
-- destination (the foreign key alone is checked as the owner: it would let a number be put
-- on another destination's row).
CREATE POLICY {policy} ON inturn_sequence_number AS RESTRICTIVE FOR ALL TO {role}
    USING (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination)
    WITH CHECK (coalesce(nullif((
        -- include: worker_scope
        ), '*'), destination) = destination
                AND EXISTS (SELECT 1 FROM inturn_delivery d
                             WHERE d.id = item_id
                               AND d.destination = inturn_sequence_number.destination));

-- name: worker_policy_inturn_message
-- A log row is the worker's when one of its route sets names the destination.
CREATE POLICY {policy} ON inturn_message AS RESTRICTIVE FOR ALL TO {role}
    USING ((
        -- include: worker_scope
        ) = '*'
           OR route = ANY (ARRAY(SELECT r.id FROM inturn_route r
                                  WHERE r.destinations @> ARRAY[(
        -- include: worker_scope
        )])));

-- name: worker_policy_inturn_attempt
-- An attempt is the worker's when its delivery row is (that row's own policy decides).
CREATE POLICY {policy} ON inturn_attempt AS RESTRICTIVE FOR ALL TO {role}
    USING ((
        -- include: worker_scope
        ) = '*'
           OR EXISTS (SELECT 1 FROM inturn_delivery d WHERE d.id = item_id))
    WITH CHECK ((
        -- include: worker_scope
        ) = '*'
                OR EXISTS (SELECT 1 FROM inturn_delivery d WHERE d.id = item_id));

-- name: worker_policy_inturn_worklist_item
-- The worker places and reads items about its own delivery rows only.
CREATE POLICY {policy} ON inturn_worklist_item AS RESTRICTIVE FOR ALL TO {role}
    USING ((
        -- include: worker_scope
        ) = '*'
           OR (record_kind = 'delivery'
               AND CASE WHEN record_key ~ '^[0-9]{{1,18}}$'
                        THEN EXISTS (SELECT 1 FROM inturn_delivery d
                                      WHERE d.id = record_key::bigint)
                        ELSE false END))
    WITH CHECK ((
        -- include: worker_scope
        ) = '*'
                OR (record_kind = 'delivery'
                    AND CASE WHEN record_key ~ '^[0-9]{{1,18}}$'
                             THEN EXISTS (SELECT 1 FROM inturn_delivery d
                                           WHERE d.id = record_key::bigint)
                             ELSE false END));

-- name: sweeper_skip_policy
-- The sweeper's one change of a delivery row is delivery-expired's skip: a pending row becomes
-- skipped, with who decided and when. With UPDATE on state alone it could mark any message
-- delivered (gone from depth, the worklists and purge's care, no person deciding, no audit).
CREATE POLICY {policy} ON inturn_delivery AS RESTRICTIVE FOR UPDATE TO {role}
    USING (state = 'pending')
    WITH CHECK (state = 'skipped' AND decided_by IS NOT NULL AND finished_at IS NOT NULL);

-- name: drop_worker_policy
DROP POLICY IF EXISTS {policy} ON {table};
