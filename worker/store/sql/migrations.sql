-- Bookkeeping of the schema migrations (inturn.worker.store.migrate).

-- name: ensure_table
-- DDL: the one statement of the package that EXPLAIN cannot plan (the test runs it instead).
CREATE TABLE IF NOT EXISTS inturn_schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied
SELECT version FROM inturn_schema_migrations;

-- name: record
INSERT INTO inturn_schema_migrations (version, name) VALUES (%(version)s, %(name)s);
