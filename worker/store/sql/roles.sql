-- Named queries of `inturn migrate --create-roles` (inturn.worker.store.roles): catalog reads.
-- The CREATE ROLE / GRANT / REVOKE statements name roles and tables, so they are composed in
-- Python with psycopg.sql identifiers.

-- name: tables
-- inturn's tables in the current schema.
SELECT tablename
  FROM pg_tables
 WHERE schemaname = current_schema() AND starts_with(tablename, 'inturn_')
 ORDER BY tablename;

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
