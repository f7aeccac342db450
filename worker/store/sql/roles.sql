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
